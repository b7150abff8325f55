"""The registry's clock against the local one, for ``max_time_diff_seconds``, measured at
most once every ``max_age`` seconds for all the jobs of a process.

Hazard: a measurement is a ``server_time()`` round trip, and on ZooKeeper a write (the
server's time is the mtime of a node it touches). Measured for every fire, N every-second
jobs that check their clock cost N writes a second: as many requests as fires, where a
fire's own marks cost a few hundredths of a request (group commit).

Invariants:

- a fire compares with a skew measured less than ``max_age`` seconds before it, so a local
  clock that jumps, or a registry clock that is corrected, shows within ``max_age``;
- one measurement at a time: callers that find the last one too old while another is under
  way wait for it, they do not start their own;
- a failed measurement is not kept: the caller gets its error (its fire does not run, as
  for any registry failure) and the next caller measures again;
- callers that waited for a measurement that failed get a ``ClockSkewError`` naming its error
  and do not try again themselves. Hazard: with a partitioned registry each attempt waits for
  its request timeout, and N jobs firing together would otherwise try one after another,
  holding the coordinator threads for N timeouts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from registry.protocol import RegistryCenter
from scheduler.errors import ClockSkewError

__all__ = ["ClockSkew"]


class ClockSkew:
    """``skew()``: the registry's time minus ``clock()``, at most ``max_age`` seconds old."""

    def __init__(self, reg: RegistryCenter, clock: Callable[[], float] = time.time, *, max_age: float = 1.0) -> None:
        if not max_age > 0:
            raise ValueError(f"max_age must be > 0 seconds, got {max_age!r}")
        self._reg = reg
        self._clock = clock
        self._max_age = max_age
        self._lock = threading.Lock()
        #: (time.monotonic() when the measurement began, skew): one tuple, read without the lock
        self._last: tuple[float, float] | None = None
        #: attempts ended, and the error of the last one if it failed (guarded by the lock)
        self._ended = 0
        self._failure: BaseException | None = None
        #: measurements made (for tests and benchmarks)
        self.measured = 0

    def skew(self) -> float:
        last = self._last
        if last is not None and time.monotonic() - last[0] < self._max_age:
            return last[1]
        ended_before = self._ended
        with self._lock:
            last = self._last  # measured by the caller this one waited for
            if last is not None and time.monotonic() - last[0] < self._max_age:
                return last[1]
            if self._ended != ended_before and self._failure is not None:
                raise ClockSkewError(f"the registry's clock could not be read: {self._failure!r}") from self._failure
            # its age counts from before the round trip: never younger than it is
            began = time.monotonic()
            try:
                skew = self._reg.server_time() - self._clock()
            except BaseException as exc:
                self._failure = exc
                raise
            finally:
                self._ended += 1
            self._failure = None
            self._last = (began, skew)
            self.measured += 1
            return skew
