"""kazoo's tables of watch callbacks are kept compact (``registry/backends/zookeeper_watchers.py``),
against a real ZooKeeper: both tables are views of one map, which a tree watch follows, so
its paths hold no entry and answer with its callbacks; other watches' entries are one per
path, holding their callbacks in one object every such path shares, keyed by the caller's
path (the namespace cut off); still so after the connection drops and kazoo builds its
tables anew; the watch goes on reporting changes throughout."""

from __future__ import annotations

import sys
import threading
import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient

import registry
from registry.backends.zookeeper import ZooKeeperRegistry
from registry.backends.zookeeper_watch import TreeWatcher
from registry.backends.zookeeper_watchers import (
    _tables,
    _WatcherStore,
    compact_watcher_tables,
    follow,
    unfollow,
)
from registry.errors import RegistryConnectionError
from registry.protocol import Event, EventKind, SessionState
from tests.servers.proxy import TCPProxy
from tests.waiting import wait_for

_NODES = ("/job/config", "/job/servers/a", "/job/servers/b", "/job/sharding/0/failover")


def _tables_of(reg: ZooKeeperRegistry) -> tuple[Any, Any]:
    return reg._client._data_watchers, reg._client._child_watchers


def _assert_compact(reg: ZooKeeperRegistry, watched: list[str]) -> None:
    """Both tables are views of one map, not kazoo's ``defaultdict(set)``, which the tree
    watch follows: the map holds no entry for its paths, and every watched node (the watch
    names no leaves: each has a data and a child watch) answers, as kazoo's view of its
    server path, with the tree watch's two callbacks."""
    data, child = _tables_of(reg)
    assert type(data) is not defaultdict and type(child) is not defaultdict
    store = data.store
    assert isinstance(store, _WatcherStore) and child.store is store
    assert reg._ns.prefix
    (watcher,) = [registration.backend_state for registration in reg._watches]
    assert isinstance(watcher, TreeWatcher)
    assert store.followers == (watcher,)
    assert dict(store) == {}, "no entry for a followed path"
    for path in watched:
        served = reg._ns.prefix + path
        assert served in data and served in set(data) and served in child  # kazoo's view
        assert list(data[served]) == [watcher.data_callback], path
        assert list(child[served]) == [watcher.child_callback], path
    assert not [p for p in watcher._known if p.startswith(reg._ns.prefix)]  # no server path kept


@pytest.fixture
def proxy(zk_server: Any) -> Iterator[TCPProxy]:
    host, port = zk_server.address.rsplit(":", 1)
    with TCPProxy(host, int(port)) as tcp:
        yield tcp


def test_the_tables_stay_compact_across_a_dropped_connection(proxy: TCPProxy) -> None:
    reg = registry.connect(
        f"zk://{proxy.address}/zkwatchers{uuid.uuid4().hex[:10]}?session_timeout=20&connect_timeout=2"
    )
    assert isinstance(reg, ZooKeeperRegistry)
    events: list[Event] = []
    seen = threading.Condition()

    def on_event(event: Event) -> None:
        with seen:
            events.append(event)
            seen.notify_all()

    try:
        for path in _NODES:
            reg.create(path, b"v")
        reg.watch("/job", on_event, initial=True)
        watched = ["/job", "/job/config", "/job/servers", "/job/servers/a", "/job/sharding/0/failover"]
        wait_for(lambda: all(reg._ns.prefix + p in _tables_of(reg)[0] for p in watched), 10)
        _assert_compact(reg, watched)

        proxy.cut()
        wait_for(lambda: reg.state is SessionState.SUSPENDED, 20, message=lambda: str(reg.state))
        proxy.restore()
        wait_for(lambda: reg.state is SessionState.RECONNECTED, 20, message=lambda: str(reg.state))
        # the resync re-arms every watch, into the tables kazoo made anew at the drop
        wait_for(lambda: all(reg._ns.prefix + p in _tables_of(reg)[0] for p in watched), 20)
        _assert_compact(reg, watched)

        # one-shot watches fire and are re-armed through the new tables
        reg.put("/job/config", b"changed")
        reg.create("/job/servers/c", b"v")
        wait_for(
            lambda: (
                {("/job/config", b"changed"), ("/job/servers/c", b"v")}
                <= {(e.path, e.value) for e in list(events)}
            ),
            10,
            message=lambda: str(events[-5:]),
        )
        _assert_compact(reg, [*watched, "/job/servers/c"])

        # a node deleted: its watches fired and are not armed again, and the tree watch
        # keeps no mark of them once it has reported the deletion
        reg.delete("/job/servers/c")
        store = _tables_of(reg)[0].store
        wait_for(
            lambda: (
                any(e.path == "/job/servers/c" and e.kind is EventKind.DELETED for e in list(events))
                and not any(keys for fired in store._fired.values() for keys in fired)
            ),
            10,
            message=lambda: f"{events[-3:]} marks {store._fired}",
        )
        _assert_compact(reg, watched)
    finally:
        reg.close()


