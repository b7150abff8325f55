"""One daemon thread that runs submitted calls in order: each registry client's event
thread and listener thread (``BaseRegistry``), so a slow listener never stalls event
delivery or the backend's own I/O thread."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

__all__ = ["Dispatcher"]

log = logging.getLogger("registry")


class Dispatcher:
    """One daemon thread that runs submitted calls in order.

    A call that raises is logged and the thread goes on; ``stop()`` drains nothing more.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stopped = False

    def submit(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if self._stopped:
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
        self._queue.put(fn)

    def in_dispatch_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def _run(self) -> None:
        while True:
            fn = self._queue.get()
            if fn is None:
                return
            try:
                fn()
            except Exception:
                log.exception("%s: callback raised; continuing", self._name)

    def flush(self, timeout: float) -> bool:
        """Wait until everything submitted so far has run (False on timeout)."""
        if self._thread is None or self.in_dispatch_thread():
            return True
        done = threading.Event()
        self.submit(done.set)
        return done.wait(timeout)

    def stop(self, timeout: float = 2.0) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            thread = self._thread
        self._queue.put(None)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
