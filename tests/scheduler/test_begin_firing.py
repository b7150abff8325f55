"""Jobs begin firing once ``Scheduler.start()`` has brought every job up
(``JobRunner.begin_firing``): a job already registered does not fire while the start-up
of another goes on. When it ends, a rare job's fire that fell due meanwhile runs once;
a job that fires again sooner than it waited skips the window's fires, so thousands of
every-second jobs do not fire twice within a second. Thousands begin in waves."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

import scheduler.scheduler as scheduler_module
from registry.counting import CountingRegistry
from registry.paths import join, parent
from registry.protocol import Node, RegistryCenter
from scheduler import JobConfig, Scheduler, ShardingContext
from sharding.layout import JobPaths
from tests.harness import Harness
from tests.waiting import wait_for


class _HeldStart(CountingRegistry):
    """Holds one job's start-up at its read of the election term it won (a read on the
    start-up thread, outside the group commit: the other jobs' writes go on) until
    ``release`` is set."""

    def __init__(self, inner: RegistryCenter, job: str) -> None:
        super().__init__(inner)
        self._held = join(parent(JobPaths(job).leader), "term")  # registry/recipes/election.py
        self.reached = threading.Event()
        self.release = threading.Event()

    def get_node(self, path: str) -> Node | None:
        if path == self._held and not self.release.is_set():
            self.reached.set()
            self.release.wait(30)
        return super().get_node(path)


@pytest.mark.parametrize("harness", ["memory", "zookeeper", "etcd"], indirect=True)
def test_jobs_begin_firing_once_every_job_is_up(harness: Harness) -> None:
    namespace = harness.fresh_namespace()
    observer = harness.connect(namespace)
    held = _HeldStart(harness.connect(namespace), "slow")
    sched = Scheduler(held)
    fires: dict[str, list[tuple[float, float]]] = {"frequent": [], "rare": []}  # (fire time, ran at)

    def record(name: str) -> Callable[[ShardingContext], None]:
        return lambda ctx: fires[name].append((ctx.fire_time, time.time()))

    soon = int(time.time()) + 3  # a second the hold below lasts past: the rare job's fire
    sched.add_job(JobConfig(name="frequent", cron="* * * * * ?"), record("frequent"))
    sched.add_job(JobConfig(name="rare", cron=f"{soon % 60} * * * * ?"), record("rare"))
    sched.add_job(JobConfig(name="slow", cron="0 0 0 1 1 ?"), lambda ctx: None)
    starting = threading.Thread(target=sched.start)
    starting.start()
    try:
        assert held.reached.wait(30), "the slow job's start-up never read its term"
        for name in ("frequent", "rare"):
            assignment = JobPaths(name).assignment
            wait_for(lambda: observer.exists(assignment), 30, message=f"{name} was not assigned")  # noqa: B023
        assert time.time() < soon, "the jobs took too long to start for this test's timing"
        # both are up: let the rare job's second and two of the frequent job's pass
        wait_for(lambda: time.time() >= soon + 1, 10)
        assert fires == {"frequent": [], "rare": []}, "a job fired while start() was still bringing another up"
        assert starting.is_alive()
        released = time.time()
        held.release.set()
        starting.join(30)
        started = time.time()
        wait_for(lambda: bool(fires["rare"] and fires["frequent"]), 10, message=lambda: str(fires))
        # the rare job's fire that fell due during the start-up ran once, when it ended
        assert len(fires["rare"]) == 1 and fires["rare"][0][0] == float(soon), fires["rare"]
        assert fires["rare"][0][1] >= released
        # the frequent job skipped the window's fires: its first is after the start-up
        assert fires["frequent"][0][0] > released, (fires["frequent"], released, started)
    finally:
        held.release.set()
        starting.join(30)
        sched.shutdown()


def test_jobs_begin_firing_in_waves_a_second_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``_FIRING_WAVE`` jobs, ``start()`` sets them firing a wave per second, in the
    order they were added: each wave's first fire is a second after the one before."""
    monkeypatch.setattr(scheduler_module, "_FIRING_WAVE", 2)
    names = [f"job-{n}" for n in range(5)]  # waves: 2, 2, 1
    first: dict[str, float] = {}
    lock = threading.Lock()

    def record(ctx: ShardingContext) -> None:
        with lock:
            first.setdefault(ctx.job_name, ctx.fire_time)

    sched = Scheduler("memory://")
    for name in names:
        sched.add_job(JobConfig(name=name, cron="* * * * * ?"), record)
    began = time.time()
    sched.start()
    try:
        assert time.time() - began >= 2.0, "three waves, a second apart, before start() returns"
        wait_for(lambda: len(first) == len(names), 10, message=lambda: str(first))
        waves = [first[n] for n in names]
        assert waves[0] == waves[1] and waves[2] == waves[3], waves
        assert waves[2] - waves[0] >= 1.0 and waves[4] - waves[2] >= 1.0, waves
    finally:
        sched.shutdown()
