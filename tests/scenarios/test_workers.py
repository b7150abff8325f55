"""Real ``shardjob worker`` processes on ZooKeeper and etcd: spread, leave, join, and a
configuration change written to the registry by someone else.

Every execution is recorded by the worker processes themselves and checked afterwards:
no (item, fire) ever runs twice, no item runs on two instances at once, and every fire
of a settled cluster runs each item exactly once on the instance AVG_ALLOCATION (over
the instance ids sorted descending) gives it. Only the fire racing a membership change
may miss the moving items (no failover here); it must still double nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler import JobConfig
from sharding.layout import JobPaths
from tests.harness import Harness
from tests.scenarios.checks import (
    Record,
    coverage_gaps,
    doubled_runs,
    fires_after,
    overlapping_runs,
    spread_mismatches,
    stale_epoch_runs,
)
from tests.scenarios.phases import await_fires, check_phase, expected_spread, fires_between, settle
from tests.scenarios.workers import Fleet
from tests.waiting import wait_for

#: each item stays busy this long, so a SIGTERM usually finds items running and the
#: hand-over has running marks to wait for
HOLD = 0.3
SESSION_TIMEOUT = 2
TOTAL = 6
JOB = "job"


@pytest.fixture
def namespace(server: Harness) -> str:
    return server.fresh_namespace()


@pytest.fixture
def fleet(server: Harness, namespace: str, tmp_path: Path) -> Iterator[Fleet]:
    made = Fleet(
        server.url(namespace, session_timeout=SESSION_TIMEOUT),
        tmp_path,
        job=JOB,
        total=TOTAL,
        hold=HOLD,
    )
    try:
        yield made
    finally:
        made.close()


def test_workers_spread_leave_on_sigterm_and_join(fleet: Fleet) -> None:
    ids = ["127.0.0.1@-@w-b", "127.0.0.1@-@w-c", "127.0.0.1@-@w-a"]
    workers = fleet.start(*ids)
    spread_3 = expected_spread(ids, TOTAL)

    # settled: every fire runs each item exactly once, as AVG_ALLOCATION says
    first = settle(fleet, spread_3, TOTAL)
    check_phase(await_fires(fleet, [first + 1, first + 2], TOTAL), [first + 1, first + 2], spread_3, TOTAL)

    # a SIGTERM: graceful exit 0, and the leaver's items run elsewhere from the second fire on
    leaver = workers[0]
    leaver_signalled = time.time()
    code = leaver.terminate()
    assert code == 0, leaver.describe()
    assert leaver.exited_at is not None
    leaver_exit = leaver.exited_at
    assert f"worker {leaver.instance_id} stopped" in leaver.stdout_file.read_text(), leaver.describe()
    survivors = [w.instance_id for w in fleet.alive()]
    assert sorted(survivors) == sorted(ids[1:])
    spread_2 = expected_spread(survivors, TOTAL)
    moved_from = fires_after(leaver_exit, 2)[1]
    check_phase(
        await_fires(fleet, [moved_from, moved_from + 1], TOTAL), [moved_from, moved_from + 1], spread_2, TOTAL
    )

    # a newcomer gets its share from the second fire after it is running
    joiner_spawned = time.time()
    joiner = fleet.start("127.0.0.1@-@w-d")[0]
    assert joiner.ready_at is not None
    spread_3b = expected_spread([*survivors, joiner.instance_id], TOTAL)
    assert spread_3b[joiner.instance_id], "AVG_ALLOCATION gives the newcomer nothing?"
    joined_from = fires_after(joiner.ready_at, 2)[1]
    records = await_fires(fleet, [joined_from, joined_from + 1], TOTAL)
    check_phase(records, [joined_from, joined_from + 1], spread_3b, TOTAL)
    assert any(r.instance == joiner.instance_id for r in records)

    # the whole timeline: every fire outside the two hand-overs complete and spread right,
    # and nothing ever doubled or overlapped, hand-overs included
    check_phase(records, fires_between(first, leaver_signalled - 1), spread_3, TOTAL)
    check_phase(records, fires_between(moved_from, joiner_spawned - 1), spread_2, TOTAL)
    assert doubled_runs(records) == []
    assert overlapping_runs(records) == []
    assert stale_epoch_runs(records) == []
    codes = fleet.terminate_all()
    assert codes == dict.fromkeys([*survivors, joiner.instance_id], 0), fleet.describe()


def test_config_change_in_registry_reshards_the_workers(
    fleet: Fleet, server: Harness, namespace: str
) -> None:
    ids = ["127.0.0.1@-@w-1", "127.0.0.1@-@w-2", "127.0.0.1@-@w-3"]
    fleet.start(*ids)
    first = settle(fleet, expected_spread(ids, TOTAL), TOTAL)
    await_fires(fleet, [first + 1], TOTAL)

    # someone else (an operator, a console) rewrites the job's config: 6 items -> 8
    reg = server.connect(namespace)
    path = JobPaths(JOB).config
    raw = reg.get(path)
    assert raw is not None, "the workers wrote no config"
    stored = JobConfig.from_json(path, raw)
    assert stored.sharding_total_count == TOTAL
    reg.put(path, stored.with_changes(sharding_total_count=8, job_parameter="v2").to_json())
    written_at = time.time()

    spread_8 = expected_spread(ids, 8)
    changed_from = fires_after(written_at, 2)[1]
    window = [changed_from, changed_from + 1]
    records = await_fires(fleet, window, 8)
    check_phase(records, window, spread_8, 8)
    assert {r.total for r in records if r.fire_time in window} == {8}
    # before the change: six items, every fire; nothing doubled or overlapped at any time
    check_phase(records, fires_between(first, written_at - 1), expected_spread(ids, TOTAL), TOTAL)
    assert doubled_runs(records) == []
    assert overlapping_runs(records) == []
    assert stale_epoch_runs(records) == []


def _rec(item: int, fire: float, instance: str, start: float, end: float) -> Record:
    return Record(job=JOB, item=item, fire_time=fire, epoch=1, instance=instance, start=start, end=end)


def test_the_checkers_catch_what_they_are_for() -> None:
    """The scenarios above pass only if the checkers can fail: each violation is seen."""
    clean = [_rec(0, 10.0, "a", 10.0, 10.3), _rec(1, 10.0, "b", 10.0, 10.3), _rec(0, 11.0, "b", 11.0, 11.3)]
    assert doubled_runs(clean) == [] and overlapping_runs(clean) == []
    assert coverage_gaps(clean, [10.0], 2) == []
    assert spread_mismatches(clean, [10.0], {"a": [0], "b": [1]}) == []

    doubled = [*clean, _rec(0, 10.0, "b", 10.5, 10.6)]
    assert len(doubled_runs(doubled)) == 1
    overlapping = [*clean, _rec(0, 11.0, "c", 10.2, 10.4)]
    assert len(overlapping_runs(overlapping)) == 1
    assert overlapping_runs([*clean, _rec(0, 12.0, "a", 10.1, 10.2)]) == []  # same instance
    assert coverage_gaps(clean, [11.0], 2) == ["fire 11.000: missing [1], unexpected [], doubled {}"]
    assert len(coverage_gaps(doubled, [10.0], 2)) == 1
    assert spread_mismatches(clean, [10.0], {"b": [0], "a": [1]}) != []
    assert stale_epoch_runs(clean) == []
    stale = [*clean, Record(JOB, 5, 11.0, 2, "c", 10.2, 10.4)]  # epoch 2 began before epoch 1 ended
    assert len(stale_epoch_runs(stale)) == 1
    assert fires_after(10.0, 2) == [11.0, 12.0] and fires_after(10.4, 1) == [11.0]


def test_runs_longer_than_the_period_hand_over_without_overlap(server: Harness, tmp_path: Path) -> None:
    """Items held 1.2 s under a 1 s cron: every run spans a fire (misfires), so a SIGTERM
    always lands mid-run and a newcomer always joins mid-run; the hand-overs must wait for
    the running items, never run one beside itself, never run a (item, fire) twice."""
    slow = Fleet(
        server.url(server.fresh_namespace(), session_timeout=SESSION_TIMEOUT),
        tmp_path,
        job=JOB,
        total=4,
        hold=1.2,
    )
    try:
        first, second = slow.start("127.0.0.1@-@s-1", "127.0.0.1@-@s-2")
        wait_for(
            lambda: {r.instance for r in slow.records()} == {first.instance_id, second.instance_id},
            20,
            interval=0.1,
            message=lambda: f"both running:\n{slow.describe()}",
        )
        assert second.terminate() == 0, second.describe()
        assert second.exited_at is not None
        left_at = second.exited_at
        wait_for(
            lambda: {r.item for r in first.records() if r.start > left_at} == {0, 1, 2, 3},
            20,
            interval=0.1,
            message=lambda: f"the survivor takes every item:\n{slow.describe()}",
        )
        third = slow.start("127.0.0.1@-@s-3")[0]
        wait_for(
            lambda: third.records(),
            20,
            interval=0.1,
            message=lambda: f"the newcomer runs items:\n{slow.describe()}",
        )
        assert third.terminate() == 0, third.describe()
        records = slow.records()
        assert doubled_runs(records) == []
        assert overlapping_runs(records) == []
        assert stale_epoch_runs(records) == []
        assert len({r.epoch for r in records}) >= 3, "two hand-overs, yet fewer than three epochs ran"
    finally:
        slow.close()
