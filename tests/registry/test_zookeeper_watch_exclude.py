"""ZooKeeper arms one-shot watches node by node: an excluded subtree must get none, or
every running mark written would still cost each watching client a re-read (the point of
``exclude``), and a leaf (``leaves``) no child watch, or it would cost a children read.
Read from kazoo's own watcher tables, the only place this shows."""

from __future__ import annotations

import collections
import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import registry
from registry.backends.base import BaseRegistry
from registry.backends.zookeeper import ZooKeeperRegistry
from registry.protocol import EventKind
from tests.contract import PROMPT, EventLog, wait_marker
from tests.waiting import wait_for


def _armed(reg: ZooKeeperRegistry) -> set[str]:
    client = reg._io.client
    return set(client._data_watchers) | set(client._child_watchers)


@contextlib.contextmanager
def _watcher_and_writer(zk_server: Any) -> Iterator[tuple[str, ZooKeeperRegistry, BaseRegistry]]:
    """A fresh namespace, the client that watches it, and another that writes."""
    namespace = "/watch" + uuid.uuid4().hex[:10]
    reg = registry.connect(f"zk://{zk_server.address}{namespace}")
    writer = registry.connect(f"zk://{zk_server.address}{namespace}")
    try:
        assert isinstance(reg, ZooKeeperRegistry) and isinstance(writer, BaseRegistry)
        yield namespace, reg, writer
    finally:
        writer.close()
        reg.close()


def test_no_watch_is_armed_in_an_excluded_subtree(zk_server: Any) -> None:
    with _watcher_and_writer(zk_server) as (namespace, reg, writer):
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


def test_a_leaf_gets_a_data_watch_and_no_child_watch(zk_server: Any) -> None:
    with _watcher_and_writer(zk_server) as (namespace, reg, writer):
        client = reg._io.client
        writer.put("/job/config", b"c")
        log = EventLog()
        reg.watch("/", log, initial=True, leaves=lambda p: p.endswith("/config"))
        writer.put("/job/other/config", b"d")  # a leaf adopted after the start
        wait_marker(reg, log, writer, "/job/marker")
        leaves = [f"{namespace}/job/config", f"{namespace}/job/other/config"]
        assert all(leaf in client._data_watchers for leaf in leaves), sorted(client._data_watchers)
        assert not [leaf for leaf in leaves if leaf in client._child_watchers], sorted(client._child_watchers)
        assert f"{namespace}/job/other" in client._child_watchers  # not a leaf: listed and armed
        writer.put("/job/config", b"e")  # the data watch alone reports what a leaf does
        log.wait(EventKind.UPDATED, "/job/config", b"e")
        writer.delete("/job/config")
        log.wait(EventKind.DELETED, "/job/config")


def test_the_servers_root_listed_again_never_shows_zookeepers_own_node(zk_server: Any) -> None:
    """A new node at the server's root makes the watch list the root again; ZooKeeper's
    own ``/zookeeper`` stays hidden there as in the first listing. The watch's ``exclude``
    leaves out every other test's nodes, but not ``/zookeeper`` itself."""
    top = "/root-watch" + uuid.uuid4().hex[:10]
    reg = registry.connect(f"zk://{zk_server.address}")
    try:
        log = EventLog()
        reg.watch("/", log, initial=True, exclude=lambda p: not p.startswith(top) and p != "/zookeeper")
        reg.put(f"{top}-a", b"a")
        reg.put(f"{top}-b/c", b"c")
        wait_marker(reg, log, reg, f"{top}-marker")
        log.wait(EventKind.CREATED, f"{top}-a", b"a")
        log.wait(EventKind.CREATED, f"{top}-b/c", b"c")
        assert not [e for e in log.events if e.path.startswith("/zookeeper")], log.events
    finally:
        for path in (f"{top}-a", f"{top}-b", f"{top}-marker"):
            reg.delete(path)
        reg.close()


def test_a_parent_listed_again_asks_exclude_about_its_new_children_only(zk_server: Any) -> None:
    """A parent is listed again whenever a child is added: a start of N jobs lists the
    namespace hundreds of times. Asking ``exclude`` about every child of every listing made
    that quadratic in Python calls; the children known already are not asked again."""
    with _watcher_and_writer(zk_server) as (_, reg, writer):
        for n in range(50):
            writer.put(f"/jobs/j{n:02d}", b"")
        asked: collections.Counter[str] = collections.Counter()

        def exclude(path: str) -> bool:
            asked[path] += 1
            return False

        log = EventLog()
        reg.watch("/", log, initial=True, exclude=exclude)
        for n in range(50, 60):
            writer.put(f"/jobs/j{n:02d}", b"")
            log.wait(EventKind.CREATED, f"/jobs/j{n:02d}")
        assert reg.flush_events(PROMPT)
        assert sum(asked[f"/jobs/j{n:02d}"] for n in range(60)) <= 2 * 60, asked
