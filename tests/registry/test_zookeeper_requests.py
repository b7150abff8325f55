"""How the ZooKeeper backend talks to the server: the parents a transaction's re-plan
trusts without reading them again (those earlier re-plans made or found, those a tree
watch reported), the one-``poll(2)`` select of kazoo's connection thread, a subtree read
in multiReads and deleted in multis, and the deadlines of such a walk; a tree watch that
reads (a new subtree, or nodes that changed) in multiReads and arms its watches afterwards
with SetWatches, relative to the zxid seen before the reads, so what changes in between
is still reported. All are
shortcuts; these tests pin that they never change an outcome."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import registry
from registry.backends import zookeeper, zookeeper_io, zookeeper_watch
from registry.backends.zookeeper import ZooKeeperRegistry
from registry.backends.zookeeper_poll import PollingHandler
from registry.backends.zookeeper_rewatch import rearm
from registry.backends.zookeeper_wire import send_multi
from registry.protocol import Create, Delete, EventKind, Set
from tests.contract import EventLog
from tests.servers.zookeeper import packets_received
from tests.waiting import wait_for


@pytest.fixture
def pair(zk_server: Any) -> Iterator[tuple[ZooKeeperRegistry, ZooKeeperRegistry]]:
    namespace = "/zkreq" + uuid.uuid4().hex[:10]
    ours = registry.connect(f"zk://{zk_server.address}{namespace}")
    other = registry.connect(f"zk://{zk_server.address}{namespace}")
    assert isinstance(ours, ZooKeeperRegistry) and isinstance(other, ZooKeeperRegistry)
    try:
        yield ours, other
    finally:
        ours.close()
        other.close()


def test_a_replan_remembers_the_parents_it_made(pair: tuple[ZooKeeperRegistry, ZooKeeperRegistry]) -> None:
    ours, _ = pair
    ours.transaction([Create("/jobs/a/config", b"1")])  # no parent yet: planned again, reading them
    namespace = registry.parse_url(ours.url).namespace
    assert {f"{namespace}/jobs", f"{namespace}/jobs/a"} <= ours._io.known_parents


def test_a_remembered_parent_that_vanished_is_created_again(
    pair: tuple[ZooKeeperRegistry, ZooKeeperRegistry],
) -> None:
    ours, other = pair
    ours.transaction([Create("/jobs/a/config", b"1")])
    other.delete("/jobs")  # behind our back: our hint still has /jobs and /jobs/a
    ours.transaction([Create("/jobs/a/servers/h", b"2"), Create("/jobs/b/config", b"3")])
    assert other.get("/jobs/a/servers/h") == b"2"
    assert other.get("/jobs/b/config") == b"3"
    assert other.children("/jobs/a") == ["servers"]  # the deleted config stays deleted


def test_a_remembered_parent_deleted_by_our_own_transaction_is_forgotten(
    pair: tuple[ZooKeeperRegistry, ZooKeeperRegistry],
) -> None:
    ours, other = pair
    ours.transaction([Create("/jobs/a/config", b"1")])
    ours.transaction([Delete("/jobs/a")])
    namespace = registry.parse_url(ours.url).namespace
    assert f"{namespace}/jobs/a" not in ours._io.known_parents
    ours.transaction([Create("/jobs/a/config", b"again")])
    assert other.get("/jobs/a/config") == b"again"


def test_polling_select_reports_what_is_ready() -> None:
    handler = PollingHandler()
    left, right = socket.socketpair()
    try:
        assert handler.select([left], [], [], 0.01) == ([], [], [])  # nothing to read: timeout
        began = time.monotonic()
        assert handler.select([left], [], [], 0.2) == ([], [], [])
        assert time.monotonic() - began >= 0.15  # the timeout is seconds, not milliseconds
        assert handler.select([], [left], [], 1.0) == ([], [left], [])
        right.sendall(b"x")
        readable, writable, _ = handler.select([left], [left], [], 1.0)
        assert left in readable and writable == []  # readable before writable, as kazoo's own
        right.close()
        assert handler.select([left], [], [], 1.0)[0] == [left]  # hang-up: readable, the read sees it
        with pytest.raises(ValueError):
            handler.select([left], [], [], -1)
    finally:
        left.close()
        if right.fileno() >= 0:
            right.close()


def _counting_exists(reg: ZooKeeperRegistry) -> list[str]:
    """The paths ``reg``'s client asks ``exists`` of from now on."""
    asked: list[str] = []
    client = reg._io.client
    original = client.exists_async

    def exists_async(path: str, watch: Any = None) -> Any:
        asked.append(path)
        return original(path, watch)

    client.exists_async = exists_async
    return asked


