"""What the ``Cluster`` tests and the operator-command tests share: a job run by schedulers
of this process on the session's harness, and a record of every item run."""

from __future__ import annotations

import threading
from typing import Any

from scheduler import Cluster, JobConfig, Scheduler, ShardingContext
from sharding.layout import JobPaths
from tests.harness import Harness
from tests.waiting import wait_for

__all__ = ["EVERY_SECOND", "JOB", "PATHS", "A", "B", "Runs", "config", "owners", "start"]

EVERY_SECOND = "* * * * * ?"
JOB = "job"
PATHS = JobPaths(JOB)
A, B = "10.0.0.1@-@a", "10.0.0.2@-@b"


class Runs:
    """Every item run: (instance, fire time, item, start, end)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: list[tuple[str, float, int]] = []
        self.hold = threading.Event()
        self.hold.set()
        #: item runs now inside the job (held there while ``hold`` is clear)
        self.in_progress = 0

    def job(self, instance: str) -> Any:
        def run(ctx: ShardingContext) -> None:
            with self.lock:
                self.rows.append((instance, ctx.fire_time, ctx.sharding_item))
                self.in_progress += 1
            try:
                self.hold.wait(30)
            finally:
                with self.lock:
                    self.in_progress -= 1

        return run

    def items_after(self, after: float, instance: str | None = None) -> set[int]:
        with self.lock:
            return {item for who, fire, item in self.rows if fire > after and instance in (None, who)}

    def fires_after(self, after: float) -> list[float]:
        with self.lock:
            return sorted({fire for _, fire, _ in self.rows if fire > after})

    def last_fire(self) -> float:
        """The latest fire run so far (waiting for a first one)."""
        fires: list[float] = wait_for(lambda: self.fires_after(0), 15, message="no fire ran")
        return fires[-1]


def config(**fields: Any) -> JobConfig:
    defaults: dict[str, Any] = {"name": JOB, "cron": EVERY_SECOND, "sharding_total_count": 4}
    return JobConfig(**{**defaults, **fields})


def start(harness: Harness, made: list[Scheduler], namespace: str, instance: str, job: JobConfig, runs: Runs) -> Scheduler:
    sched = Scheduler(
        harness.url(namespace, session_timeout=harness.min_session_timeout), instance_id=instance, max_workers=4
    )
    made.append(sched)
    sched.add_job(job, runs.job(instance))
    sched.start()
    return sched


def owners(cluster: Cluster) -> dict[int, str | None]:
    return {view.item: view.instance for view in cluster.job(JOB).items}
