"""kazoo's tables of one-shot watch callbacks, kept compact: one entry per watched path.

kazoo keeps the callbacks of the watches it has armed in ``client._data_watchers`` and
``client._child_watchers``: a ``defaultdict(set)`` each, keyed by the path kazoo prefixed
itself. A tree watch arms a data watch on each of a job's dozen nodes and a child watch
on each that is not a leaf: a set per entry (216 bytes) and a private copy of each path
came to about 4.4 KiB per job.

Invariant: both tables are views of ONE map (``_WatcherStore``), path -> ``_Slots``, the
path's data callbacks and child callbacks. A part holds its one callback itself, or a
list from the second callback on (an entry holds one or two, so a scan costs what a hash
does); a path whose last callback of both parts is discarded leaves the map. A ``_Slots``
is never changed, only replaced, and every path armed with the same callbacks holds the
same one (``_WatcherStore._slots``): a tree watch has one data and one child callback, so
a path costs its map entry and nothing else. One map, where two held a second entry for
each node that has children (about 250 bytes a job at 10,000 jobs).

kazoo names paths as sent to the server, with the registry's namespace in front; the map
keys each by ``shared`` of the caller's path (the namespace cut off: one ``str`` per
path, the one the cache and the tree watch hold too), where a key of its own per node and
its entry in the table of interned strings cost about 1 KiB a job. A path outside the
namespace (none of ours) is kept whole, behind a NUL no caller's path holds. Every path
in and out of a view is the server's, as kazoo's own tables have it. A view gives kazoo
what it uses of a ``defaultdict(set)``: ``table[path].add(callback)`` (``_Entry``,
writing through to the map), ``pop(path, default)``, ``get``, ``values()`` and
``items()``, each entry as an iterable of callbacks.

Hazard: kazoo adds a watched read's callback on its connection thread, after it has
handed the answer over, while the watch worker may already be arming other watches of
the same path (``zookeeper_rewatch``). Two parts of one entry are then written by two
threads, and a read-modify-write of one would put back the other as it read it, losing
a callback just added. Every change to the map runs under its lock (``_WatcherStore``).

Hazard: the tables are kazoo's private attributes, and kazoo replaces them with new
``defaultdict(set)`` in ``_reset_watchers`` at every connection loss.
``compact_watcher_tables`` installs only over a client whose tables are kazoo's own
``defaultdict(set)`` and whose reset is ``KazooClient._reset_watchers`` itself, and
installs again after each reset, on the same connection thread that arms watches (so no
watch is armed in between); any other client is left as kazoo made it, with a warning.
``tests/registry/test_zookeeper_watchers.py`` checks the tables against a real server,
across a dropped connection.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from kazoo.client import KazooClient

from registry.paths import shared

__all__ = ["compact_watcher_tables"]

log = logging.getLogger("registry.zookeeper")

_TABLES = ("_data_watchers", "_child_watchers")


_Callback = Callable[[Any], None]
#: what a part holds for a path: its one callback, or a list of two or more (never changed
#: once stored: a change stores a new list)
_Stored = _Callback | list[_Callback]


def _callbacks(stored: _Stored | None) -> list[_Callback]:
    """``stored`` as a list of its callbacks, a copy (a caller may discard while it goes)."""
    if stored is None:
        return []
    return list(stored) if isinstance(stored, list) else [stored]


def _added(stored: _Stored | None, callback: _Callback) -> _Stored | None:
    """``stored`` with ``callback``; None when it already holds it."""
    if stored is None:
        return callback
    if isinstance(stored, list):
        return None if callback in stored else [*stored, callback]
    return None if stored == callback else [stored, callback]


def _removed(stored: _Stored, callback: _Callback) -> _Stored | None:
    """``stored`` without ``callback`` (which it holds); None when nothing is left."""
    if not isinstance(stored, list):
        return None
    left = [armed for armed in stored if armed != callback]
    return left[0] if len(left) == 1 else left


class _Slots:
    """A path's data and child callbacks (each None, or a part: ``_Stored``). Never
    changed; shared by every path armed with the same callbacks (``_WatcherStore._slots``)."""

    __slots__ = ("__weakref__", "child", "data")

    def __init__(self, data: _Stored | None, child: _Stored | None) -> None:
        self.data, self.child = data, child

    def part(self, child: bool) -> _Stored | None:
        return self.child if child else self.data


#: marks a key that is a server path outside the namespace, kept whole
_OUTSIDE = "\x00"


class _WatcherStore(dict[str, _Slots]):
    """caller's path -> its ``_Slots``, for both of kazoo's tables (module docstring).
    Written under ``_lock`` only; a read of one entry is one dict lookup."""

    def __init__(self, namespace: str) -> None:
        super().__init__()
        self._namespace = namespace
        self._lock = threading.Lock()
        #: the one ``_Slots`` of each pair of parts that are single callbacks; an entry
        #: leaves once no path holds its ``_Slots`` (a cancelled watch's callbacks go too)
        self._shared: weakref.WeakValueDictionary[tuple[_Callback | None, _Callback | None], _Slots] = (
            weakref.WeakValueDictionary()
        )

    def key(self, path: str) -> str:
        """The key of the server path ``path``: the caller's path, or ``path`` marked as
        outside the namespace."""
        namespace = self._namespace
        if not namespace:
            return path
        if path.startswith(namespace):
            if len(path) == len(namespace):
                return "/"
            if path[len(namespace)] == "/":
                return path[len(namespace) :]
        return _OUTSIDE + path

    def server_path(self, key: str) -> str:
        if key.startswith(_OUTSIDE):
            return key[len(_OUTSIDE) :]
        return self._namespace + key if key != "/" else self._namespace or "/"

    def part(self, key: str, child: bool) -> _Stored | None:
        slots = dict.get(self, key)
        return None if slots is None else slots.part(child)

    def held(self, child: bool) -> list[tuple[str, _Stored]]:
        """Every key with a ``child`` part, and the part (a copy of the map's items, taken
        under the lock: another thread may change the map meanwhile)."""
        with self._lock:
            entries = [(key, slots.part(child)) for key, slots in dict.items(self)]
        return [(key, stored) for key, stored in entries if stored is not None]

    def add(self, key: str, child: bool, callback: _Callback) -> None:
        with self._lock:
            slots = dict.get(self, key)
            stored = _added(None if slots is None else slots.part(child), callback)
            if stored is not None:
                self._store(key, slots, child, stored)

    def discard(self, key: str, child: bool, callback: _Callback) -> None:
        with self._lock:
            slots = dict.get(self, key)
            stored = None if slots is None else slots.part(child)
            if stored is not None and callback in _callbacks(stored):
                self._store(key, slots, child, _removed(stored, callback))

    def take(self, key: str, child: bool) -> _Stored | None:
        """Remove and return ``key``'s ``child`` part (what kazoo does when a watch fires)."""
        with self._lock:
            slots = dict.get(self, key)
            stored = None if slots is None else slots.part(child)
            if stored is not None:
                self._store(key, slots, child, None)
            return stored

    def _store(self, key: str, slots: _Slots | None, child: bool, stored: _Stored | None) -> None:
        """Give ``key``'s ``child`` part ``stored`` (lock held)."""
        other = None if slots is None else slots.part(not child)
        data, kids = (other, stored) if child else (stored, other)
        if data is None and kids is None:
            dict.pop(self, key, None)
        else:
            # a new key is the one shared str; an existing one keeps the key it has
            dict.__setitem__(self, key if slots is not None else shared(key), self._slots(data, kids))

    def _slots(self, data: _Stored | None, child: _Stored | None) -> _Slots:
        if isinstance(data, list) or isinstance(child, list):
            return _Slots(data, child)  # rare (two watches of one path): not shared
        pair = (data, child)
        slots = self._shared.get(pair)
        if slots is None:
            slots = self._shared[pair] = _Slots(data, child)
        return slots


