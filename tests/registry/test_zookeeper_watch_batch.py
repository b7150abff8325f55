"""ZooKeeper's tree watch handles the notifications queued while its worker was busy as
one batch: their reads issued at once and applied in order, the subtrees they reveal read
after. Starting 1,000 jobs queues thousands of notifications; handled one at a time, each
waiting on the server, the cache fell seconds behind the writes."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import registry
from registry.backends.zookeeper import ZooKeeperRegistry
from registry.backends.zookeeper_watch import TreeWatcher
from registry.protocol import EventKind
from tests.contract import PROMPT, EventLog
from tests.waiting import wait_for


@pytest.fixture
def zk_pair(zk_server: Any) -> Iterator[tuple[ZooKeeperRegistry, ZooKeeperRegistry]]:
    """A registry to watch with and another to write with, in a fresh namespace."""
    namespace = "/batch" + uuid.uuid4().hex[:10]
    reg = registry.connect(f"zk://{zk_server.address}{namespace}")
    writer = registry.connect(f"zk://{zk_server.address}{namespace}")
    try:
        assert isinstance(reg, ZooKeeperRegistry) and isinstance(writer, ZooKeeperRegistry)
        yield reg, writer
    finally:
        writer.close()
        reg.close()


@pytest.fixture
def enqueued(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The path of every notification a tree watch queues, in order."""
    paths: list[str] = []
    enqueue = TreeWatcher._enqueue

    def counting_enqueue(self: TreeWatcher, child: bool, event_type: Any, path: str) -> None:
        paths.append(path)
        enqueue(self, child, event_type, path)

    monkeypatch.setattr(TreeWatcher, "_enqueue", counting_enqueue)
    return paths


def test_notifications_queued_while_the_worker_is_busy_are_handled_as_one_batch(
    zk_pair: tuple[ZooKeeperRegistry, ZooKeeperRegistry], monkeypatch: pytest.MonkeyPatch, enqueued: list[str]
) -> None:
    reg, writer = zk_pair
    batches: list[int] = []
    handle = TreeWatcher._handle

    def counting_handle(self: TreeWatcher, events: list[tuple[bool, Any, str]]) -> None:
        batches.append(len(events))
        handle(self, events)

    monkeypatch.setattr(TreeWatcher, "_handle", counting_handle)
    gate = threading.Event()
    try:
        parents = [f"/w/p{i}" for i in range(20)]
        for parent in parents:
            writer.put(f"{parent}/old", b"0")
        log = EventLog()
        reg.watch("/w", log)

        def hold() -> None:
            gate.wait(PROMPT)

        reg._worker.submit(hold)  # the worker is busy until the gate opens
        for parent in parents:
            writer.put(f"{parent}/old", b"1")  # a data notification
            writer.put(f"{parent}/new1", b"n")  # a child notification: the parent's list
            writer.put(f"{parent}/new2", b"n")  # no more: its child watch is not re-armed yet
        wait_for(lambda: len(enqueued) >= 2 * len(parents), PROMPT, message=lambda: f"queued: {enqueued}")
        gate.set()
        for parent in parents:
            log.wait(EventKind.UPDATED, f"{parent}/old", b"1")
            log.wait(EventKind.CREATED, f"{parent}/new1", b"n")
            log.wait(EventKind.CREATED, f"{parent}/new2", b"n")
        assert batches[0] == 2 * len(parents), batches
        assert sorted(e.path for e in log.events if e.kind is EventKind.CREATED) == sorted(
            f"{parent}/{name}" for parent in parents for name in ("new1", "new2")
        )
    finally:
        gate.set()


