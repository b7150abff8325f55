"""Work due to the second for thousands of owners, on one timer entry per second.

Hazard: a job's periodic reconcile (every ``reconcile_interval_minutes``) was an entry of
the process's timer of its own: a key, a heap entry and two table entries, a due time and
a bound method, about 390 bytes a job for work that needs no precision finer than a
second.

The trick: owners due within the same whole second share one bucket, a list, and one
timer entry; in it an owner is one reference. Rescheduling or cancelling leaves that
reference where it is: the owner remembers the second it is due at (the int ``schedule``
returns, one object per bucket), and when a bucket comes due each of its owners is told,
and ignores a second it no longer waits for.

Invariants: ``on_due(second)`` is never called before ``second``, which is ``due``
rounded up; each due owner's call is handed to the executor on its own (a reconcile waits
on round trips, and thousands due together run side by side, as their timer entries
did); an owner scheduled twice for one second is told twice, so an owner checks the
second against the one it waits for.
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import Executor
from typing import Protocol

from scheduler.timer import Timer

__all__ = ["CoarseOwner", "CoarseTimer"]


class CoarseOwner(Protocol):
    def on_due(self, second: int) -> None:
        """The bucket of ``second`` came due: the owner's work, if it still waits for it."""


class CoarseTimer:
    """Owners due to the second (module docstring), on ``timer``; calls run on ``executor``."""

    def __init__(self, timer: Timer, executor: Executor) -> None:
        self._timer = timer
        self._executor = executor
        self._lock = threading.Lock()
        #: second -> (that second, the one int owners keep; the owners due then)
        self._buckets: dict[int, tuple[int, list[CoarseOwner]]] = {}

    def schedule(self, owner: CoarseOwner, due: float) -> int:
        """Tell ``owner`` at ``due`` rounded up to the second; that second, which the
        owner keeps to recognise its call."""
        second = math.ceil(due)
        with self._lock:
            bucket = self._buckets.get(second)
            if bucket is None:
                bucket = self._buckets[second] = (second, [owner])
                self._timer.schedule((self, second), float(second), self._on_bucket)
            else:
                bucket[1].append(owner)
            return bucket[0]

    def pending(self) -> int:
        """The owners waiting in buckets (those rescheduled or cancelled since included)."""
        with self._lock:
            return sum(len(owners) for _, owners in self._buckets.values())

    def _on_bucket(self, due: float) -> None:
        with self._lock:
            bucket = self._buckets.pop(int(due), None)
        if bucket is None:
            return
        second, owners = bucket
        for owner in owners:
            try:
                self._executor.submit(owner.on_due, second)
            except RuntimeError:  # the executor was shut down: the scheduler is stopping
                return
