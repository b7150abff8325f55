"""A pool for bursts of blocking work: up to ``size`` threads, each started when a task
finds no idle thread and gone once idle for ``linger`` seconds.

What it is for: after a session expires, every job of the process must register and
campaign again at once, each a few round trips that mostly wait. Through the group commit
(``registry.recipes.batch``) N of them in flight share a round trip, so N threads make the
whole burst N times shorter: 10,000 jobs re-registered four at a time on the coordinator
pool took half a minute, during which no job could fire (BENCHMARKS.md, dropped
connection). A fixed pool that wide would keep its threads for the process's life; this
one holds them only for the burst, so the thread count at rest stays fixed by
configuration, never by the number of jobs.

Invariants: a task never waits for a thread while fewer than ``size`` run (a new one is
started); an idle thread leaves only after ``linger`` seconds with nothing queued, and
never while a task it could take waits; a task that raises is logged and its thread goes
on; after ``shutdown`` nothing new is accepted (``PoolShutDown``), the queued tasks are
dropped when asked, and ``wait`` joins the threads still running (every thread the pool
holds was started under its lock, so none is seen unstarted).
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable

from scheduler.errors import PoolShutDown

__all__ = ["BurstPool"]

log = logging.getLogger("scheduler.burst_pool")

Task = Callable[[], object]


class BurstPool:
    def __init__(self, size: int, name: str, *, linger: float = 2.0) -> None:
        if size < 1:
            raise ValueError(f"a burst pool needs at least one thread, got {size}")
        if not linger > 0:
            raise ValueError(f"a burst pool's linger must be > 0 seconds, got {linger!r}")
        self._size = size
        self._name = name
        self._linger = linger
        self._tasks: collections.deque[Task] = collections.deque()
        self._cond = threading.Condition()
        self._threads: set[threading.Thread] = set()
        self._idle = 0  # threads waiting for a task (guarded by _cond)
        self._started = 0  # threads ever started: their names' numbers
        self._closed = False

    @property
    def threads(self) -> int:
        """Threads alive now (running a task or lingering)."""
        with self._cond:
            return len(self._threads)

    @property
    def idle(self) -> int:
        """Threads waiting for a task."""
        with self._cond:
            return self._idle

    def submit(self, task: Task) -> None:
        """Queue ``task``; ``PoolShutDown`` once the pool is shut down."""
        with self._cond:
            if self._closed:
                raise PoolShutDown(f"{self._name}: cannot schedule new work after shutdown")
            self._tasks.append(task)
            # every idle thread already woken for a queued task counts as taken: a task
            # beyond them starts a thread of its own while there is room
            if self._idle >= len(self._tasks):
                self._cond.notify()
                return
            if len(self._threads) >= self._size:
                return  # a running thread takes it after its task
            self._started += 1
            thread = threading.Thread(target=self._work, name=f"{self._name}-{self._started}", daemon=True)
            # Started under the lock: ``shutdown`` joins every thread of ``_threads``, and
            # joining one not yet started raises. The new thread waits for the lock in
            # ``_work``; ``start()`` returns before that.
            thread.start()
            self._threads.add(thread)

    def shutdown(self, wait: bool = True, *, drop_queued: bool = False) -> None:
        with self._cond:
            self._closed = True
            if drop_queued:
                self._tasks.clear()
            self._cond.notify_all()
            threads = [t for t in self._threads if t is not threading.current_thread()]
        if wait:
            for thread in threads:
                thread.join()

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cond:
                if not self._tasks and not self._closed:
                    self._idle += 1
                    self._cond.wait_for(lambda: self._tasks or self._closed, self._linger)
                    self._idle -= 1
                if not self._tasks:
                    self._threads.discard(me)  # lingered long enough, or shut down
                    return
                task = self._tasks.popleft()
            try:
                task()
            except Exception:
                log.exception("%s: a task raised; the pool goes on", self._name)
