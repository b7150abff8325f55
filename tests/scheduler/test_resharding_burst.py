"""A burst of reshardings never holds the fires. When an instance joins, the leader of
many jobs reshards them all at once, on threads of their own (``scheduler.burst_pool``),
never on the coordinator pool, where the fires of every job wait: a burst held there left
every job without a fire until it was done. A restarted process reshards the jobs whose
assignment still names the process it replaces before ``start()`` returns, as it makes a
new job's first assignment."""

from __future__ import annotations

import pytest

from registry.protocol import RegistryCenter
from scheduler import JobConfig, Scheduler
from sharding.assignment import Assignment, AssignmentState
from sharding.layout import JobPaths
from tests.harness import Harness
from tests.scheduler.held_pool import holding_a_thread
from tests.waiting import wait_for

JOBS = 20
QUIET = "0 0 0 1 1 ? 2099"  # never fires during the test: only resharding writes


@pytest.mark.parametrize("harness", ["memory", "zookeeper", "etcd"], indirect=True)
def test_the_leader_reshards_every_job_for_a_joiner_while_its_coordinator_pool_is_held(
    harness: Harness,
) -> None:
    url = harness.url(harness.fresh_namespace())
    names = [f"job-{n:02d}" for n in range(JOBS)]
    leader = Scheduler(url, instance_id="leader", coordinator_threads=1, max_workers=2)
    joiner = Scheduler(url, instance_id="joiner", max_workers=2)
    try:
        for name in names:
            leader.add_job(JobConfig(name=name, cron=QUIET, sharding_total_count=2), lambda ctx: None)
            joiner.add_job(JobConfig(name=name, cron=QUIET, sharding_total_count=2), lambda ctx: None)
        leader.start()
        runtime = leader.runtime
        assert runtime is not None
        reg = runtime.reg
        assert all(reg.get(JobPaths(name).leader) == b"leader" for name in names)

        def shared() -> list[str]:
            return [
                name
                for name in names
                if (a := _assignment(reg, name)) is not None
                and a.state is AssignmentState.READY
                and set(a.items) == {"leader", "joiner"}
            ]

        with holding_a_thread(runtime.coordinator) as release:  # the leader's only coordinator thread
            joiner.start()
            wait_for(
                lambda: len(shared()) == JOBS,
                20,
                message=lambda: f"{len(shared())} of {JOBS} jobs resharded to both instances",
            )
            assert not release.is_set()
    finally:
        joiner.shutdown(wait=False)
        leader.shutdown(wait=False)


def _assignment(reg: RegistryCenter, name: str) -> Assignment | None:
    raw = reg.get(JobPaths(name).assignment)
    return None if raw is None else Assignment.decode(JobPaths(name).assignment, raw)


@pytest.mark.parametrize("harness", ["memory", "zookeeper", "etcd"], indirect=True)
def test_a_restarted_process_holds_every_job_when_start_returns(harness: Harness) -> None:
    namespace = harness.fresh_namespace()
    url = harness.url(namespace)
    names = [f"job-{n:02d}" for n in range(JOBS)]
    reader = harness.connect(namespace)
    old = Scheduler(url, instance_id="old", max_workers=2)
    for name in names:
        old.add_job(JobConfig(name=name, cron=QUIET), lambda ctx: None)
    old.start()
    old.shutdown()
    before = {name: _assignment(reader, name) for name in names}
    assert all(a is not None and set(a.items) == {"old"} for a in before.values()), before

    new = Scheduler(url, instance_id="new", max_workers=2)
    try:
        for name in names:
            new.add_job(JobConfig(name=name, cron=QUIET), lambda ctx: None)
        new.start()
        after = {name: _assignment(reader, name) for name in names}  # no waiting: as start() left them
        stale = [
            name
            for name, a in after.items()
            if a is None or a.state is not AssignmentState.READY or set(a.items) != {"new"}
        ]
        assert not stale, f"{len(stale)} of {JOBS} jobs still assigned as the old process left them: {stale[:3]}"
        assert not any(reader.exists(JobPaths(name).necessary) for name in names)
    finally:
        new.shutdown(wait=False)
