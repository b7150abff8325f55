"""The run event sink: the few points where the runner tells observers what happened.

Run history and metrics both subscribe here; the runner calls one method per event and
knows nothing of either. Invariant: an observer never slows or breaks a fire — every
method is called on the thread where its event happens (a coordinator, group-commit or
worker thread), must only buffer or count, and whatever it
raises is logged and swallowed by ``Observers``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from registry.text_enum import TextEnum
from scheduler.context import ShardingContext
from scheduler.handlers import JobRun

__all__ = [
    "FAILOVER",
    "MISFIRE",
    "NORMAL",
    "OWED",
    "SOURCES",
    "TRIGGER",
    "Observers",
    "RunObserver",
    "RunSource",
]

log = logging.getLogger("scheduler.events")

class RunSource(TextEnum):
    """Why a run started (the history's ``execution_source``)."""

    #: its schedule
    NORMAL = "NORMAL"
    #: a fire remembered while the job was still running (misfire on, failover off)
    MISFIRE = "MISFIRE"
    #: a departed instance's work, from the failover queue
    FAILOVER = "FAILOVER"
    #: an operator's trigger
    TRIGGER = "TRIGGER"
    #: a fire owed (failover on) while the run was busy, the session down or the timer late
    OWED = "OWED"


NORMAL, MISFIRE, FAILOVER, TRIGGER, OWED = (
    RunSource.NORMAL,
    RunSource.MISFIRE,
    RunSource.FAILOVER,
    RunSource.TRIGGER,
    RunSource.OWED,
)
SOURCES = tuple(RunSource)


class RunObserver:
    """Subclass and override what you need; every method is a no-op here."""

    def fire_due(self, job: str, fire_time: float, source: str) -> None:
        """A fire (or a replayed owed fire, or a trigger) reached the runner."""

    def fire_deferred(self, job: str, fire_time: float, what: str) -> None:
        """A fire could not run now: ``what`` is ``owed``, ``misfire`` or ``skipped``."""

    def run_fenced(self, job: str, fire_time: float, reason: str) -> None:
        """The fenced running mark failed (``reason`` as ``FencedOut.reason``): nothing ran."""

    def run_started(self, run: JobRun, source: str, task_id: str) -> None:
        """A run was marked and its items handed to the workers."""

    def item_started(self, run: JobRun, ctx: ShardingContext) -> None:
        """One item begins, on a worker thread."""

    def item_ended(self, run: JobRun, ctx: ShardingContext, error: BaseException | None) -> None:
        """One item ended, with the exception it raised or None."""

    def run_ended(self, run: JobRun) -> None:
        """Every item of the run ended and its mark is cleared."""

    def resharded(self, job: str, epoch: int, seconds: float) -> None:
        """This instance, as leader, wrote the job's assignment ``epoch`` in ``seconds``."""


class Observers(RunObserver):
    """Fans each event out to several observers; one that raises is logged, never felt."""

    def __init__(self, observers: Sequence[RunObserver] = ()) -> None:
        self._observers: tuple[RunObserver, ...] = tuple(observers)

    def add(self, observer: RunObserver) -> None:
        self._observers = (*self._observers, observer)

    def __bool__(self) -> bool:
        return bool(self._observers)

    def fire_due(self, job: str, fire_time: float, source: str) -> None:
        for o in self._observers:
            try:
                o.fire_due(job, fire_time, source)
            except Exception:
                log.exception("observer %r failed on fire_due", o)

    def fire_deferred(self, job: str, fire_time: float, what: str) -> None:
        for o in self._observers:
            try:
                o.fire_deferred(job, fire_time, what)
            except Exception:
                log.exception("observer %r failed on fire_deferred", o)

    def run_fenced(self, job: str, fire_time: float, reason: str) -> None:
        for o in self._observers:
            try:
                o.run_fenced(job, fire_time, reason)
            except Exception:
                log.exception("observer %r failed on run_fenced", o)

    def run_started(self, run: JobRun, source: str, task_id: str) -> None:
        for o in self._observers:
            try:
                o.run_started(run, source, task_id)
            except Exception:
                log.exception("observer %r failed on run_started", o)

    def item_started(self, run: JobRun, ctx: ShardingContext) -> None:
        for o in self._observers:
            try:
                o.item_started(run, ctx)
            except Exception:
                log.exception("observer %r failed on item_started", o)

    def item_ended(self, run: JobRun, ctx: ShardingContext, error: BaseException | None) -> None:
        for o in self._observers:
            try:
                o.item_ended(run, ctx, error)
            except Exception:
                log.exception("observer %r failed on item_ended", o)

    def run_ended(self, run: JobRun) -> None:
        for o in self._observers:
            try:
                o.run_ended(run)
            except Exception:
                log.exception("observer %r failed on run_ended", o)

    def resharded(self, job: str, epoch: int, seconds: float) -> None:
        for o in self._observers:
            try:
                o.resharded(job, epoch, seconds)
            except Exception:
                log.exception("observer %r failed on resharded", o)