def test_a_node_changed_then_made_again_before_its_read_is_reported_deleted_and_created(
    zk_pair: tuple[ZooKeeperRegistry, ZooKeeperRegistry],
) -> None:
    """One transaction changes a watched node, deletes it and creates it again: its data
    watch fires once, for the change, and the read it sets off finds the new node at
    version 0, the version last reported. Its creation zxid, folded into the stamp the
    watch keeps, tells the two apart: DELETED then CREATED, never a dropped duplicate."""
    reg, writer = zk_pair
    namespace = writer._ns.prefix
    writer.put("/w/n", b"a")
    log = EventLog()
    reg.watch("/w", log, initial=True)
    log.wait(EventKind.CREATED, "/w/n", b"a")
    client = writer._io.client
    multi = client.transaction()
    multi.set_data(f"{namespace}/w/n", b"x")
    multi.delete(f"{namespace}/w/n")
    multi.create(f"{namespace}/w/n", b"b")
    assert not any(isinstance(result, Exception) for result in multi.commit())
    created = log.wait(EventKind.CREATED, "/w/n", b"b")
    assert created.version == 0
    kinds = [(e.kind, e.value) for e in log.of("/w/n")]
    assert kinds == [(EventKind.CREATED, b"a"), (EventKind.DELETED, None), (EventKind.CREATED, b"b")]
    assert reg.flush_events(PROMPT)
    assert len(log.of("/w/n")) == 3  # and nothing after


def test_an_absent_root_made_and_deleted_before_its_read_is_reported_deleted(
    zk_pair: tuple[ZooKeeperRegistry, ZooKeeperRegistry],
) -> None:
    """A watch of an absent node hears of its creation by an exists watch, and reads it
    afterwards: one deleted before that read was never reported at all, so a watch of one
    node (a ``LeaderElection``'s of its leader node) missed that it went. It is reported
    DELETED, never CREATED (what it held went with it), and the watch goes on: a later
    creation is reported as any."""
    reg, writer = zk_pair
    gate = threading.Event()
    try:
        log = EventLog()
        reg.watch("/w/n", log)
        assert reg.flush_events(PROMPT)

        def hold() -> None:
            gate.wait(PROMPT)

        reg._worker.submit(hold)  # the worker is busy: the read waits for the gate
        fired = threading.Event()
        spy = reg._io.client.exists(f"{reg._ns.prefix}/w/n", watch=lambda _: fired.set())
        assert spy is None
        writer.put("/w/n", b"a")
        assert fired.wait(PROMPT)  # the server has told the exists watches of the creation
        writer.delete("/w")
        gate.set()
        log.wait(EventKind.DELETED, "/w/n")
        assert [e.kind for e in log.of("/w/n")] == [EventKind.DELETED]
        writer.put("/w/n", b"b")
        log.wait(EventKind.CREATED, "/w/n", b"b")
    finally:
        gate.set()


def test_a_parent_its_read_finds_gone_is_reported_deleted_after_its_child(
    zk_pair: tuple[ZooKeeperRegistry, ZooKeeperRegistry], enqueued: list[str]
) -> None:
    """A parent's data changes, then its child and the parent are deleted, all while the
    worker is busy: the parent's read, in the batch ahead of its child's own NodeDeleted,
    finds it gone. The watch keeps no index of children, yet reports the known child
    deleted before the parent (deepest first), and each once."""
    reg, writer = zk_pair
    gate = threading.Event()
    try:
        writer.put("/w/p/c", b"0")
        log = EventLog()
        reg.watch("/w", log, initial=True)
        log.wait(EventKind.CREATED, "/w/p/c", b"0")

        def hold() -> None:
            gate.wait(PROMPT)

        reg._worker.submit(hold)  # the worker is busy until the gate opens
        writer.put("/w/p", b"changed")  # the parent's data watch fires: read once handled
        writer.delete("/w/p")  # the child's NodeDeleted, then the parent's, queued behind it
        wait_for(lambda: {"/w/p", "/w/p/c", "/w"} <= set(enqueued), PROMPT, message=lambda: str(enqueued))
        gate.set()
        log.wait(EventKind.DELETED, "/w/p")
        assert reg.flush_events(PROMPT)
        deleted = [e.path for e in log.events if e.kind is EventKind.DELETED]
        assert deleted == ["/w/p/c", "/w/p"]
        assert enqueued.index("/w/p") < enqueued.index("/w/p/c")  # the read came first
    finally:
        gate.set()
