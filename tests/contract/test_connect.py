"""Contract: connecting — an unreachable registry fails within ``connect_timeout`` and leaks
no thread; URL options reach the client; the password shows nowhere."""

from __future__ import annotations

import logging
import threading
import time

import pytest

import registry
from registry.backends.base import BaseRegistry
from registry.backends.memory import MemoryRegistry
from registry.errors import RegistryConnectionError, RegistryError
from registry.protocol import RegistryCenter
from tests.harness import Harness

from . import PROMPT, SLACK, wait_for

SECRET = "Pw-s3cr3t-7f1e9c"


def test_client_is_a_registry_center(reg: BaseRegistry) -> None:
    assert isinstance(reg, RegistryCenter)


def test_options_reach_the_client(harness: Harness) -> None:
    reg = harness.connect(session_timeout=7.5, connect_timeout=3)
    assert reg.session_timeout == 7.5
    assert reg.connect_timeout == 3
    if isinstance(reg, MemoryRegistry):
        # memory's URL carries no options: its "server" side is the store's own session
        # record, which expires the session after this timeout
        assert reg.store._sessions[reg._session_id].timeout == 7.5
    else:
        assert "session_timeout=7.5" in reg.url and "connect_timeout=3" in reg.url, reg.url


def test_server_time_is_close_to_local_clock(reg: BaseRegistry) -> None:
    assert abs(reg.server_time() - time.time()) < 5


def _threads_started_since(before: set[threading.Thread]) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t not in before and t.is_alive()]


def test_unreachable_server_fails_within_connect_timeout(harness: Harness) -> None:
    try:
        url = harness.unreachable_url(connect_timeout=1)
    except NotImplementedError:
        pytest.skip(f"{harness.name} has no unreachable URL")
    before = set(threading.enumerate())
    start = time.monotonic()
    with pytest.raises(RegistryConnectionError):
        registry.connect(url)
    took = time.monotonic() - start
    assert took < 1 + SLACK, f"connect gave up after {took:.1f}s with connect_timeout=1"
    wait_for(
        lambda: not _threads_started_since(before),
        PROMPT,
        message=lambda: f"threads left by a failed connect: {_threads_started_since(before)}",
    )


def test_closed_client_leaves_no_thread(harness: Harness) -> None:
    before = set(threading.enumerate())
    reg = harness.connect()
    events: list[object] = []
    reg.watch("/w", events.append)
    reg.add_listener(events.append)
    reg.put("/w/a", b"v")
    wait_for(lambda: events, PROMPT, message="no event")
    reg.close()
    wait_for(
        lambda: not _threads_started_since(before),
        PROMPT,
        message=lambda: f"threads left by a closed client: {_threads_started_since(before)}",
    )


def _with_password(url: str, user: str = "shardjob") -> str:
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{user}:{SECRET}@{rest}"


def _error_texts(exc: BaseException) -> list[str]:
    texts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        texts += [str(current), repr(current)]
        current = current.__cause__ or current.__context__
    return texts


def test_password_never_shows(harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    url = _with_password(harness.url(harness.fresh_namespace(), connect_timeout=2))
    caplog.set_level(logging.DEBUG)
    if harness.name == "memory":
        # memory takes no credentials: the refusal must not echo them
        with pytest.raises(ValueError) as refused:
            registry.connect(url)
        assert all(SECRET not in text for text in _error_texts(refused.value))
        return
    try:
        reg = registry.connect(url)
    except RegistryError as exc:
        # a server without authentication may refuse credentials: the error must not show them
        assert all(SECRET not in text for text in _error_texts(exc)), _error_texts(exc)
    else:
        try:
            assert SECRET not in repr(reg)
            assert SECRET not in reg.url
            assert "***" in reg.url
            reg.put("/x", b"v")
            with pytest.raises(RegistryError) as failed:
                reg.transaction([registry.Check("/absent")])
            assert all(SECRET not in text for text in _error_texts(failed.value))
        finally:
            reg.close()
    for record in caplog.records:
        assert SECRET not in record.getMessage(), record.getMessage()
    assert SECRET not in caplog.text
