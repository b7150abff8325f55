"""Bounded waits on a condition: the only way tests wait for something to happen.

Invariant: no wait is unbounded and none is a fixed nap; a wait that runs out raises
``AssertionError`` with a message saying what did not happen.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["wait_for"]

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