def test_a_client_whose_tables_are_not_kazoos_is_left_alone(caplog: pytest.LogCaptureFixture) -> None:
    client = KazooClient(hosts="127.0.0.1:1")
    client._data_watchers = {}
    assert compact_watcher_tables(client) is False
    assert client._data_watchers == {}
    assert "_reset_watchers" not in vars(client)
    assert "watcher tables are not the ones this release expects" in caplog.text


def test_a_paths_callbacks_behave_as_the_set_kazoo_expects() -> None:
    def first(_: object) -> None: ...
    def second(_: object) -> None: ...

    table, _ = _tables("", [], [])
    callbacks = table["/p"]
    assert len(callbacks) == 0 and list(callbacks) == [] and not callbacks
    assert "/p" not in table and table.get("/p") is None  # a look adds nothing
    callbacks.add(first)
    callbacks.add(first)
    assert list(callbacks) == [first] and len(callbacks) == 1
    assert table.store["/p"].data is first  # held as itself
    callbacks.add(second)
    callbacks.add(second)
    assert list(callbacks) == [first, second] and len(callbacks) == 2
    assert table.values() == [[first, second]] and table.items() == [("/p", [first, second])]
    for armed in callbacks:  # kazoo's reset iterates while a callback may discard itself
        callbacks.discard(armed)
        callbacks.discard(armed)
    assert list(callbacks) == [] and len(callbacks) == 0 and "/p" not in table
    assert dict(table.store) == {}  # the last callback gone: the path leaves the map
    callbacks.add(second)
    callbacks.discard(first)  # not armed: nothing happens
    assert list(table["/p"]) == [second]
    assert list(_tables("", [("/q", [first, second, first])], [])[0]["/q"]) == [first, second]
    # what kazoo does when a watch fires: pop the path's callbacks, or a default
    assert table.pop("/p", []) == [second] and table.pop("/p", []) == []
    with pytest.raises(KeyError):
        table.pop("/p")


def test_a_paths_data_and_child_callbacks_are_one_entry_shared_by_every_such_path() -> None:
    """A data and a child watch of one path are one entry of the one map; every path armed
    with the same callbacks holds the same object; firing one kind leaves the other."""

    def on_data(_: object) -> None: ...
    def on_child(_: object) -> None: ...

    data, child = _tables("", [], [])
    paths = [f"/job-{n}/servers" for n in range(50)]
    for path in paths:
        data[path].add(on_data)
        child[path].add(on_child)
    store = data.store
    assert len(dict(store)) == 50 and len({id(slots) for slots in dict.values(store)}) == 1
    assert sorted(data) == sorted(paths) == sorted(child) and len(data) == len(child) == 50
    # a child event fires the child watch only: the data watch stays armed
    assert child.pop(paths[0], []) == [on_child]
    assert paths[0] in data and paths[0] not in child and list(data[paths[0]]) == [on_data]
    # a deletion fires both (kazoo pops each table): the path leaves the map
    assert data.pop(paths[1], []) == [on_data] and child.pop(paths[1], []) == [on_child]
    assert paths[1] not in dict(store) and len(dict(store)) == 49
    assert data.values().count([on_data]) == 49 and child.values().count([on_child]) == 48


