"""kazoo's tables of watch callbacks are kept compact (``registry/backends/zookeeper_watchers.py``),
against a real ZooKeeper: both tables are views of one map with one entry per watched path,
holding the tree watch's callbacks in one object every such path shares, keyed by the
caller's path (the namespace cut off), the same ``str`` the watch keeps, and still so after
the connection drops and kazoo builds its tables anew; the watch goes on reporting changes
throughout."""

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
from registry.backends.zookeeper_watchers import _tables, _WatcherStore, compact_watcher_tables
from registry.protocol import Event, SessionState
from tests.servers.proxy import TCPProxy
from tests.waiting import wait_for

_NODES = ("/job/config", "/job/servers/a", "/job/servers/b", "/job/sharding/0/failover")


def _tables_of(reg: ZooKeeperRegistry) -> tuple[Any, Any]:
    return reg._client._data_watchers, reg._client._child_watchers


def _assert_compact(reg: ZooKeeperRegistry, watched: list[str]) -> None:
    """Both tables are views of one map, not kazoo's ``defaultdict(set)``; every watched
    node (the watch names no leaves: each has a data and a child watch) is one entry,
    keyed by the interned caller's path, holding the tree watch's two callbacks in the one
    object all of them share."""
    data, child = _tables_of(reg)
    assert type(data) is not defaultdict and type(child) is not defaultdict
    store = data.store
    assert isinstance(store, _WatcherStore) and child.store is store
    assert reg._ns.prefix
    (watcher,) = [registration.backend_state for registration in reg._watches]
    assert isinstance(watcher, TreeWatcher)
    for path in watched:
        slots = store.get(path)
        assert slots is not None and slots.data is watcher.data_callback, (path, slots)
        assert slots.child is watcher.child_callback, path
        key = next(k for k in dict.keys(store) if k == path)
        assert key is sys.intern(path), path
        assert next(k for k in watcher._known if k == path) is key  # the tree watch's one copy
        assert reg._ns.prefix + path in data and reg._ns.prefix + path in set(data)  # kazoo's view
        assert reg._ns.prefix + path in child
    assert len({id(store.get(path)) for path in watched}) == 1, "one object, shared"
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