class _Entry:
    """The callbacks armed on one path of one kind, with the part of a set's interface
    kazoo uses (``add``, ``discard``, iteration, ``len``), read from and written to the
    map: made for the call, never stored. ``key`` is the map's (``_WatcherStore.key``)."""

    __slots__ = ("_child", "_key", "_store")

    def __init__(self, store: _WatcherStore, key: str, child: bool) -> None:
        self._store, self._key, self._child = store, key, child

    def add(self, callback: _Callback) -> None:
        self._store.add(self._key, self._child, callback)

    def discard(self, callback: _Callback) -> None:
        self._store.discard(self._key, self._child, callback)

    def __iter__(self) -> Iterator[_Callback]:
        return iter(_callbacks(self._store.part(self._key, self._child)))

    def __len__(self) -> int:
        return len(_callbacks(self._store.part(self._key, self._child)))


class _WatcherTable:
    """kazoo's view of one kind of watch (data or child) in the shared map: server path ->
    its callbacks. ``table[path]`` of a path never armed is an empty entry, as a
    ``defaultdict``'s, but adds nothing until a callback is added to it."""

    __slots__ = ("_child", "store")

    def __init__(self, store: _WatcherStore, child: bool) -> None:
        self.store, self._child = store, child

    def __getitem__(self, path: str) -> _Entry:
        return _Entry(self.store, self.store.key(path), self._child)

    def __contains__(self, path: object) -> bool:
        return isinstance(path, str) and self.store.part(self.store.key(path), self._child) is not None

    def __iter__(self) -> Iterator[str]:
        return iter([self.store.server_path(key) for key, _ in self.store.held(self._child)])

    def __len__(self) -> int:
        return len(self.store.held(self._child))

    def get(self, path: str, default: Any = None) -> Any:
        key = self.store.key(path)
        return (
            _Entry(self.store, key, self._child) if self.store.part(key, self._child) is not None else default
        )

    def pop(self, path: str, *default: Any) -> Any:
        stored = self.store.take(self.store.key(path), self._child)
        if stored is None:
            if default:
                return default[0]
            raise KeyError(path)
        return _callbacks(stored)

    def values(self) -> list[list[_Callback]]:
        return [callbacks for _, callbacks in self.items()]

    def items(self) -> list[tuple[str, list[_Callback]]]:
        store = self.store
        return [(store.server_path(key), _callbacks(stored)) for key, stored in store.held(self._child)]