def test_two_threads_arming_two_kinds_of_one_path_lose_neither() -> None:
    """kazoo's connection thread adds a watched read's callback while the watch worker arms
    the other kind on the same path: each change is a read-modify-write of one entry, so
    without the map's lock one thread puts back what it read and the other's callback is
    lost. Thread switches are forced often to make such a race likely."""

    def on_data(_: object) -> None: ...
    def on_child(_: object) -> None: ...

    data, child = _tables("", [], [])
    paths = [f"/p{n}" for n in range(200)]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(20):

            def arm(start: threading.Barrier, table: Any, callback: Any) -> None:
                start.wait()
                for path in paths:
                    table[path].add(callback)

            start = threading.Barrier(2)
            threads = [
                threading.Thread(target=arm, args=(start, t, c))
                for t, c in ((data, on_data), (child, on_child))
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            lost = [p for p in paths if list(data[p]) != [on_data] or list(child[p]) != [on_child]]
            assert not lost, f"{len(lost)} paths lost a callback, e.g. {lost[:3]}"
            for path in paths:  # a deletion: both fire
                data.pop(path)
                child.pop(path)
            assert dict(data.store) == {}
    finally:
        sys.setswitchinterval(switch)


def test_a_table_keys_the_callers_paths_and_shows_kazoo_the_servers() -> None:
    """Under a namespace the map keys each path by the caller's (the ``str`` the cache
    holds), and kazoo, which names server paths, sees them as its own table would: the
    namespace root as ``/``, a path merely starting with the namespace's name and one
    outside it kept whole."""

    def callback(_: object) -> None: ...

    served = ["/ns", "/ns/job/config", "/nsx/a", "/other"]
    table, _ = _tables("/ns", [(path, [callback]) for path in served], [])
    assert sorted(table) == sorted(served) and all(path in table for path in served)
    assert sorted(path for path, _ in table.items()) == sorted(served)
    assert "/job/config" not in table  # a caller's path is not a server path
    job_key = next(k for k in dict.keys(table.store) if k == "/job/config")
    assert job_key is sys.intern("/job/config")
    assert set(dict.keys(table.store)) == {"/", "/job/config", "\x00/nsx/a", "\x00/other"}
    assert table.pop("/ns/job/config") == [callback] and table.pop("/nsx/a") == [callback]
    assert sorted(table) == ["/ns", "/other"]


class _Follower:
    """A tree watch as the map sees it: two callbacks, the paths below ``/job`` it covers
    (``/job/leaf`` a leaf: no child watch), and the ones it has armed so far."""

    def __init__(self) -> None:
        self.armed = ["/job", "/job/a"]
        self.data_callback = self._on_data
        self.child_callback = self._on_child

    def _on_data(self, _: object) -> None: ...

    def _on_child(self, _: object) -> None: ...

    def follows(self, key: str, child: bool) -> bool:
        return (key == "/job" or key.startswith("/job/")) and not (child and key == "/job/leaf")

    def followed(self, child: bool) -> list[str]:
        return self.armed


def test_a_followers_paths_hold_no_entry_and_answer_with_its_callbacks() -> None:
    def other(_: object) -> None: ...

    tree = _Follower()
    data, child = _tables("/ns", [], [], (tree,))
    store = data.store
    for path in ("/ns/job", "/ns/job/a", "/ns/job/leaf"):
        data[path].add(tree.data_callback)  # what the tree watch's re-arm does
    child["/ns/job"].add(tree.child_callback)
    assert dict(store) == {}, "nothing stored for the follower"
    # what kazoo sees: the follower's callbacks wherever it follows, none elsewhere
    assert list(data["/ns/job/b"]) == [tree.data_callback] and "/ns/job/b" in data
    assert list(child["/ns/job/leaf"]) == [] and "/ns/job/leaf" not in child
    assert "/ns/other" not in data and "/other" not in data and data.get("/ns/other") is None
    assert sorted(data) == ["/ns/job", "/ns/job/a"] == sorted(child)  # listed: what it armed
    # another watch on a followed path is stored, and fires beside the follower
    data["/ns/job/a"].add(other)
    assert set(dict(store)) == {"/job/a"}
    assert data.pop("/ns/job/a", []) == [other, tree.data_callback]
    assert dict(store) == {} and data.pop("/ns/job/a", []) == []  # fired: one-shot
    # unfollowed: its paths answer with what is stored, nothing here
    with store._lock:
        store.unfollow(tree)
    assert data.pop("/ns/job", []) == [] and list(data) == [] and "/ns/job/b" not in data


def test_a_followed_watch_fires_once_until_the_follower_arms_it_again() -> None:
    """A watch is one-shot, and so is a followed path's: kazoo pops it when it fires, and it
    answers as unarmed for the follower until the follower arms it again. A change, a
    deletion and a creation of a node in one transaction fire its data watch, then its
    child watch with NodeDeleted, which kazoo pops from both tables: the data callback must
    not run a second time (it would read the node again and report it made twice)."""

    def other(_: object) -> None: ...

    tree = _Follower()
    data, child = _tables("/ns", [], [], (tree,))
    store = data.store
    assert data.pop("/ns/job/a", []) == [tree.data_callback]  # NodeDataChanged
    assert data.pop("/ns/job/a", []) == [] and child.pop("/ns/job/a", []) == [tree.child_callback]
    assert "/ns/job/a" not in data and "/ns/job/a" not in child and list(data["/ns/job/a"]) == []
    assert sorted(data) == ["/ns/job"] == sorted(child)  # listed: what is armed now
    assert list(data["/ns/job"]) == [tree.data_callback]  # other paths as they were
    data["/ns/job/a"].add(other)  # another watch's: it alone fires
    assert data.pop("/ns/job/a", []) == [other]
    data["/ns/job/a"].add(tree.data_callback)  # the follower's read arms it again
    assert dict(store) == {} and list(data["/ns/job/a"]) == [tree.data_callback]
    assert data.pop("/ns/job/a", []) == [tree.data_callback] and data.pop("/ns/job/a", []) == []
    # the follower reported the node deleted: no mark is kept for it, and its path answers
    # again as one it follows (only an event another watch armed could reach it there)
    with store._lock:
        store.released(tree, "/job/a")
    assert store._fired[id(tree)] == (set(), set())
    assert list(data["/ns/job/a"]) == [tree.data_callback] == list(data["/ns/job/b"])


def test_a_reset_hands_the_followers_to_the_new_map() -> None:
    """kazoo builds its tables anew at a connection loss; the views are installed again,
    following the watches the old map followed."""
    client = KazooClient(hosts="127.0.0.1:1")
    assert compact_watcher_tables(client, "/ns")
    tree = _Follower()
    assert follow(client, tree)
    old = client._data_watchers.store
    client._reset_watchers()
    new = client._data_watchers.store
    assert new is not old and new.followers == (tree,) and client._child_watchers.store is new
    assert list(client._data_watchers["/ns/job/a"]) == [tree.data_callback]
    unfollow(client, tree)
    assert new.followers == () and "/ns/job/a" not in client._data_watchers


def test_a_watch_that_could_not_start_leaves_no_follower(proxy: TCPProxy) -> None:
    """A tree watch follows the tables from its making; one whose start failed (no
    connection within the connect timeout) stops following them."""
    reg = registry.connect(
        f"zk://{proxy.address}/zkwatchers{uuid.uuid4().hex[:10]}?session_timeout=20&connect_timeout=1"
    )
    assert isinstance(reg, ZooKeeperRegistry)
    try:
        proxy.cut()
        wait_for(lambda: reg.state is SessionState.SUSPENDED, 20, message=lambda: str(reg.state))
        with pytest.raises(RegistryConnectionError):
            reg.watch("/job", lambda event: None, initial=True)
        wait_for(lambda: _tables_of(reg)[0].store.followers == (), 10, message="a failed watch still follows")
    finally:
        proxy.restore()
        reg.close()
