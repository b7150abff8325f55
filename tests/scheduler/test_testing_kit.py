"""The testing kit users import (``scheduler.testing``): a fleet in one process whose
faults land where they are aimed — the scenarios a user's own tests would write."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from scheduler import JobConfig, Scheduler, ShardingContext
from scheduler.testing import MemoryFleet, wait_for
from sharding.layout import JobPaths

ITEMS = 4


class _Runs:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_instance: dict[str, list[tuple[int, float]]] = {}

    def job(self, instance: str) -> object:
        def run(ctx: ShardingContext) -> None:
            with self.lock:
                self.by_instance.setdefault(instance, []).append((ctx.sharding_item, time.time()))

        return run

    def items_since(self, instance: str, moment: float) -> set[int]:
        with self.lock:
            return {item for item, at in self.by_instance.get(instance, []) if at >= moment}


@pytest.fixture
def fleet() -> Iterator[MemoryFleet]:
    with MemoryFleet(session_timeout=2.0) as made:
        yield made


def _start(fleet: MemoryFleet, runs: _Runs, name: str) -> Scheduler:
    sched = fleet.scheduler(name)
    config = JobConfig(name="sync", cron="* * * * * ?", sharding_total_count=ITEMS, failover=True)
    sched.add_job(config, runs.job(sched.instance_id))  # type: ignore[arg-type]
    sched.start()
    return sched


def test_a_killed_instance_items_run_on_the_survivor(fleet: MemoryFleet) -> None:
    runs = _Runs()
    a, b = _start(fleet, runs, "a"), _start(fleet, runs, "b")
    started = time.time()
    wait_for(lambda: runs.items_since(a.instance_id, started) and runs.items_since(b.instance_id, started), 10)
    fleet.kill(a)
    killed = time.time()
    # b alone runs every item once a's session has expired and b's leader resharded
    wait_for(lambda: runs.items_since(b.instance_id, killed) == set(range(ITEMS)), 10 + fleet.session_timeout)
    assert not runs.items_since(a.instance_id, killed + 1.0)  # a started nothing after its death


def test_a_cut_off_instance_starts_nothing_and_comes_back(fleet: MemoryFleet) -> None:
    runs = _Runs()
    a, b = _start(fleet, runs, "a"), _start(fleet, runs, "b")
    started = time.time()
    wait_for(lambda: runs.items_since(a.instance_id, started), 10)
    fleet.cut(a)
    cut = time.time()
    instances = JobPaths("sync").instances
    observer = b.registry
    # the fault landed: a's registration is gone from the registry once its session expired
    wait_for(lambda: a.instance_id not in observer.children(instances), 5 * fleet.session_timeout)
    gone = time.time()
    wait_for(lambda: runs.items_since(b.instance_id, gone) == set(range(ITEMS)), 10)
    assert not runs.items_since(a.instance_id, cut + 1.0)
    fleet.restore(a)
    back = time.time()
    wait_for(lambda: runs.items_since(a.instance_id, back), 20, message="a never ran again after restore")


def test_a_fault_names_only_schedulers_of_its_fleet(fleet: MemoryFleet) -> None:
    stranger = Scheduler("memory://elsewhere/x")
    with pytest.raises(ValueError, match="not one of this fleet"):
        fleet.cut(stranger)
