"""After a dropped connection comes back to the same session, a ZooKeeper tree watch is
re-armed by SetWatches (``registry/backends/zookeeper_rewatch.py``), not by reading its
whole subtree again: counted at the server (``zk_packets_received``), the reconnect costs
a few requests where a re-read costs two per node; and every change made while the
connection was down is still reported, once, with nothing reported for the rest. A
re-arm that fails falls back to reading the watch again."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import registry
from registry.backends import zookeeper as zookeeper_backend
from registry.backends.zookeeper import ZooKeeperRegistry
from registry.backends.zookeeper_rewatch import MAX_REQUEST_BYTES, Rearm, SetWatches, _requests
from registry.protocol import EventKind, SessionState
from tests.contract import EventLog
from tests.servers.proxy import TCPProxy
from tests.servers.zookeeper import packets_received
from tests.waiting import wait_for

_JOBS = 150  # each /t/nI and /t/nI/a: 301 nodes with the root, ~600 requests to read again


@pytest.fixture
def proxy(zk_server: Any) -> Iterator[TCPProxy]:
    host, port = zk_server.address.rsplit(":", 1)
    with TCPProxy(host, int(port)) as tcp:
        yield tcp


def test_a_reconnect_rearms_the_watch_and_reports_only_what_changed(zk_server: Any, proxy: TCPProxy) -> None:
    namespace = f"/rewatch{uuid.uuid4().hex[:10]}"
    reg = registry.connect(f"zk://{proxy.address}{namespace}?session_timeout=20&connect_timeout=2")
    writer = registry.connect(f"zk://{zk_server.address}{namespace}")
    assert isinstance(reg, ZooKeeperRegistry)
    try:
        for i in range(_JOBS):
            writer.create(f"/t/n{i}/a", b"v")
        log = EventLog()
        reg.watch("/t", log, initial=True)
        log.wait_count(2 * _JOBS + 1)
        log.clear()

        proxy.cut()
        wait_for(lambda: reg.state is SessionState.SUSPENDED, 20, message=lambda: str(reg.state))
        writer.put("/t/n1/a", b"changed")
        writer.delete("/t/n2/a")
        writer.create("/t/n3/b", b"new")
        writer.create("/t/extra", b"new")
        before = packets_received(zk_server.address)
        proxy.restore()
        wait_for(lambda: reg.state is SessionState.RECONNECTED, 20, message=lambda: str(reg.state))
        expected = {
            (EventKind.UPDATED, "/t/n1/a", b"changed"),
            (EventKind.DELETED, "/t/n2/a", None),
            (EventKind.CREATED, "/t/n3/b", b"new"),
            (EventKind.CREATED, "/t/extra", b"new"),
        }
        wait_for(lambda: expected <= {(e.kind, e.path, e.value) for e in log.events}, 10, message=lambda: str(log.events))
        assert reg.flush_events()
        sent = packets_received(zk_server.address) - before
        reported = [(e.kind, e.path, e.value) for e in log.events]
        assert sorted(reported, key=str) == sorted(expected, key=str), reported  # each once, nothing else
        # a re-read would have sent two requests per node (600 here)
        assert sent < 100, f"the reconnect sent {sent} requests"

        # the watches are armed again: a later change is reported
        log.clear()
        writer.put("/t/n4/a", b"after")
        log.wait(EventKind.UPDATED, "/t/n4/a", b"after")
    finally:
        writer.close()
        reg.close()


def test_set_watches_requests_stay_within_the_bound_and_keep_every_path() -> None:
    callback = print
    watches = [
        Rearm(callback, callback, data=[f"/job-{i:05d}/config" for i in range(10_000)], child=[f"/job-{i:05d}" for i in range(10_000)]),
        Rearm(callback, callback, exist=["/absent"]),
    ]  # fmt: skip
    requests = _requests(7, watches)
    assert len(requests) > 1
    for request in requests:
        assert isinstance(request, SetWatches) and request.relative_zxid == 7
        paths = [*request.data, *request.exist, *request.child]
        assert sum(len(p.encode()) + 4 for p in paths) <= MAX_REQUEST_BYTES
        assert len(request.serialize()) == 8 + 3 * 4 + sum(len(p.encode()) + 4 for p in paths)
    assert [p for r in requests for p in r.data] == watches[0].data
    assert [p for r in requests for p in r.child] == watches[0].child
    assert [p for r in requests for p in r.exist] == ["/absent"]


def test_a_failed_rearm_falls_back_to_reading_the_watch_again(
    zk_server: Any, proxy: TCPProxy, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refused(*args: Any) -> int:
        raise RuntimeError("SetWatches refused")

    monkeypatch.setattr(zookeeper_backend, "rearm", refused)
    namespace = f"/rewatch{uuid.uuid4().hex[:10]}"
    reg = registry.connect(f"zk://{proxy.address}{namespace}?session_timeout=20&connect_timeout=2")
    writer = registry.connect(f"zk://{zk_server.address}{namespace}")
    try:
        writer.create("/t/a", b"v")
        log = EventLog()
        reg.watch("/t", log, initial=True)
        log.wait_count(2)
        proxy.cut()
        wait_for(lambda: reg.state is SessionState.SUSPENDED, 20, message=lambda: str(reg.state))
        writer.put("/t/a", b"changed")
        proxy.restore()
        log.wait(EventKind.UPDATED, "/t/a", b"changed")
        assert "watches not re-armed after the reconnect (RuntimeError); reading them again" in caplog.text
        writer.create("/t/b", b"after")  # armed by the re-read
        log.wait(EventKind.CREATED, "/t/b", b"after")
    finally:
        writer.close()
        reg.close()


def test_after_a_session_expired_the_watch_is_rearmed_and_reports_the_lost_ephemerals(
    zk_server: Any, proxy: TCPProxy
) -> None:
    namespace = f"/rewatch{uuid.uuid4().hex[:10]}"
    reg = registry.connect(f"zk://{proxy.address}{namespace}?session_timeout=2&connect_timeout=2")
    writer = registry.connect(f"zk://{zk_server.address}{namespace}")
    assert isinstance(reg, ZooKeeperRegistry)
    try:
        for i in range(_JOBS):
            writer.create(f"/t/n{i}/a", b"v")
        reg.create("/t/n0/mine", b"e", ephemeral=True)  # gone with the session
        log = EventLog()
        reg.watch("/t", log, initial=True)
        log.wait_count(2 * _JOBS + 2)
        log.clear()

        proxy.cut()
        wait_for(lambda: not writer.exists("/t/n0/mine"), 30, message="the session never expired")
        writer.put("/t/n1/a", b"changed")
        before = packets_received(zk_server.address)
        proxy.restore()
        wait_for(lambda: reg.state is SessionState.CONNECTED, 30, message=lambda: str(reg.state))
        expected = {(EventKind.DELETED, "/t/n0/mine", None), (EventKind.UPDATED, "/t/n1/a", b"changed")}
        wait_for(lambda: expected <= {(e.kind, e.path, e.value) for e in log.events}, 10, message=lambda: str(log.events))
        assert reg.flush_events()
        sent = packets_received(zk_server.address) - before
        reported = [(e.kind, e.path, e.value) for e in log.events]
        assert sorted(reported, key=str) == sorted(expected, key=str), reported
        assert sent < 100, f"the new session's watches cost {sent} requests"  # a re-read: 600

        writer.put("/t/n4/a", b"after")
        log.wait(EventKind.UPDATED, "/t/n4/a", b"after")
    finally:
        writer.close()
        reg.close()