def test_a_replan_trusts_what_a_tree_watch_reported(pair: tuple[ZooKeeperRegistry, ZooKeeperRegistry]) -> None:
    ours, other = pair
    other.create("/jobs/a/config", b"1")  # not ours: no transaction of ours learnt /jobs/a
    seen: list[str] = []
    watch = ours.watch("/", lambda event: seen.append(event.path), initial=True)
    try:
        wait_for(lambda: "/jobs/a/config" in seen, 10, message=lambda: f"reported: {seen}")
        asked = _counting_exists(ours)
        # missing parents (servers, leader, leader/election) and present ones (/jobs, /jobs/a)
        ours.transaction([Create("/jobs/a/servers/h", b"2"), Create("/jobs/a/leader/election/i", b"3")])
        assert asked == [], f"the re-plan read {asked}"
        assert other.get("/jobs/a/servers/h") == b"2" and other.get("/jobs/a/leader/election/i") == b"3"
    finally:
        watch.cancel()


def test_a_parent_a_tree_watch_reports_leaves_the_hint(pair: tuple[ZooKeeperRegistry, ZooKeeperRegistry]) -> None:
    """The watch answers for what it reported, so the hint of parents keeps only what no
    watch follows (a job's ``running`` node): every parent of every job there held 500
    bytes a job. A re-plan still reads none of them."""
    ours, other = pair
    namespace = registry.parse_url(ours.url).namespace
    watch = ours.watch("/", lambda event: None, initial=True, exclude=lambda p: p == "/skip")
    try:
        ours.transaction([Create("/jobs/a/config", b"1"), Create("/skip/a/mark", b"m")])  # re-planned
        unwatched = {f"{namespace}/skip", f"{namespace}/skip/a"}
        wait_for(lambda: ours._io.known_parents == unwatched, 10, message=lambda: f"{ours._io.known_parents}")
        asked = _counting_exists(ours)
        ours.transaction([Create("/jobs/a/servers/h", b"2"), Create("/skip/a/m2", b"m")])
        assert asked == [], f"the re-plan read {asked}"
        assert other.get("/jobs/a/servers/h") == b"2" and other.get("/skip/a/m2") == b"m"
    finally:
        watch.cancel()


@pytest.mark.parametrize("says", [True, False], ids=["says-present", "says-absent"])
def test_a_wrong_watch_answer_costs_a_read_never_an_outcome(
    pair: tuple[ZooKeeperRegistry, ZooKeeperRegistry], says: bool
) -> None:
    """The watches' answer is a hint: wrong (a notification still in flight), the
    transaction is planned again from reads and applies exactly what it should."""
    ours, other = pair
    other.create("/jobs/present/config", b"1")
    ours._io.watched_existence = lambda path: says
    asked = _counting_exists(ours)
    ours.transaction([Create("/jobs/present/servers/h", b"2"), Create("/jobs/absent/servers/h", b"3")])
    assert asked, "a wrong answer must be read again"
    assert other.get("/jobs/present/servers/h") == b"2" and other.get("/jobs/absent/servers/h") == b"3"
    assert other.get("/jobs/present/config") == b"1" and other.children("/jobs") == ["absent", "present"]


def _counting_subtrees(reg: ZooKeeperRegistry) -> list[str]:
    """The subtrees ``reg``'s transactions read from now on (one per deleted node)."""
    read: list[str] = []
    io = reg._io
    original = io.subtree

    def subtree(root: str, deadline: float) -> list[str]:
        read.append(root)
        return original(root, deadline)

    io.subtree = subtree  # type: ignore[method-assign]
    return read


