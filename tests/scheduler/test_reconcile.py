"""Self-repair without a fire: on every backend, a one-off job (which never fires by
itself) gets its assignment repaired when it names a dead instance, and the periodic
reconcile removes a stale running mark that no watch reaction looks at."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from scheduler import JobConfig, Scheduler, ShardingContext
from sharding import Assignment, AssignmentState
from sharding.failover import RunTrace
from sharding.layout import JobPaths
from tests.harness import Harness
from tests.waiting import wait_for

PATHS = JobPaths("quiet")


@pytest.fixture
def sched(harness: Harness) -> Iterator[Scheduler]:
    scheduler = Scheduler(harness.url(harness.fresh_namespace(), session_timeout=harness.min_session_timeout))

    def never_fired(ctx: ShardingContext) -> None:
        """A one-off job: runs only when triggered."""

    scheduler.add_job(
        JobConfig(name="quiet", sharding_total_count=4, reconcile_interval_minutes=0.02), never_fired
    )
    scheduler.start()
    wait_for(lambda: scheduler.runner("quiet").sharding.ready() is not None, 20, message="a first assignment")
    yield scheduler
    scheduler.shutdown(wait=True)


def test_assignment_naming_a_dead_instance_is_repaired_without_a_fire(sched: Scheduler) -> None:
    service = sched.runner("quiet").sharding
    current = service.ready()
    assert current is not None
    ghost = Assignment(
        current.epoch + 1,
        AssignmentState.READY,
        4,
        {sched.instance_id: (0, 1), "10.9.9.9@-@1": (2, 3)},
        current.assignment.strategy,
        "someone-else",
    )
    sched.registry.put(PATHS.assignment, ghost.encode())

    def repaired() -> bool:
        now = service.ready()
        return (
            now is not None and set(now.assignment.items) == {sched.instance_id} and now.epoch > ghost.epoch
        )

    wait_for(repaired, 20, message="the assignment covers the live instance only")


def test_reconcile_removes_a_stale_running_mark(sched: Scheduler) -> None:
    # running marks are not watched for membership (a run starting or ending never changes
    # the assignment), so only the periodic reconcile (here every 1.2 s) can notice this one
    stale = RunTrace("running", (1,), 1.0).encode()
    sched.registry.put(PATHS.running_of("10.9.9.9@-@1"), stale)
    wait_for(lambda: not sched.registry.exists(PATHS.running_of("10.9.9.9@-@1")), 20, message="mark removed")
