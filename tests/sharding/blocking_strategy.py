"""Custom strategies loaded by name ("tests.sharding.blocking_strategy:assign") in tests:
one that can hold the leader inside its computation, one that drops an item."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from sharding.strategies import avg_allocation

entered = threading.Event()
returned = threading.Event()
_released = threading.Event()
_armed = threading.Event()
_lock = threading.Lock()


def reset() -> None:
    entered.clear()
    returned.clear()
    _released.clear()
    _armed.clear()


def block() -> None:
    """The next computation (only that one) waits until ``release()``."""
    _armed.set()


def release() -> None:
    _released.set()


def assign(instances: Sequence[str], job_name: str, total: int) -> dict[str, list[int]]:
    with _lock:
        hold = _armed.is_set() and not entered.is_set() and len(instances) > 1
        if hold:
            entered.set()
    if hold:
        _released.wait(60)
        returned.set()
    return avg_allocation(instances, job_name, total)


def drops_an_item(instances: Sequence[str], job_name: str, total: int) -> dict[str, list[int]]:
    result = avg_allocation(instances, job_name, total)
    for items in result.values():
        if items:
            items.pop()
            break
    return result
