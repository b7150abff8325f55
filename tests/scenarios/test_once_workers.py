"""Once-per-cluster listeners in three ``shardjob worker`` processes on ZooKeeper and etcd:
exactly one ``before_all`` and one ``after_all`` per fire, ``before_all`` before any item of
the fire starts, ``after_all`` after every item ended — and when one instance is SIGKILLed
mid-fire, that fire's ``after_all`` still comes once, at the completed timeout.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import Harness
from tests.scenarios.checks import Record
from tests.scenarios.once_listener import COMPLETED_TIMEOUT_ENV, OnceCall, read_once_calls
from tests.scenarios.workers import Fleet
from tests.waiting import wait_for

TOTAL = 6
#: items last this long, so a SIGKILL right after a fire's before_all lands mid-fire
HOLD = 0.8
COMPLETED_TIMEOUT = 3.0
LISTENER = "tests.scenarios.once_listener:RecordingOnce"


@pytest.fixture
def fleet(server: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Fleet]:
    monkeypatch.setenv(COMPLETED_TIMEOUT_ENV, repr(COMPLETED_TIMEOUT))
    made = Fleet(
        server.url(server.fresh_namespace(), session_timeout=2),
        tmp_path,
        total=TOTAL,
        hold=HOLD,
        extra_args=["--listener", LISTENER],
    )
    try:
        yield made
    finally:
        made.close()


def calls(fleet: Fleet) -> list[OnceCall]:
    return [call for worker in fleet.workers for call in read_once_calls(worker.record_file)]


def closed_fires(fleet: Fleet, after: float) -> list[float]:
    return sorted({c.fire_time for c in calls(fleet) if c.kind == "after" and c.fire_time > after})


def check_fire(fire: float, records: list[Record], found: list[OnceCall], *, items_from: int) -> None:
    """One before_all that ended before any item of ``fire`` started, one after_all that
    started after every item of it ended, on ``items_from`` instances."""
    runs = [r for r in records if r.fire_time == fire]
    befores = [c for c in found if c.fire_time == fire and c.kind == "before"]
    afters = [c for c in found if c.fire_time == fire and c.kind == "after"]
    assert len(befores) == 1 and len(afters) == 1, (fire, befores, afters)
    assert len({r.instance for r in runs}) == items_from, (fire, runs)
    assert befores[0].end <= min(r.start for r in runs), (fire, befores, runs)
    assert afters[0].start >= max(r.end for r in runs), (fire, afters, runs)


@pytest.mark.slow
def test_once_per_fire_across_three_workers_and_after_a_sigkill(fleet: Fleet) -> None:
    ids = ["127.0.0.1@-@w-a", "127.0.0.1@-@w-b", "127.0.0.1@-@w-c"]
    fleet.start(*ids)

    def three_instance_fires() -> list[float]:
        instances: dict[float, set[str]] = {}
        for r in fleet.records():
            instances.setdefault(r.fire_time, set()).add(r.instance)
        closed = set(closed_fires(fleet, 0))
        return sorted(f for f, who in instances.items() if len(who) == 3 and f in closed)

    wait_for(lambda: len(three_instance_fires()) >= 2, 30, message=lambda: fleet.describe())
    for fire in three_instance_fires()[:2]:
        check_fire(fire, fleet.records(), calls(fleet), items_from=3)

    # SIGKILL one instance right after a fire's before_all: its items are running (HOLD)
    seen = max(c.fire_time for c in calls(fleet))
    later = wait_for(
        lambda: [c.fire_time for c in calls(fleet) if c.kind == "before" and c.fire_time > seen],
        10,
        message="no later before_all",
    )
    killed_fire = later[0]
    fleet.worker(ids[2]).kill()

    # that fire's after_all comes once, from a survivor, at the completed timeout
    wait_for(lambda: killed_fire in closed_fires(fleet, 0), COMPLETED_TIMEOUT + 15, message=lambda: fleet.describe())
    survivors_runs = [r for r in fleet.records() if r.fire_time == killed_fire]
    afters = [c for c in calls(fleet) if c.fire_time == killed_fire and c.kind == "after"]
    assert len(afters) == 1 and afters[0].instance != ids[2], afters
    assert afters[0].start >= max(r.end for r in survivors_runs) + COMPLETED_TIMEOUT - 0.5, (afters, survivors_runs)

    # once the two survivors share the job, every fire is once again closed normally
    def two_instance_fires() -> list[float]:
        instances: dict[float, set[str]] = {}
        for r in fleet.records():
            if r.fire_time > killed_fire:
                instances.setdefault(r.fire_time, set()).add(r.instance)
        complete = {f for f, who in instances.items() if who == set(ids[:2])}
        return sorted(f for f in closed_fires(fleet, killed_fire) if f in complete)

    wait_for(lambda: len(two_instance_fires()) >= 2, 30, message=lambda: fleet.describe())
    for fire in two_instance_fires()[:2]:
        check_fire(fire, fleet.records(), calls(fleet), items_from=2)
    kinds = Counter((c.fire_time, c.kind) for c in calls(fleet))
    assert max(kinds.values()) == 1, [k for k, n in kinds.items() if n > 1]
