"""One timer thread for every job of a process (ElasticJob's thread-per-job design is its
most reported scaling failure: 7,000 jobs, 20,000 threads).

A heap of due times; the thread sleeps until the earliest and hands each due callback to
an executor, so a slow job never delays another's fire. Invariant: the thread count is one,
whatever the number of jobs; a callback never runs on the timer thread itself.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Executor

__all__ = ["Timer"]

log = logging.getLogger("scheduler.timer")

FireCallback = Callable[[float], None]


class Timer:
    def __init__(self, executor: Executor, name: str = "shardjob-timer") -> None:
        self._executor = executor
        self._name = name
        self._heap: list[tuple[float, int, Hashable]] = []
        self._entries: dict[Hashable, tuple[float, int, FireCallback]] = {}
        self._seq = itertools.count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def start(self) -> None:
        with self._wake:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)

    def schedule(self, key: Hashable, due: float, callback: FireCallback) -> None:
        """Call ``callback(due)`` (on the executor) at wall-clock time ``due``; replaces
        any pending entry of ``key``."""
        with self._wake:
            seq = next(self._seq)
            self._entries[key] = (due, seq, callback)
            heapq.heappush(self._heap, (due, seq, key))
            if self._heap[0][1] == seq:
                self._wake.notify()

    def cancel(self, key: Hashable) -> None:
        with self._wake:
            self._entries.pop(key, None)

    def pending(self, key: Hashable) -> float | None:
        with self._wake:
            entry = self._entries.get(key)
            return None if entry is None else entry[0]

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._stopped:
                    due_now = self._pop_due()
                    if due_now:
                        break
                    timeout = self._heap[0][0] - time.time() if self._heap else None
                    self._wake.wait(timeout if timeout is None else max(timeout, 0.0))
                if self._stopped:
                    return
            for due, callback in due_now:
                try:
                    self._executor.submit(callback, due)
                except RuntimeError:
                    return  # executor shut down: the scheduler is stopping

    def _pop_due(self) -> list[tuple[float, FireCallback]]:
        now = time.time()
        due: list[tuple[float, FireCallback]] = []
        while self._heap and self._heap[0][0] <= now:
            when, seq, key = heapq.heappop(self._heap)
            entry = self._entries.get(key)
            if entry is None or entry[1] != seq:
                continue  # cancelled or replaced
            del self._entries[key]
            due.append((when, entry[2]))
        # drop stale heads so the sleep is computed on a live entry
        while self._heap:
            when, seq, key = self._heap[0]
            entry = self._entries.get(key)
            if entry is not None and entry[1] == seq:
                break
            heapq.heappop(self._heap)
        return due
