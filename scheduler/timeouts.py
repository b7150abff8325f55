"""Per-item deadlines (``JobConfig.timeout_seconds``): one :class:`Deadline` per item
attempt, expired by the scheduler's one timer thread.

At the deadline the item's context says ``cancelled`` and the kind's cancel hook runs: an
async job's task is cancelled, a script's process group is terminated (the worker waiting
for the script does that itself, see ``scheduler.processes``), a sync job is only told —
a Python call cannot be killed, so it stops where it checks ``ctx.cancelled``.

Invariants: an attempt that the deadline reached fails with ``JobTimeout`` whatever it did
afterwards (``settle`` decides, once, which of "ended" and "expired" came first); a hook
runs at most once, never after the attempt settled.

Hazard: only a job with a timeout pays for one: a job without one gets no ``Deadline``, no
timer entry, no lock per item (the run path's per-item allocations are what the
``LaunchedRun`` docstring in ``scheduler.launched_run`` keeps down). With one, each attempt costs
a ``Deadline`` and a timer entry that the timer's heap keeps until its due time passes,
even once cancelled.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scheduler.timer import Timer

__all__ = ["Deadline", "arm", "disarm"]

log = logging.getLogger("scheduler.jobs")

_RUNNING, _EXPIRED, _SETTLED = 0, 1, 2


class Deadline:
    """When one item attempt must end, and whether it was reached first."""

    __slots__ = ("_hook", "_lock", "_state", "at", "timeout")

    def __init__(self, timeout: float) -> None:
        #: the job's ``timeout_seconds`` when the attempt started
        self.timeout = timeout
        #: the deadline on the ``time.monotonic()`` clock (the one asyncio's loop uses)
        self.at = time.monotonic() + timeout
        self._state = _RUNNING
        self._hook: Callable[[], object] | None = None
        self._lock = threading.Lock()

    @property
    def expired(self) -> bool:
        """The deadline passed before the attempt ended."""
        return self._state == _EXPIRED

    def remaining(self) -> float:
        """Seconds until the deadline (negative once past)."""
        return self.at - time.monotonic()

    def expire(self, _due: float = 0.0) -> None:
        """The deadline passed (the timer's callback, on a coordinator thread): mark the
        attempt cancelled, then run its kind's cancel hook. No-op once settled."""
        with self._lock:
            if self._state != _RUNNING:
                return
            self._state = _EXPIRED
            hook = self._hook
        if hook is not None:
            self._call(hook)

    def on_expire(self, hook: Callable[[], object]) -> None:
        """Run ``hook`` when the deadline passes — at once when it already has. It runs on
        whatever thread expires the deadline, so it must be thread-safe and quick."""
        with self._lock:
            self._hook = hook
            expired = self._state == _EXPIRED
        if expired:
            self._call(hook)

    def settle(self) -> bool:
        """The attempt ended: a later expiry does nothing. True when the deadline was
        reached first (the attempt then fails with ``JobTimeout``)."""
        with self._lock:
            if self._state == _RUNNING:
                self._state = _SETTLED
            return self._state == _EXPIRED

    @staticmethod
    def _call(hook: Callable[[], object]) -> None:
        try:
            hook()
        except Exception:  # the attempt still fails with JobTimeout; its thread is not ours
            log.exception("cancelling a timed-out item failed")


def arm(timer: Timer, timeout: float) -> Deadline:
    """A deadline ``timeout`` seconds from now, expired by ``timer``."""
    deadline = Deadline(timeout)
    timer.schedule(deadline, time.time() + timeout, deadline.expire)
    return deadline


def disarm(timer: Timer, deadline: Deadline) -> bool:
    """The attempt ended: drop its timer entry; True when the deadline came first."""
    timer.cancel(deadline)
    return deadline.settle()
