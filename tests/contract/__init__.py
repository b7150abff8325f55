"""The registry contract suite: one set of tests run unchanged on memory, ZooKeeper and etcd.

Each module covers one topic of the :class:`registry.RegistryCenter` protocol; every test
takes the ``harness`` (or ``reg``) fixture from ``tests/conftest.py``, parametrised over
the three backends, so a semantic that holds on one backend and not on another shows up
as a failure with the backend's id. This module holds the few helpers the tests share:
recorders for events and session states that tests wait on with bounded waits.

Invariant: no helper here waits without a bound; absence (no event, no state) is shown
only after ``flush_events`` and a marker event that must arrive after the absent one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from registry.backends.base import BaseRegistry
from registry.protocol import Event, EventKind, SessionState
from registry.url import parse_url
from tests.harness import Harness
from tests.waiting import wait_for

__all__ = [
    "PROMPT",
    "SLACK",
    "EventLog",
    "StateLog",
    "elapsed_since",
    "namespace_of",
    "peer",
    "session_timeout",
    "until",
    "wait_for",
    "wait_marker",
]

#: How far past ``session_timeout`` a server may take to expire a session: one ZooKeeper
#: tick, etcd's 0.5 s lease-expiry granularity, plus headroom for a loaded 2-core machine.
SLACK = 2.5

#: Bound for anything that should happen "promptly" (an event after a write, a reconnect).
PROMPT = 10.0


def session_timeout(harness: Harness) -> float:
    """The short session timeout the suite uses where expiry must be awaited."""
    return harness.min_session_timeout


class EventLog:
    """A watch callback that records events; tests wait on what it has seen."""

    def __init__(self) -> None:
        self._events: list[Event] = []
        self._lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        with self._lock:
            self._events.append(event)

    @property
    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)

    def of(self, path: str) -> list[Event]:
        return [e for e in self.events if e.path == path]

    def paths(self) -> list[str]:
        return [e.path for e in self.events]

    def clear(self) -> None:
        with self._lock:
            self._events.clear()

    def has(self, kind: EventKind, path: str, value: object = ...) -> bool:
        return any(
            e.kind is kind and e.path == path and (value is ... or e.value == value) for e in self.events
        )

    def wait(self, kind: EventKind, path: str, value: object = ..., timeout: float = PROMPT) -> Event:
        """Wait for a matching event and return the first one."""

        def found() -> Event | None:
            for e in self.events:
                if e.kind is kind and e.path == path and (value is ... or e.value == value):
                    return e
            return None

        shown = "" if value is ... else f" {value!r}"
        event = wait_for(found, timeout, message=lambda: f"no {kind.name} {path}{shown}; got {self.events}")
        assert event is not None
        return event

    def wait_count(self, count: int, timeout: float = PROMPT) -> list[Event]:
        wait_for(
            lambda: len(self.events) >= count,
            timeout,
            message=lambda: f"expected {count} events, got {self.events}",
        )
        return self.events


class StateLog:
    """A session listener that records the states it is told about, with their times."""

    def __init__(self) -> None:
        self._states: list[tuple[float, SessionState]] = []
        self._lock = threading.Lock()

    def __call__(self, state: SessionState) -> None:
        with self._lock:
            self._states.append((time.monotonic(), state))

    @property
    def states(self) -> list[SessionState]:
        with self._lock:
            return [s for _, s in self._states]

    def time_of(self, state: SessionState) -> float | None:
        with self._lock:
            return next((t for t, s in self._states if s is state), None)

    def saw_in_order(self, *expected: SessionState) -> bool:
        """True when ``expected`` occurs as a subsequence of the recorded states."""
        remaining = list(expected)
        for state in self.states:
            if remaining and state is remaining[0]:
                remaining.pop(0)
        return not remaining

    def wait_in_order(self, *expected: SessionState, timeout: float = PROMPT) -> None:
        wait_for(
            lambda: self.saw_in_order(*expected),
            timeout,
            message=lambda: (
                f"expected states {[s.name for s in expected]} in order, got {[s.name for s in self.states]}"
            ),
        )


def wait_marker(reg: BaseRegistry, log: EventLog, writer: BaseRegistry, path: str) -> None:
    """Write ``path`` with ``writer``, wait until ``log`` sees it, then drain ``reg``'s events.

    Anything the watch would wrongly deliver for earlier writes has then been delivered too.
    """
    writer.put(path, b"marker")
    log.wait(EventKind.CREATED, path)
    assert reg.flush_events(PROMPT), "events were not drained in time"


def namespace_of(reg: BaseRegistry) -> str:
    """The namespace ``reg`` was opened on (read back from its masked URL)."""
    return parse_url(reg.url).namespace


def peer(harness: Harness, reg: BaseRegistry, **options: Any) -> BaseRegistry:
    """Another client (its own session) on the same backend and namespace as ``reg``."""
    return harness.connect(namespace_of(reg), **options)


def elapsed_since(start: float) -> float:
    return time.monotonic() - start


def until(fn: Callable[[], object], timeout: float, message: str) -> None:
    """Retry ``fn`` until it returns without raising, bounded by ``timeout``."""
    last: list[BaseException] = []

    def attempt() -> bool:
        try:
            fn()
        except Exception as exc:
            last[:] = [exc]
            return False
        return True

    wait_for(attempt, timeout, interval=0.1, message=lambda: f"{message}; last error: {last!r}")
