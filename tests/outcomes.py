"""What a group commit (``registry.recipes.batch``) tells its callers, recorded by key, for
tests that submit many requests and wait until every one is told."""

from __future__ import annotations

import threading
from typing import Generic, TypeVar

from tests.waiting import wait_for

__all__ = ["Outcomes"]

K = TypeVar("K")


class Outcomes(Generic[K]):
    """``record(key, error)`` is a commit callback once bound to its key (``functools.partial``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_key: dict[K, BaseException | None] = {}

    def record(self, key: K, error: BaseException | None) -> None:
        with self._lock:
            self.by_key[key] = error

    def wait(self, count: int, timeout: float = 60) -> None:
        wait_for(lambda: len(self.by_key) >= count, timeout, message=lambda: f"{len(self.by_key)} of {count} told")
