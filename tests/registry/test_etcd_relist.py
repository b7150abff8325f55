"""After a dropped connection an etcd watch is *re-listed* (``registry/backends/etcd_watch.py``):
each of its key ranges watches again from now, with no start revision, and one read of the
subtree reports what changed meanwhile. Resuming each range from its own last revision
made etcd re-read all history since for every quiet range (thousands at 10,000 jobs)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import registry
from registry.backends.etcd import EtcdRegistry
from registry.backends.etcd_stream import WatchStream
from registry.protocol import EventKind, SessionState
from tests.contract import EventLog, wait_marker
from tests.servers.proxy import TCPProxy
from tests.waiting import wait_for


@pytest.fixture
def proxy(etcd_server: Any) -> Iterator[TCPProxy]:
    host, port = etcd_server.address.rsplit(":", 1)
    with TCPProxy(host, int(port)) as tcp:
        yield tcp


def test_a_reconnect_watches_from_now_and_reports_what_changed_once(
    etcd_server: Any, proxy: TCPProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    namespace = "/relist" + uuid.uuid4().hex[:10]
    reg = registry.connect(f"etcd://{proxy.address}{namespace}?session_timeout=20&connect_timeout=2")
    writer = registry.connect(f"etcd://{etcd_server.address}{namespace}")
    assert isinstance(reg, EtcdRegistry)
    try:
        for job in range(5):  # a running mark each: the watch becomes six ranges around them
            writer.put(f"/j{job}/running/0", b"r")
            writer.put(f"/j{job}/config", b"0")
        log = EventLog()
        reg.watch("/", log, initial=True, exclude=lambda p: p.endswith("/running"))
        log.wait_count(10)
        for n in range(20):  # revisions pass: every range's own last revision grows old
            writer.put("/j0/config", str(n).encode())
        wait_marker(reg, log, writer, "/marker")
        starts: list[int | None] = []
        subscribe = WatchStream.add_callback

        def recording(self: WatchStream, *args: Any, **kwargs: Any) -> Any:
            starts.append(kwargs.get("start_revision"))
            return subscribe(self, *args, **kwargs)

        monkeypatch.setattr(WatchStream, "add_callback", recording)
        log.clear()

        proxy.cut()
        wait_for(lambda: reg.state is SessionState.SUSPENDED, 20, message=lambda: str(reg.state))
        writer.put("/j3/config", b"changed")
        writer.delete("/j4/config")
        writer.put("/j5/config", b"new")
        proxy.restore()
        wait_for(lambda: reg.state is SessionState.RECONNECTED, 20, message=lambda: str(reg.state))
        expected = [
            (EventKind.UPDATED, "/j3/config", b"changed"),
            (EventKind.DELETED, "/j4/config", None),
            (EventKind.CREATED, "/j5", b""),  # the parent the put created
            (EventKind.CREATED, "/j5/config", b"new"),
        ]
        wait_for(lambda: len(log.events) >= len(expected), 10, message=lambda: str(log.events))
        wait_marker(reg, log, writer, "/marker2")
        reported = [(e.kind, e.path, e.value) for e in log.events if e.path != "/marker2"]
        assert sorted(reported, key=str) == sorted(expected, key=str), reported  # each once, nothing else
        # six ranges and the sentinel (which never had a revision), every one from now
        assert len(starts) >= 7 and all(start is None for start in starts), starts

        writer.put("/j1/config", b"after")  # the ranges watch on
        log.wait(EventKind.UPDATED, "/j1/config", b"after")
    finally:
        writer.close()
        reg.close()
