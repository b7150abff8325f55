"""Contract: session transitions reach listeners (SUSPENDED, RECONNECTED, LOST, CONNECTED),
calls fail cleanly while the registry is unreachable, and listeners cannot stall the client."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

import registry
from registry.backends.base import BaseRegistry
from registry.errors import RegistryConnectionError
from registry.protocol import EventKind, SessionState
from tests.harness import Harness, Link
from tests.waiting import blocked_in

from . import PROMPT, SLACK, EventLog, StateLog, namespace_of, peer, session_timeout, until, wait_for

SUSPENDED, RECONNECTED = SessionState.SUSPENDED, SessionState.RECONNECTED
LOST, CONNECTED = SessionState.LOST, SessionState.CONNECTED

#: Bound for a client to come back after a server restart or a restored link.
RECOVERY = 25.0


@pytest.fixture
def link(harness: Harness) -> Iterator[Link]:
    link = harness.link()
    yield link
    link.restore()
    link.close()


def _connect_through(link: Link, namespace: str, **options: object) -> BaseRegistry:
    return registry.connect(link.url(namespace, **options))


def test_new_client_is_connected(reg: BaseRegistry) -> None:
    assert reg.state is CONNECTED


def test_short_restart_suspends_then_reconnects(harness: Harness) -> None:
    # far longer than the restart takes, even on a loaded CI machine where a ZooKeeper
    # restart (a JVM start) has taken past the default 10 s and expired the session
    reg = harness.connect(session_timeout=30)
    reg.create("/e", b"v", ephemeral=True)
    states = StateLog()
    reg.add_listener(states)
    harness.restart_server(downtime=1.0)
    states.wait_in_order(SUSPENDED, RECONNECTED, timeout=RECOVERY)
    assert LOST not in states.states
    assert reg.state is RECONNECTED
    # session intact: its ephemeral node survived, and the client works
    assert peer(harness, reg).exists("/e")
    reg.put("/after", b"v")
    assert reg.get("/after") == b"v"


def test_expiry_gives_lost_then_connected(harness: Harness) -> None:
    reg = harness.connect(session_timeout=session_timeout(harness))
    other = peer(harness, reg)
    reg.create("/e", b"v", ephemeral=True)
    reg.create("/p", b"v")
    states = StateLog()
    reg.add_listener(states)
    harness.expire_session(reg)
    states.wait_in_order(LOST, CONNECTED, timeout=RECOVERY)
    wait_for(lambda: reg.state is CONNECTED, PROMPT, message=lambda: f"state is {reg.state}")
    assert not other.exists("/e"), "an ephemeral of the expired session survived"
    assert other.get("/p") == b"v"
    # the new session works, and its ephemerals are its own
    reg.create("/e", b"new", ephemeral=True)
    assert other.get("/e") == b"new"
    node = other.get_node("/e")
    assert node is not None and node.ephemeral


def test_removed_listener_is_not_called(harness: Harness) -> None:
    reg = harness.connect(session_timeout=session_timeout(harness))
    removed, kept = StateLog(), StateLog()
    reg.add_listener(removed)
    reg.add_listener(kept)
    reg.remove_listener(removed)
    reg.remove_listener(removed)  # removing twice is harmless
    harness.expire_session(reg)
    kept.wait_in_order(LOST, CONNECTED, timeout=RECOVERY)
    assert reg.flush_events(PROMPT)
    assert removed.states == []


def test_blocking_listener_does_not_stall_watch_delivery(harness: Harness) -> None:
    reg = harness.connect(session_timeout=session_timeout(harness))
    events = EventLog()
    reg.watch("/w", events)
    entered = threading.Event()
    release = threading.Event()

    def blocking(state: SessionState) -> None:
        entered.set()
        release.wait(RECOVERY * 2)

    reg.add_listener(blocking)
    try:
        harness.expire_session(reg)
        assert entered.wait(RECOVERY), "the listener was never called"
        peer(harness, reg).put("/w/during", b"v")
        events.wait(EventKind.CREATED, "/w/during", b"v", timeout=RECOVERY)
        # and calls work too while the listener blocks
        until(lambda: reg.put("/w/own", b"x"), RECOVERY, "the client is stuck behind its listener")
        events.wait(EventKind.CREATED, "/w/own", b"x")
    finally:
        release.set()


def test_calls_fail_cleanly_while_cut_off_then_session_resumes(harness: Harness, link: Link) -> None:
    reg = _connect_through(link, harness.fresh_namespace(), session_timeout=30, connect_timeout=1)
    try:
        reg.create("/e", b"v", ephemeral=True)
        other = harness.connect(namespace_of(reg))
        states = StateLog()
        reg.add_listener(states)
        link.cut()
        for call in (lambda: reg.get("/e"), lambda: reg.put("/x", b"v"), lambda: reg.children("/")):
            start = time.monotonic()
            with pytest.raises(RegistryConnectionError):
                call()
            took = time.monotonic() - start
            assert took < 1 + SLACK, f"a call on a cut link took {took:.1f}s with connect_timeout=1"
        states.wait_in_order(SUSPENDED, timeout=PROMPT)
        link.restore()
        states.wait_in_order(SUSPENDED, RECONNECTED, timeout=RECOVERY)
        assert LOST not in states.states
        assert other.exists("/e"), "a session that never timed out lost its ephemeral node"
        until(lambda: reg.put("/after", b"v"), RECOVERY, "the client did not resume")
        assert other.get("/after") == b"v"
    finally:
        reg.close()


def _attempts_on(link: Link) -> int:
    """Connection attempts a cut proxy link refused so far (-1 for memory's links)."""
    proxies = getattr(link, "proxies", None)
    return -1 if proxies is None else sum(proxy.refused for proxy in proxies)


def test_read_during_a_short_cut_is_retried(harness: Harness, link: Link) -> None:
    """A read issued while the link is cut waits for it (up to connect_timeout) and
    succeeds once it is back. The link is restored only once the read is seen waiting on
    it: a connection attempt refused by the cut proxy since the read began (memory: the
    read blocked waiting for its link), the read not returned."""
    reg = _connect_through(link, harness.fresh_namespace(), session_timeout=30, connect_timeout=8)
    try:
        reg.put("/x", b"v")
        link.cut()
        refused = _attempts_on(link)
        results: dict[str, object] = {}
        began = threading.Event()

        def read() -> None:
            began.set()
            try:
                results["value"] = reg.get("/x")
                results["children"] = reg.children("/")
            except BaseException as exc:  # handed to the test below
                results["error"] = exc

        reader = threading.Thread(target=read, name="cut-read", daemon=True)
        start = time.monotonic()
        reader.start()
        try:
            assert began.wait(PROMPT), "the read did not begin"

            def waiting() -> bool:
                if refused >= 0:
                    return _attempts_on(link) > refused
                return blocked_in(reader, "wait_reachable")

            wait_for(waiting, 8, interval=0.005, message="the read was never seen waiting on the cut link")
            assert reader.is_alive() and not results, f"the read returned while the link was cut: {results}"
        finally:
            link.restore()
        reader.join(8 + SLACK)
        assert not reader.is_alive(), "the read did not return after the link came back"
        assert "error" not in results, f"the read failed: {results['error']!r}"
        assert results == {"value": b"v", "children": ["x"]}
        assert time.monotonic() - start < 8 + SLACK
    finally:
        reg.close()


def test_cut_longer_than_session_timeout_loses_the_session(harness: Harness, link: Link) -> None:
    timeout = session_timeout(harness)
    reg = _connect_through(link, harness.fresh_namespace(), session_timeout=timeout, connect_timeout=1)
    try:
        other = harness.connect(namespace_of(reg))
        reg.create("/e", b"v", ephemeral=True)
        watched = EventLog()
        reg.watch("/w", watched)
        states = StateLog()
        reg.add_listener(states)
        link.cut()
        start = time.monotonic()
        states.wait_in_order(SUSPENDED, timeout=timeout + SLACK)
        wait_for(
            lambda: not other.exists("/e"),
            timeout + SLACK,
            message="the ephemeral of a cut-off client outlived its session timeout",
        )
        assert time.monotonic() - start < timeout + SLACK
        other.put("/w/missed", b"m")
        link.restore()
        states.wait_in_order(SUSPENDED, LOST, CONNECTED, timeout=RECOVERY)
        wait_for(lambda: reg.state is CONNECTED, PROMPT, message=lambda: f"state is {reg.state}")
        watched.wait(EventKind.CREATED, "/w/missed", b"m", timeout=RECOVERY)
        until(lambda: reg.put("/after", b"v"), RECOVERY, "the client did not resume")
        assert other.get("/after") == b"v"
    finally:
        reg.close()