def _tables(
    namespace: str,
    data: Iterable[tuple[str, Iterable[_Callback]]],
    child: Iterable[tuple[str, Iterable[_Callback]]],
) -> tuple[_WatcherTable, _WatcherTable]:
    """The data and child views of one new map, holding ``data``'s and ``child``'s entries
    (server paths and their callbacks)."""
    store = _WatcherStore(namespace)
    tables = (_WatcherTable(store, False), _WatcherTable(store, True))
    for table, entries in zip(tables, (data, child), strict=True):
        for path, callbacks in entries:
            for callback in callbacks:
                table[path].add(callback)
    return tables


def _install(client: Any, namespace: str) -> None:
    data, child = _tables(namespace, client._data_watchers.items(), client._child_watchers.items())
    client._data_watchers, client._child_watchers = data, child


def compact_watcher_tables(client: Any, namespace: str = "") -> bool:
    """Keep ``client``'s watch callbacks in one compact map, now and after every reset,
    keyed by the caller's paths under ``namespace`` (the prefix of every server path this
    registry names, "" for none; module docstring); False, with a warning, when this
    kazoo's tables are not the ones expected."""
    expected = getattr(type(client), "_reset_watchers", None) is KazooClient._reset_watchers and all(
        type(table) is defaultdict and table.default_factory is set
        for table in (getattr(client, name, None) for name in _TABLES)
    )
    if not expected or "_reset_watchers" in vars(client):
        log.warning(
            "kazoo's watcher tables are not the ones this release expects: they are left "
            "as kazoo keeps them, a set and a copy of the path per watched node"
        )
        return False
    kazoo_reset = client._reset_watchers

    def reset_watchers() -> None:
        kazoo_reset()
        _install(client, namespace)

    client._reset_watchers = reset_watchers
    _install(client, namespace)
    return True
