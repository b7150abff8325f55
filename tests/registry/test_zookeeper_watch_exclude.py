"""ZooKeeper arms one-shot watches node by node: an excluded subtree must get none, or
every running mark written would still cost each watching client a re-read (the point of
``exclude``). Read from kazoo's own watcher tables, the only place this shows."""

from __future__ import annotations

import uuid
from typing import Any

import registry
from registry.backends.zookeeper import ZooKeeperRegistry
from tests.contract import EventLog, wait_marker
from tests.waiting import wait_for


def _armed(reg: ZooKeeperRegistry) -> set[str]:
    client = reg._io.client
    return set(client._data_watchers) | set(client._child_watchers)


def test_no_watch_is_armed_in_an_excluded_subtree(zk_server: Any) -> None:
    namespace = "/excl" + uuid.uuid4().hex[:10]
    reg = registry.connect(f"zk://{zk_server.address}{namespace}")
    writer = registry.connect(f"zk://{zk_server.address}{namespace}")
    try:
        assert isinstance(reg, ZooKeeperRegistry)
        writer.put("/job/running/a", b"1")
        writer.put("/job/config", b"c")
        log = EventLog()
        reg.watch("/", log, initial=True, exclude=lambda p: p.endswith("/running"))
        writer.put("/job/running/b", b"2")
        wait_marker(reg, log, writer, "/job/marker")
        armed = _armed(reg)
        assert f"{namespace}/job/config" in armed and f"{namespace}/job/marker" in armed
        assert not [p for p in armed if "/running" in p], sorted(armed)
        # the subtree's churn reaches the client only as child events of its parent
        writer.delete("/job/running/a")
        writer.put("/job/running/c", b"3")
        wait_marker(reg, log, writer, "/job/marker2")
        wait_for(lambda: not [p for p in _armed(reg) if "/running" in p], 5.0)
        assert not [e for e in log.events if "/running" in e.path], log.events
    finally:
        writer.close()
        reg.close()
