"""Jobs begin firing once ``Scheduler.start()`` has brought every job up
(``JobRunner.begin_firing``): a job already registered does not fire while the start-up
of another goes on, the fire that fell due meanwhile runs once when the start-up ends,
and the schedule goes on from then, with no backlog of the fires in between."""

from __future__ import annotations

import threading
import time

import pytest

from registry.counting import CountingRegistry
from registry.paths import join, parent
from registry.protocol import Node, RegistryCenter
from scheduler import JobConfig, Scheduler
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
    fires: list[tuple[float, float]] = []  # (fire time, when it ran)
    sched.add_job(JobConfig(name="fast", cron="* * * * * ?"), lambda ctx: fires.append((ctx.fire_time, time.time())))
    sched.add_job(JobConfig(name="slow", cron="0 0 0 1 1 ?"), lambda ctx: None)
    starting = threading.Thread(target=sched.start)
    starting.start()
    try:
        assert held.reached.wait(30), "the slow job's start-up never read its term"
        wait_for(lambda: observer.exists(JobPaths("fast").assignment), 30, message="fast was not assigned")
        registered = time.time()
        # fast is up and would fire every second: let two of its fire times pass
        wait_for(lambda: time.time() >= int(registered) + 3, 10)
        assert fires == [], "a job fired while start() was still bringing another up"
        assert starting.is_alive()
        # the start-up cannot end before this; its last step sets the jobs firing, so the
        # first fire may run a moment before start() returns to its caller
        released = time.time()
        held.release.set()
        starting.join(30)
        assert not starting.is_alive()
        wait_for(lambda: len(fires) >= 2, 10, message=lambda: str(fires))
        (first_fire, first_ran), (second_fire, _) = fires[:2]
        # the fire that fell due during the start-up ran once, at once ...
        assert registered - 1 < first_fire < released, (registered, first_fire, released)
        assert first_ran >= released
        # ... and the schedule went on from then: no backlog of the window's other fires
        assert second_fire > released, (second_fire, released)
    finally:
        held.release.set()
        starting.join(30)
        sched.shutdown()
