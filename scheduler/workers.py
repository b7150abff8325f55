"""The worker pool that runs items: a fixed number of threads taking bare callables from one
queue, woken only when nobody else would take the work.

Why not ``concurrent.futures.ThreadPoolExecutor``: nothing waits on a run's result (a run
ends in a callback), yet it made a Future, a work item and a semaphore round per task
(submit was 6-9 % of the time a fire held the GIL at a thousand fires a second), and
each task put on its queue woke another idle thread. Every thread woken in a burst of
fires is one more asking for the GIL back: on two cores those hand-offs, not the work,
made the late fires later. Here a thread is woken only when no thread is awake; an awake
thread takes queued tasks until none is left. A task that blocks is found by a watchdog:
when every awake thread has been in its task for ``stall`` seconds with tasks waiting,
it wakes (or starts) one more — as the timer does for its drains.

A thread the watchdog woke parks again, after its task, once no awake thread is stalled
and another is awake: extra threads live only as long as the stall that called them.

Invariants: at most ``size`` worker threads plus the watchdog, all started only when
needed; while tasks wait, at least one thread is awake or the watchdog wakes one within
``stall`` seconds; a queued task waits for a free thread at most ``stall`` seconds while
the pool has room; a task that raises is logged and the thread goes on; after
``shutdown`` nothing new is accepted and, unless told to drop them, the queued tasks
still run.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable

from scheduler.errors import PoolShutDown

__all__ = ["WorkerPool"]

log = logging.getLogger("scheduler.workers")

Task = Callable[[], object]


class WorkerPool:
    def __init__(self, size: int, name: str = "shardjob-worker", *, stall: float = 0.1) -> None:
        if size < 1:
            raise ValueError(f"a worker pool needs at least one thread, got {size}")
        self._size = size
        self._name = name
        self._stall = stall
        self._tasks: collections.deque[Task] = collections.deque()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        #: parked threads' gates, most recent last (woken first: its cache is warm)
        self._parked: list[threading.Lock] = []
        #: threads not parked: running a task, looking at the queue, or on their way to it
        self._awake = 0
        #: per thread, since when its current task runs (None between tasks)
        self._busy_since: list[float | None] = []
        #: set when a task is queued for the awake threads: the watchdog looks
        self._backlog = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._stopping = threading.Event()  # cuts the watchdog's sleep short
        self._closed = False

    @property
    def size(self) -> int:
        return self._size

    def submit(self, task: Task) -> None:
        """Queue ``task``; ``PoolShutDown`` once the pool is shut down."""
        if self._closed:
            raise PoolShutDown(f"{self._name}: cannot schedule new work after shutdown")
        self._tasks.append(task)
        if not self._awake:
            self._wake_one()
        elif not self._backlog.is_set():
            # an awake thread looks at the queue before it parks, unless its task blocks:
            # the watchdog keeps an eye on that
            self._backlog.set()

    def shutdown(self, wait: bool = True, *, drop_queued: bool = False) -> None:
        """Accept nothing more; with ``drop_queued`` the tasks not yet started never run;
        with ``wait`` return once every thread has finished."""
        with self._lock:
            self._closed = True
            if drop_queued:
                self._tasks.clear()
            threads = list(self._threads)
            if self._watchdog is not None:
                threads.append(self._watchdog)
            while self._parked:  # they run what is left, see the pool closed and leave
                self._awake += 1
                self._parked.pop().release()
        self._stopping.set()  # the watchdog leaves too
        self._backlog.set()
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()

    def _wake_one(self) -> None:
        with self._lock:
            if not self._tasks or self._closed:
                return
            if self._parked:
                self._awake += 1
                self._parked.pop().release()
            elif len(self._threads) < self._size:
                self._awake += 1
                slot = len(self._threads)
                self._busy_since.append(None)
                thread = threading.Thread(
                    target=self._work, args=(slot,), name=f"{self._name}_{slot}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
                if self._watchdog is None:
                    self._watchdog = threading.Thread(
                        target=self._watch, name=f"{self._name}-watchdog", daemon=True
                    )
                    self._watchdog.start()

    def _work(self, slot: int) -> None:
        gate = threading.Lock()
        gate.acquire()  # held while awake; a parked thread blocks on it until released
        tasks = self._tasks
        busy_since = self._busy_since
        while True:
            try:
                task = tasks.popleft()
            except IndexError:
                with self._lock:
                    if tasks:
                        continue  # queued meanwhile
                    self._awake -= 1
                    if self._closed:
                        return
                    self._parked.append(gate)
                gate.acquire()  # the waker counted us awake again
                continue
            busy_since[slot] = time.monotonic()
            try:
                task()
            except Exception:
                log.exception("%s: a task raised; the pool goes on", self._name)
            busy_since[slot] = None
            if self._awake > 1 and self._park_if_surplus(gate):
                gate.acquire()  # the waker counted us awake again

    def _park_if_surplus(self, gate: threading.Lock) -> bool:
        """Park a thread just done with a task, though tasks may wait, when another thread
        is awake to take them and none is stalled: the watchdog woke the extra threads for
        a stall, and once it is over, threads taking turns on the GIL for short tasks only
        slow each other down and fight over the locks those tasks take. Decided and counted
        under the lock, so that two threads never both park and leave the queue to nobody."""
        now = time.monotonic()
        with self._lock:
            if self._awake <= 1 or self._closed:
                return False
            if any(since is not None and now - since >= self._stall for since in self._busy_since):
                return False
            self._awake -= 1
            self._parked.append(gate)
            return True

    def _watch(self) -> None:
        """While tasks wait, every ``stall`` seconds: if every awake thread is held up in
        one task for that long, one more thread takes the queue."""
        tasks = self._tasks
        while not self._closed:
            self._backlog.wait()
            while tasks and not self._closed:
                if self._stopping.wait(self._stall):
                    return
                now = time.monotonic()
                with self._lock:
                    awake = self._awake
                started = [since for since in self._busy_since if since is not None]
                if tasks and len(started) >= awake and all(now - since >= self._stall for since in started):
                    self._wake_one()
            self._backlog.clear()
            if tasks:
                self._backlog.set()  # queued between the last look and the clear
