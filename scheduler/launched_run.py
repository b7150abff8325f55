"""A launched run: the fenced mark is held, and its items go to the shared worker pool.

A run is handed to the pool as at most one task per worker, each task the run object
itself taking the run's next item until none is left; the last item to end completes the
run (``JobRunner.complete``: the mark's removal goes to the group commit). The runner
makes each item's context and runs its attempts (timeouts, retries, the error handler).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from scheduler.handlers import JobRun
from sharding import RunMark

if TYPE_CHECKING:
    from scheduler.runner import JobRunner

__all__ = ["LaunchedRun", "task_id"]

log = logging.getLogger("scheduler")


def task_id(run: JobRun) -> str:
    """ElasticJob's task id: job, items, READY or FAILOVER, instance."""
    return "@-@".join(
        [
            run.job_name,
            ",".join(map(str, run.items)),
            "FAILOVER" if run.failover else "READY",
            run.instance_id,
        ]
    )


class LaunchedRun:
    """A launched run's items, handed out one at a time to the worker pool's tasks; the
    last item to end completes the run (clears its mark, calls the listeners).

    Hazard: whatever a fire allocates lives through the whole burst of fires that share
    its second, long enough to reach the garbage collector's oldest generation, whose
    full collections then pause the burst's tail. So a run is one object with slots, and
    each item's context is made only when the item starts (no closures, no contexts made
    up front). Only a job that asks for them pays for timeouts (a ``Deadline`` and a timer
    entry per attempt, ``scheduler.timeouts``) and retries (allocated on a failure)."""

    __slots__ = ("_left", "_lock", "_next", "_runner", "mark", "run", "task_id")

    def __init__(self, runner: JobRunner, run: JobRun, mark: RunMark) -> None:
        self._runner = runner
        self.run = run
        self.mark = mark
        self.task_id = task_id(run)
        self._next = 0
        self._left = len(run.items)
        self._lock = threading.Lock()

    def begin(self) -> None:
        """A worker's task when the job has listeners: ``before_job``, then the items."""
        self._runner.before_job(self.run)
        self.hand_out()

    def hand_out(self) -> None:
        """One task per worker, each taking the run's next item until none is left: items
        still start as soon as a worker is free, without a task per item (a run of
        thousands of items would otherwise queue thousands of them)."""
        runtime = self._runner.runtime
        for _ in range(min(len(self.run.items), runtime.worker_count)):
            runtime.workers.submit(self)

    def __call__(self) -> None:
        """A worker's task: take the run's next item until none is left. The object itself
        is the task (a bound method per submit would be one more object per run)."""
        run, runner, items = self.run, self._runner, self.run.items
        while True:
            with self._lock:
                index = self._next
                if index >= len(items):
                    return
                self._next = index + 1
            try:
                runner.run_item(run, items[index], self.task_id)
            except Exception:  # the job's own errors are run_item's; this one is ours
                log.exception("job %s item %d could not be run", run.job_name, items[index])
            finally:
                with self._lock:
                    self._left -= 1
                    last = self._left == 0
                if last:
                    runner.complete(run, self.mark)
