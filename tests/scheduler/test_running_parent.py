"""A new job's ``/{job}/running`` (the parent of its running marks) is written with its
config, before any fire: every cache leaves that subtree out, and an etcd watch cuts it
from the key ranges it asks the server for when it first sees the node. Made by each job's
first mark instead, thousands of jobs beginning to fire together re-split the watch
thousands of times within a second, and the server caught each new piece up from its
history (BENCHMARKS.md, *Jobs set firing once all are up*)."""

from __future__ import annotations

import pytest

from registry.backends.etcd import EtcdRegistry
from scheduler import JobConfig, Scheduler, ShardingContext
from sharding.layout import JobPaths
from tests.harness import Harness
from tests.waiting import wait_for

#: a cron that does not fire during a test
QUIET = "0 0 0 1 1 ?"


def _noop(ctx: ShardingContext) -> None:
    pass


def test_a_new_job_has_its_running_parent_before_any_fire(harness: Harness) -> None:
    namespace = harness.fresh_namespace()
    observer = harness.connect(namespace)
    sched = Scheduler(harness.connect(namespace))
    sched.add_job(JobConfig(name="fresh", cron=QUIET), _noop)
    # a job whose marks' parent outlived its config: the config is still written
    observer.create(JobPaths("orphan").running)
    sched.add_job(JobConfig(name="orphan", cron=QUIET, sharding_total_count=2), _noop)
    try:
        sched.start()
        for name in ("fresh", "orphan"):
            paths = JobPaths(name)
            assert observer.exists(paths.running), name
            assert observer.children(paths.running) == [], name
        stored = observer.get(JobPaths("orphan").config)
        assert stored is not None and JobConfig.from_json(JobPaths("orphan").config, stored).sharding_total_count == 2
    finally:
        sched.shutdown()


@pytest.mark.parametrize("harness", ["etcd"], indirect=True)
def test_no_running_mark_of_a_new_job_reaches_its_etcd_watch(harness: Harness) -> None:
    """Each run writes its mark and removes it; none of it may come back to the process
    through its own watch, the first runs of new jobs included. A first trigger writes
    its request and the request's parent, and the run deletes the request: three events
    a job, the marks' none."""
    jobs = 20
    namespace = harness.fresh_namespace()
    reg = harness.connect(namespace)
    assert isinstance(reg, EtcdRegistry)
    ran: list[str] = []

    def job(ctx: ShardingContext) -> None:
        ran.append(ctx.job_name)

    sched = Scheduler(reg)
    names = [f"first-{n:02d}" for n in range(jobs)]
    for name in names:
        sched.add_job(JobConfig(name=name, cron=QUIET), job)
    try:
        sched.start()
        observer = harness.connect(namespace)
        quiet = reg._supervisor.events_received
        # nothing is written once every job is up: the count is settled when a marker
        # written now is the next event to arrive
        observer.put("/marker", b"1")
        wait_for(lambda: reg._supervisor.events_received > quiet, 10, message="the marker's event")
        before = reg._supervisor.events_received
        for name in names:
            sched.trigger(name)
        wait_for(lambda: sorted(ran) == names, 15, message=lambda: f"ran: {sorted(ran)}")
        triggers = [JobPaths(name).trigger(sched.instance_id) for name in names]
        wait_for(lambda: not any(observer.exists(t) for t in triggers), 10, message="trigger requests deleted")
        observer.put("/marker", b"2")
        runtime = sched.runtime
        assert runtime is not None
        wait_for(lambda: runtime.cache.get("/marker") == b"2", 10, message="the second marker")
        received = reg._supervisor.events_received - before
        assert received == 3 * jobs + 1, f"{received} events for {jobs} triggered runs (3 each, and the marker)"
    finally:
        sched.shutdown()
