"""The worker pool that runs items: a fixed number of threads taking bare callables from one
queue, woken one at a time.

Why not ``concurrent.futures.ThreadPoolExecutor``: nothing waits on a run's result (a run
ends in a callback), yet it made a Future, a work item and a semaphore round per task
(submit was 6-9 % of the time a fire held the GIL at a thousand fires a second), and
each task put on its queue woke another idle thread, one more to take turns on the GIL.
Here at most one parked thread is being woken at any time; once running, a thread takes
queued tasks until none is left.

Invariants: at most ``size`` threads, started only when a task finds none parked; a
thread about to run a task while more wait makes sure another thread is coming, so a task
that blocks never holds up the rest while the pool has room; a task that raises is
logged and the thread goes on; after ``shutdown`` nothing new is accepted and, unless
told to drop them, the queued tasks still run.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable

__all__ = ["WorkerPool"]

log = logging.getLogger("scheduler.workers")

Task = Callable[[], object]


class WorkerPool:
    def __init__(self, size: int, name: str = "shardjob-worker") -> None:
        if size < 1:
            raise ValueError(f"a worker pool needs at least one thread, got {size}")
        self._size = size
        self._name = name
        self._tasks: collections.deque[Task] = collections.deque()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        #: parked threads' gates, most recent last (woken first: its cache is warm)
        self._parked: list[threading.Lock] = []
        #: threads released or started that have not yet looked at the queue
        self._waking = 0
        self._closed = False

    @property
    def size(self) -> int:
        return self._size

    def submit(self, task: Task) -> None:
        """Queue ``task``; ``RuntimeError`` once the pool is shut down."""
        if self._closed:
            raise RuntimeError(f"{self._name}: cannot schedule new work after shutdown")
        self._tasks.append(task)
        if not self._waking:  # a thread on its way takes this task too
            self._wake_one()

    def shutdown(self, wait: bool = True, *, drop_queued: bool = False) -> None:
        """Accept nothing more; with ``drop_queued`` the tasks not yet started never run;
        with ``wait`` return once every thread has finished."""
        with self._lock:
            self._closed = True
            if drop_queued:
                self._tasks.clear()
            threads = list(self._threads)
            while self._parked:  # they see the pool closed and leave
                self._waking += 1
                self._parked.pop().release()
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()

    def _wake_one(self) -> None:
        with self._lock:
            if self._waking or not self._tasks or self._closed:
                return
            self._waking += 1
            if self._parked:
                self._parked.pop().release()
                return
            if len(self._threads) < self._size:
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
                return
            self._waking -= 1  # every thread busy: the first to finish takes the task

    def _work(self) -> None:
        gate = threading.Lock()
        gate.acquire()  # held while running; a parked thread blocks on it until released
        tasks = self._tasks
        with self._lock:
            self._waking -= 1
        while True:
            try:
                task = tasks.popleft()
            except IndexError:
                with self._lock:
                    if tasks:
                        continue  # queued meanwhile
                    if self._closed:
                        return
                    self._parked.append(gate)
                gate.acquire()
                with self._lock:
                    self._waking -= 1
                continue
            if tasks and not self._waking:
                self._wake_one()  # in case this task blocks: the next one has a thread coming
            try:
                task()
            except Exception:
                log.exception("%s: a task raised; the pool goes on", self._name)
