"""Round trips and errors per protocol operation, counted by every backend as it calls
the server (``BaseRegistry._call``): what ``shardjob_registry_calls_total`` and
``shardjob_registry_errors_total`` expose, always on.

An operation is the protocol method's name (``get_node``, ``transaction``, ...); an error
is the class the caller sees (``NoNodeError``, ``TransactionError``,
``RegistryConnectionError``, ...). Expected refusals count too (a create that finds its
node, a fenced transaction): read them by kind, and alert on connection errors and
session losses.

Cost: one lock and one counter increment per round trip; the counts are read at scrape
time only.
"""

from __future__ import annotations

import threading
from collections import Counter

__all__ = ["CallStats"]


class CallStats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: Counter[str] = Counter()
        self._errors: Counter[tuple[str, str]] = Counter()

    def record(self, operation: str, error: str | None = None) -> None:
        with self._lock:
            self._calls[operation] += 1
            if error is not None:
                self._errors[(operation, error)] += 1

    def calls(self) -> dict[str, int]:
        """Round trips by operation (failed ones included)."""
        with self._lock:
            return dict(self._calls)

    def errors(self) -> dict[tuple[str, str], int]:
        """Failed round trips by (operation, error class)."""
        with self._lock:
            return dict(self._errors)