def test_a_missing_parent_re_plans_without_reading_the_deleted_subtrees(
    pair: tuple[ZooKeeperRegistry, ZooKeeperRegistry],
) -> None:
    """A group commit's shared transaction: one job's first mark (its ``running`` node not
    there yet) beside other jobs' marks removed. The re-plan reads the parents, not the
    subtree of every removed mark."""
    ours, other = pair
    marks = [f"/jobs/j{n}/running/i1" for n in range(5)]
    ours.transaction([Create(mark, b"m") for mark in marks])
    read = _counting_subtrees(ours)
    ours.transaction([Create("/jobs/new/running/i1", b"m"), *(Delete(mark) for mark in marks)])
    assert read == [], f"the re-plan read the subtrees of {read}"
    assert other.get("/jobs/new/running/i1") == b"m"
    assert all(other.get(mark) is None for mark in marks)
    assert other.children("/jobs/j0") == ["running"]  # only the mark went


def test_a_deleted_node_found_with_children_is_re_planned_with_its_subtree(
    pair: tuple[ZooKeeperRegistry, ZooKeeperRegistry],
) -> None:
    """Beside a missing parent, a Delete of a node that has children: the first re-plan
    (parents) still assumes a leaf and fails on it; the next reads the subtrees and
    applies both, all or nothing as one transaction."""
    ours, other = pair
    other.create("/jobs/old/config", b"1")
    other.create("/jobs/old/servers/h", b"2")
    read = _counting_subtrees(ours)
    ours.transaction([Create("/jobs/new/config", b"3"), Delete("/jobs/old")])
    assert read == [f"{registry.parse_url(ours.url).namespace}/jobs/old"]
    assert other.get("/jobs/new/config") == b"3"
    assert other.children("/jobs") == ["new"]


#: nodes in the walked subtree, and per multiRead or multi of deletes: a walk of 1,000
#: requests, as long as a namespace of 100,000 jobs walked in requests of 250 nodes
WALKED = 5_000
WALKED_PER_REQUEST = 5


