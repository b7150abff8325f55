"""Start-up and shutdown of many jobs on a registry reached over the network share
transactions (the scheduler's group commit): each job still writes its config, server,
instance and campaign, and leaves, but N jobs cost far fewer than N write requests.
The memory backend applies each transaction directly (no round trip to share)."""

from __future__ import annotations

from typing import Any

import pytest

from registry.backends.zookeeper import ZooKeeperRegistry
from registry.counting import CountingRegistry
from scheduler import JobConfig, Scheduler, ShardingContext
from sharding.assignment import Assignment, AssignmentState
from sharding.layout import JobPaths
from tests.harness import Harness
from tests.waiting import wait_for

JOBS = 60
NAMES = [f"job-{n:03d}" for n in range(JOBS)]
#: without the group commit a job's start writes seven requests (config, server status,
#: instance, campaign, then its first assignment: flag, fence, assignment) and its leaving
#: two (instance, resignation; a running mark's removal only if one may be in place); with
#: it, fewer than three per job to start and one per two jobs to leave (the jobs start and
#: leave side by side, their writes grouped). Hazard: a removal of an absent mark fails the
#: shared transaction it is in and costs a round trip of its own, one per job if sent by all
WRITES = ("transaction", "create", "put", "delete")
START_BOUND = 3 * JOBS
#: fewer than one leaving request per job (the hazard above costs one per job and more). On a
#: loaded machine the leaving jobs' writes meet in smaller batches: 30 for 60 jobs on etcd
BOUND = 2 * JOBS // 3


def _noop(ctx: ShardingContext) -> None:
    pass


def _writes(counting: CountingRegistry) -> int:
    return sum(counting.calls[method] for method in WRITES)


@pytest.mark.parametrize("harness", ["zookeeper", "etcd"], indirect=True)
def test_many_jobs_start_and_leave_in_shared_transactions(harness: Harness) -> None:
    namespace = harness.fresh_namespace()
    counting = CountingRegistry(harness.connect(namespace))
    observer = harness.connect(namespace)
    sched = Scheduler(counting)
    for name in NAMES:
        sched.add_job(JobConfig(name=name, cron="0 0 0 1 1 ?"), _noop)
    try:
        sched.start()
        started = _writes(counting)
        instance = sched.instance_id
        for name in NAMES:
            paths = JobPaths(name)
            assert observer.exists(paths.config) and observer.exists(paths.instance(instance)), name
        wait_for(lambda: all(observer.get(JobPaths(name).leader) == instance.encode() for name in NAMES), 30)
        assert started < START_BOUND, f"{started} write requests to start {JOBS} jobs: {counting.calls}"
        counting.reset()
    finally:
        sched.shutdown()
    left = _writes(counting)
    for name in NAMES:
        paths = JobPaths(name)
        assert not observer.exists(paths.instance(instance)) and not observer.exists(paths.leader), name
    assert left < BOUND, f"{left} write requests for {JOBS} jobs to leave: {counting.calls}"


@pytest.mark.parametrize("harness", ["memory", "zookeeper", "etcd"], indirect=True)
def test_start_returns_with_every_job_assigned(harness: Harness) -> None:
    """A process that alone runs its jobs gets their first assignments inside ``start()``
    (side by side on the start-up threads), not in their first fires afterwards."""
    namespace = harness.fresh_namespace()
    observer = harness.connect(namespace)
    sched = Scheduler(harness.connect(namespace))
    names = NAMES[:20]
    for name in names:
        sched.add_job(JobConfig(name=name, cron="0 0 0 1 1 ?", sharding_total_count=3), _noop)
    try:
        sched.start()
        instance = sched.instance_id
        for name in names:  # read at once: no wait after start() returned
            path = JobPaths(name).assignment
            node = observer.get_node(path)
            assert node is not None, f"{name}: no assignment when start() returned"
            assignment = Assignment.decode(path, node.value)
            assert assignment.state is AssignmentState.READY, name
            assert assignment.items == {instance: (0, 1, 2)}, (name, assignment.items)
    finally:
        sched.shutdown()


@pytest.mark.parametrize("harness", ["zookeeper"], indirect=True)
def test_leaving_jobs_are_not_read_again_for_the_closing_cache(harness: Harness) -> None:
    """ZooKeeper re-reads a node when its one-shot watch fires, so a cache that still
    followed the jobs while they leave would read again what each deletes (about five
    reads a job) just before it closes. The scheduler's cache stops following first."""
    namespace = harness.fresh_namespace()
    reg = harness.connect(namespace)
    assert isinstance(reg, ZooKeeperRegistry)
    sched = Scheduler(reg)
    for name in NAMES:
        sched.add_job(JobConfig(name=name, cron="0 0 0 1 1 ?"), _noop)
    reads: list[str] = []
    try:
        sched.start()
        wait_for(lambda: all(reg.get(JobPaths(name).leader) == sched.instance_id.encode() for name in NAMES), 30)
        assert reg.flush_events(10.0)
        client = reg._io.client
        for method in ("get_async", "get_children_async"):
            read = getattr(client, method)

            def counted(path: str, *args: Any, _read: Any = read, **kwargs: Any) -> Any:
                reads.append(path)
                return _read(path, *args, **kwargs)

            setattr(client, method, counted)
        sched.shutdown()
        assert not reg.exists(JobPaths(NAMES[0]).instance(sched.instance_id))  # the jobs did leave
    finally:
        sched.shutdown()
        reg.close()
    assert len(reads) < JOBS // 4, f"{len(reads)} reads while {JOBS} jobs left: {reads[:10]}"
