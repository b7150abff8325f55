"""Bounded waits on a condition: the only way tests wait for something to happen.

Invariant: no wait is unbounded and none is a fixed nap; a wait that runs out raises
``AssertionError`` with a message saying what did not happen. A "did not happen" is
judged over a window (``holds_for``), never at a single instant.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["blocked_in", "holds_for", "wait_for"]

_T = TypeVar("_T")


def wait_for(
    predicate: Callable[[], _T],
    timeout: float,
    interval: float = 0.02,
    message: str | Callable[[], str] = "condition not met",
) -> _T:
    """Poll ``predicate`` until it returns a truthy value and return that value.

    Raises ``AssertionError`` after ``timeout`` seconds; ``message`` may be a callable so
    that the failure can describe the state at the moment it gave up.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            text = message() if callable(message) else message
            raise AssertionError(f"timed out after {timeout:g}s: {text}")
        # the polling interval of a bounded wait, not a nap standing in for a condition
        time.sleep(min(interval, remaining))


def holds_for(
    predicate: Callable[[], object],
    duration: float,
    interval: float = 0.02,
    message: str | Callable[[], str] = "condition broken",
) -> None:
    """Poll ``predicate`` throughout ``duration`` seconds; ``AssertionError`` as soon as it
    is false. For "X did not happen": the window must be long enough for X to have
    happened had the code under test been wrong (say which period it covers)."""
    deadline = time.monotonic() + duration
    while True:
        if not predicate():
            text = message() if callable(message) else message
            raise AssertionError(text)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        # the polling interval of a bounded window, not a nap standing in for a condition
        time.sleep(min(interval, remaining))


def blocked_in(thread: threading.Thread, function: str) -> bool:
    """``thread`` is inside a call of a function named ``function`` right now (its stack,
    read from the interpreter): how a test sees a call *waiting* before it acts."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False