def test_a_subtree_longer_to_walk_than_connect_timeout_is_read_and_deleted_whole(
    zk_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each multiRead of the walk, and each multi of its delete, gets ``connect_timeout``
    for its answer, not the whole walk: a huge namespace takes longer to walk than any one
    answer may."""
    monkeypatch.setattr(zookeeper_io, "_READ_NODES", WALKED_PER_REQUEST)
    monkeypatch.setattr(zookeeper, "_DELETES", WALKED_PER_REQUEST)
    namespace = "/zkwalk" + uuid.uuid4().hex[:10]
    roomy = registry.connect(f"zk://{zk_server.address}{namespace}")
    tight = None
    try:
        creates = [Create(f"/big/n{i:05d}", b"v") for i in range(WALKED)]
        for start in range(0, WALKED, roomy.max_txn_ops):
            roomy.transaction(creates[start : start + roomy.max_txn_ops])
        walks = []
        for _ in range(2):  # the faster of two: the server's first walk may be the slower
            began = time.monotonic()
            assert len(roomy.read_tree("/big")) == WALKED + 1
            walks.append(time.monotonic() - began)
        # a third of the walk: the walk outlasts it three times, a chunk fits in it several
        tight = registry.connect(f"zk://{zk_server.address}{namespace}?connect_timeout={min(walks) / 3:.3f}")
        assert len(tight.read_tree("/big")) == WALKED + 1
        tight.delete("/big")
        assert not roomy.exists("/big")
    finally:
        if tight is not None:
            tight.close()
        roomy.close()


COUNTED = 2_000


def test_a_subtree_is_read_and_deleted_in_a_few_requests_counted_at_the_server(zk_server: Any) -> None:
    """A walk of N nodes costs the server about N / 250 multiReads and its delete N / 500
    multis more, where a request per node and per read used to go (8,000 for these)."""
    namespace = "/zkcount" + uuid.uuid4().hex[:10]
    reg = registry.connect(f"zk://{zk_server.address}{namespace}")
    try:
        creates = [Create(f"/big/n{i:05d}", f"{i}".encode()) for i in range(COUNTED)]
        for start in range(0, COUNTED, reg.max_txn_ops):
            reg.transaction(creates[start : start + reg.max_txn_ops])
        before = packets_received(zk_server.address)
        tree = reg.read_tree("/big")
        read = packets_received(zk_server.address) - before
        before = packets_received(zk_server.address)
        reg.delete("/big")
        deleted = packets_received(zk_server.address) - before
        assert not reg.exists("/big") and reg.read_tree("/big") == {}
    finally:
        reg.close()
    assert len(tree) == COUNTED + 1 and tree["/big/n01234"].value == b"1234"
    assert read <= 20, read  # 9 multiReads, and any other client's pings meanwhile
    assert deleted <= 30, deleted  # 9 multiReads of children, 5 multis of deletes


SCANNED = 2_000


def test_a_watch_over_thousands_of_nodes_starts_in_a_few_requests(
    zk_server: Any, pair: tuple[ZooKeeperRegistry, ZooKeeperRegistry]
) -> None:
    ours, writer = pair
    creates = [Create(f"/big/n{i:05d}", f"{i}".encode()) for i in range(SCANNED)]
    for start in range(0, SCANNED, writer.max_txn_ops):
        writer.transaction(creates[start : start + writer.max_txn_ops])
    log = EventLog()
    before = packets_received(zk_server.address)
    ours.watch("/big", log, initial=True)
    assert ours.flush_events()
    sent = packets_received(zk_server.address) - before
    assert len(log.events) == SCANNED + 1 and log.has(EventKind.CREATED, "/big/n01234", b"1234")
    # two levels of multiReads (1 + 8 of 250 nodes) and one SetWatches; read node by node,
    # a data and a children read each: 4,002
    assert sent <= 25, sent
    log.clear()
    writer.put("/big/n01999", b"changed")  # armed: each node's change is reported
    writer.create("/big/n01999/child", b"new")
    log.wait(EventKind.UPDATED, "/big/n01999", b"changed")
    log.wait(EventKind.CREATED, "/big/n01999/child", b"new")


def _before_the_next_arming(monkeypatch: pytest.MonkeyPatch, change: Callable[[], None]) -> list[bool]:
    """Make ``change`` once, when a tree watch next arms what it read (its SetWatches):
    after its reads, before its watches. The list says whether it was made."""
    changed: list[bool] = []

    def rearm_after_the_change(*args: Any) -> int:
        if not changed:
            changed.append(True)
            change()
        return rearm(*args)

    monkeypatch.setattr(zookeeper_watch, "rearm", rearm_after_the_change)
    return changed


def test_what_changes_between_the_reads_and_the_arming_is_reported(
    pair: tuple[ZooKeeperRegistry, ZooKeeperRegistry], monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, writer = pair
    writer.create("/t/a", b"old")
    writer.create("/t/b", b"doomed")
    writer.create("/t/c/d", b"deep")

    def changes() -> None:  # the first scan's reads are done; nothing is armed yet
        writer.put("/t/a", b"new")
        writer.delete("/t/b")
        writer.create("/t/c/e", b"born")
        writer.delete("/t/c/d")

    changed = _before_the_next_arming(monkeypatch, changes)
    log = EventLog()
    ours.watch("/t", log, initial=True)
    assert changed
    # the initial state as read, then each change the server reported against the zxid
    # seen before the reads
    log.wait(EventKind.CREATED, "/t/a", b"old")
    log.wait(EventKind.CREATED, "/t/b", b"doomed")
    log.wait(EventKind.UPDATED, "/t/a", b"new")
    log.wait(EventKind.DELETED, "/t/b")
    log.wait(EventKind.CREATED, "/t/c/e", b"born")
    log.wait(EventKind.DELETED, "/t/c/d")
    assert ours.flush_events()
    # armed from then on, the new node as the old
    log.clear()
    writer.put("/t/c/e", b"again")
    writer.put("/t/a", b"newer")
    log.wait(EventKind.UPDATED, "/t/c/e", b"again")
    log.wait(EventKind.UPDATED, "/t/a", b"newer")


CHANGED = 1_000


def test_changes_to_many_watched_nodes_are_read_again_in_a_few_requests(
    zk_server: Any, pair: tuple[ZooKeeperRegistry, ZooKeeperRegistry]
) -> None:
    """A batch of notifications is read again in multiReads and its watches armed by
    SetWatches, not a read per changed node (1,000 here); each change is still reported,
    and the nodes stay armed."""
    ours, writer = pair
    creates = [Create(f"/many/n{i:04d}", b"0") for i in range(CHANGED)]
    for start in range(0, CHANGED, writer.max_txn_ops):
        writer.transaction(creates[start : start + writer.max_txn_ops])
    log = EventLog()
    ours.watch("/many", log, initial=True)
    assert ours.flush_events()
    log.clear()
    before = packets_received(zk_server.address)
    updates = [Set(f"/many/n{i:04d}", b"1") for i in range(CHANGED)]
    for start in range(0, CHANGED, writer.max_txn_ops):
        writer.transaction(updates[start : start + writer.max_txn_ops])
    wait_for(lambda: len(log.events) >= CHANGED, 20, message=lambda: f"{len(log.events)} events")
    assert ours.flush_events()
    sent = packets_received(zk_server.address) - before
    assert sorted((e.kind, e.path, e.value) for e in log.events) == [
        (EventKind.UPDATED, f"/many/n{i:04d}", b"1") for i in range(CHANGED)
    ]
    # the writer's 8 transactions, then a multiRead and a SetWatches per batch of
    # notifications the watch took; read node by node: 1,008
    assert sent <= 200, sent
    log.clear()
    writer.put("/many/n0500", b"2")  # armed again by the SetWatches
    log.wait(EventKind.UPDATED, "/many/n0500", b"2")


def test_a_change_between_a_re_read_and_its_arming_is_reported(
    pair: tuple[ZooKeeperRegistry, ZooKeeperRegistry], monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, writer = pair
    writer.create("/r/a", b"1")
    log = EventLog()
    ours.watch("/r", log, initial=True)
    assert ours.flush_events()
    # a lone re-read arms its own watch; this pins the batch's path, its SetWatches after
    monkeypatch.setattr(zookeeper_watch, "_WATCHED_LONE_READ", False)
    # once the re-read of /r/a is done, before its watch is armed
    changed = _before_the_next_arming(monkeypatch, lambda: writer.put("/r/a", b"3"))
    writer.put("/r/a", b"2")
    log.wait(EventKind.UPDATED, "/r/a", b"3")
    assert changed
    writer.put("/r/a", b"4")  # armed again after the second change's own re-read
    log.wait(EventKind.UPDATED, "/r/a", b"4")


LONE = 20


def _requests_for_lone_changes(zk_server: Any, pair: tuple[ZooKeeperRegistry, ZooKeeperRegistry]) -> int:
    """The requests the server took while the writer changed a node watched by ``ours``
    ``LONE`` times, each change reported before the next: none is batched with another.
    Every change must be reported once, in order."""
    ours, writer = pair
    writer.create("/lone/a", b"0")
    log = EventLog()
    ours.watch("/lone", log, initial=True)
    assert ours.flush_events()
    log.clear()
    before = packets_received(zk_server.address)
    for i in range(1, LONE + 1):
        writer.put("/lone/a", str(i).encode())  # one request
        log.wait(EventKind.UPDATED, "/lone/a", str(i).encode())  # reported: armed again
    assert ours.flush_events()
    assert [e.value for e in log.events] == [str(i).encode() for i in range(1, LONE + 1)]
    return packets_received(zk_server.address) - before


def test_a_lone_change_is_read_again_in_one_request_that_arms_its_watch(
    zk_server: Any, pair: tuple[ZooKeeperRegistry, ZooKeeperRegistry]
) -> None:
    """A change that comes alone (the steady state's usual one) is read again by a read
    that arms its watch itself: one request, where a multiRead and its SetWatches are
    two."""
    sent = _requests_for_lone_changes(zk_server, pair)
    # 2 a change (its write, its re-read), a ping or two besides: 41 here; through the
    # batch's path 3 (61), and 5 (101) before its arming was relative to the answer's zxid
    assert sent <= 2 * LONE + 5, sent


def test_a_batch_read_again_is_armed_past_the_changes_that_set_it_off(
    zk_server: Any, pair: tuple[ZooKeeperRegistry, ZooKeeperRegistry], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch's re-read is armed by SetWatches relative to its answer's zxid, which the
    changes that set it off precede: relative to the zxid this client saw before the
    read, the server reported each of them once more, and they were read and armed a
    second time (four requests a change, where two do)."""
    monkeypatch.setattr(zookeeper_watch, "_WATCHED_LONE_READ", False)  # every re-read as a batch's
    sent = _requests_for_lone_changes(zk_server, pair)
    # 3 a change (its write, a multiRead, a SetWatches), a ping or two besides: 61 here;
    # armed relative to the zxid seen before the read, 101
    assert sent <= 3 * LONE + 5, sent


def test_a_lone_new_leaf_is_adopted_in_one_read_that_arms_its_watch(
    zk_server: Any, pair: tuple[ZooKeeperRegistry, ZooKeeperRegistry]
) -> None:
    """An instance joining a job: a new leaf alone under a watched parent costs the
    parent's listing and the leaf's read, each one request that arms its own watch."""
    ours, writer = pair
    writer.create("/leafy/kids", b"")
    log = EventLog()
    ours.watch("/leafy", log, initial=True, leaves=lambda p: p.startswith("/leafy/kids/"))
    assert ours.flush_events()
    before = packets_received(zk_server.address)
    for i in range(LONE):
        writer.create(f"/leafy/kids/k{i:02d}", b"here")
        log.wait(EventKind.CREATED, f"/leafy/kids/k{i:02d}", b"here")
    sent = packets_received(zk_server.address) - before
    # 3 a leaf (its create, the listing, its read), a ping or two besides; as batches: 7 (141)
    assert sent <= 3 * LONE + 5, sent
    writer.put("/leafy/kids/k00", b"changed")  # the leaf's watch is armed
    log.wait(EventKind.UPDATED, "/leafy/kids/k00", b"changed")


@pytest.mark.parametrize("race", ["a node deleted meanwhile", "a child added meanwhile"])
def test_a_refused_multi_of_deletes_is_done_node_by_node(
    pair: tuple[ZooKeeperRegistry, ZooKeeperRegistry], monkeypatch: pytest.MonkeyPatch, race: str
) -> None:
    """A multi of deletes that a concurrent change refuses applied nothing: its nodes are
    deleted one by one (a node already gone is fine), and a node that gained a child
    makes the delete list the subtree again, so the new child goes too."""
    ours, other = pair
    for i in range(10):
        ours.create(f"/gone/n{i}/leaf", b"v")
    raced: list[bool] = []

    def send_after_a_race(client: Any, operations: list[bytes]) -> Any:
        if not raced:  # the first multi: the deepest level's deletes
            raced.append(True)
            if race == "a node deleted meanwhile":
                other.delete("/gone/n3/leaf")
            else:
                other.create("/gone/n3/leaf/new", b"late")
        return send_multi(client, operations)

    monkeypatch.setattr(zookeeper, "send_multi", send_after_a_race)
    ours.delete("/gone")
    assert raced
    assert not ours.exists("/gone") and not other.exists("/gone")


def test_a_node_named_zookeeper_under_a_namespace_is_seen(pair: tuple[ZooKeeperRegistry, ZooKeeperRegistry]) -> None:
    """ZooKeeper's own ``/zookeeper`` is hidden at the server's root only: a tree watch,
    which keeps the caller's paths, hides no node of that name at a namespace's root."""
    ours, other = pair
    other.create("/zookeeper/x", b"1")
    seen: list[str] = []
    watch = ours.watch("/", lambda event: seen.append(event.path), initial=True)
    try:
        other.create("/zookeeper/y", b"2")
        wait_for(lambda: {"/zookeeper", "/zookeeper/x", "/zookeeper/y"} <= set(seen), 10, message=lambda: f"{seen}")
        assert ours.children("/") == ["zookeeper"]
    finally:
        watch.cancel()
