"""The observer that turns run events into history rows for a ``HistoryWriter``.

Invariant: it only builds row tuples and hands them to the writer's buffer; it keeps
per-run state (source, task id, items) only from a run's start to its end, and an item's
start only from its attempt's start to its end. Those maps take no lock: each key is one
run's or one attempt's (``id`` of its ``JobRun`` or ``ShardingContext``, alive until the
matching end), written by one thread at a time, and a dict's single get, set and pop are
atomic.
"""

from __future__ import annotations

import socket
import time

from scheduler.context import ShardingContext
from scheduler.events import OWED, RunObserver
from scheduler.handlers import JobRun
from scheduler.history.writer import HistoryWriter
from sharding import InstanceIdentity

__all__ = ["HistoryRecorder"]

_DEFERRED_STATE = {"owed": "OWED", "misfire": "MISFIRE", "skipped": "SKIPPED"}


class HistoryRecorder(RunObserver):
    def __init__(self, writer: HistoryWriter, identity: InstanceIdentity) -> None:
        self.writer = writer
        self._put = writer.put_row
        self._instance = identity.instance_id
        self._ip = identity.ip
        self._host = socket.gethostname()
        #: id(run) -> (source, task id, items as written) from run_started to run_ended
        self._runs: dict[int, tuple[str, str, str]] = {}
        #: id(ctx) -> the attempt's start, from item_started to item_ended
        self._starts: dict[int, float] = {}

    def _trace(
        self, job: str, task_id: str, source: str, items: str, fire_time: float, state: str, message: str | None
    ) -> None:
        # values in COLUMNS["status_trace"] order
        self._put(
            "status_trace",
            (job, task_id, task_id, self._instance, source, items, fire_time, state, message, time.time()),
        )

    def fire_deferred(self, job: str, fire_time: float, what: str) -> None:
        state = _DEFERRED_STATE.get(what, what.upper())
        self._trace(job, "", OWED if what == "owed" else "NORMAL", "", fire_time, state, None)

    def run_fenced(self, job: str, fire_time: float, reason: str) -> None:
        self._trace(job, "", "NORMAL", "", fire_time, "FENCED_OUT", f"running mark refused: {reason}")

    def resharded(self, job: str, epoch: int, seconds: float) -> None:
        self._trace(job, "", "NORMAL", "", 0.0, "RESHARDED", f"epoch {epoch} written in {seconds:.3f}s")

    def run_started(self, run: JobRun, source: str, task_id: str) -> None:
        items = ",".join(map(str, run.items))
        self._runs[id(run)] = (source, task_id, items)
        self._trace(run.job_name, task_id, source, items, run.fire_time, "RUNNING", None)

    def item_started(self, run: JobRun, ctx: ShardingContext) -> None:
        self._starts[id(ctx)] = time.time()

    def item_ended(self, run: JobRun, ctx: ShardingContext, error: BaseException | None) -> None:
        end = time.time()
        start = self._starts.pop(id(ctx), end)
        known = self._runs.get(id(run))
        source = known[0] if known is not None else ("FAILOVER" if run.failover else "NORMAL")
        failure = None if error is None else f"{type(error).__name__}: {error}"[:4000]
        # values in COLUMNS["executions"] order
        self._put(
            "executions",
            (
                run.job_name, ctx.task_id, self._host, self._ip, self._instance, ctx.sharding_item,
                ctx.sharding_parameter, run.epoch, run.fire_time, source, start, end, error is None,
                "success" if error is None else "failure", failure, ctx.attempt,
            ),
        )  # fmt: skip

    def run_ended(self, run: JobRun) -> None:
        known = self._runs.pop(id(run), None)
        source, task_id, items = known if known is not None else ("NORMAL", "", ",".join(map(str, run.items)))
        if run.errors:
            failed = ",".join(map(str, sorted(run.errors)))
            self._trace(run.job_name, task_id, source, items, run.fire_time, "ERROR", f"items failed: {failed}")
        else:
            self._trace(run.job_name, task_id, source, items, run.fire_time, "FINISHED", None)
