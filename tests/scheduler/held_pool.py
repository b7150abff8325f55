"""A pool's thread held for a test: what a burst of work must never need."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import Executor


@contextlib.contextmanager
def holding_a_thread(pool: Executor) -> Iterator[threading.Event]:
    """Hold one thread of ``pool`` (a task that waits) until the block ends; yields the
    release, which is set only on leaving the block: still unset inside it proves the
    thread was held throughout."""
    held = threading.Event()
    release = threading.Event()

    def hold() -> None:
        held.set()
        release.wait(60)

    pool.submit(hold)
    try:
        assert held.wait(10), "the pool's thread never took the holding task"
        yield release
    finally:
        release.set()
