"""Retrying a registry call through transient failures (a connection lost, a server
restarting) within a time budget, with exponential backoff.

The trick: the first try is a plain call. tenacity's retry state costs ~15 us of CPU to
build, which a start-up of 1,000 jobs would pay on ~10,000 calls that all succeed at once;
it is built only after a transient failure, for what is left of the budget. tenacity is
imported then too: with the ``asyncio`` it imports, about 3 MiB of RSS a process that
never meets a failure need not hold. The first retry follows at once, the later ones
after growing waits; as with tenacity alone, a call is tried at least once more after its
first failure, even when the budget is spent.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["call_with_retries"]

_T = TypeVar("_T")


def call_with_retries(fn: Callable[[], _T], *, transient: Callable[[BaseException], bool], budget: float) -> _T:
    """``fn()``, tried again while it raises an exception ``transient`` accepts, until
    ``budget`` seconds have passed since this call; the last exception is raised."""
    deadline = time.monotonic() + budget
    try:
        return fn()
    except Exception as exc:
        if not transient(exc):
            raise
    from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

    retrying = Retrying(
        stop=stop_after_delay(max(0.0, deadline - time.monotonic())),
        wait=wait_exponential(multiplier=0.02, max=0.5),
        retry=retry_if_exception(transient),
        reraise=True,
    )
    return retrying(fn)
