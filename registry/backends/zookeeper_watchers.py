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

Invariant: a tree watch's own paths hold no entry at all. A tree watch arms a data watch on
every node of its subtree and a child watch on each that is not a leaf, always with the
same two callbacks, so it registers as a *follower* of the map (``follow``): every path it
follows answers as armed with its callbacks, and adding them there stores nothing. Its
paths' entries were the map's only entries in a scheduler, one per node: 3.7 MiB of hash
table at 10,000 jobs. The trick is sound because ZooKeeper sends a watch's event only
where a watch was armed: an event on a followed path that another watch armed (an
election's, say) also reaches the tree watch, which reads the node again, as it would
have had it armed the path itself. What a follower "follows" is what it covers (its
subtree less what it excludes; no child watch below a leaf), wider than what it has armed
so far, so a callback can never be missing for a path armed before the watch reported it.
A view's listing shows a follower's reported paths (``Follower.followed``).

Invariant: a followed path's watch is one-shot, as an entry's is. When it fires (kazoo pops
it), the map marks it fired for the follower, and it answers as unarmed until the follower
arms it again (its re-read adds the callback back, which clears the mark). Without that, a
change, a deletion and a creation of a node in one transaction fired its data watch for
the change and then, through the NodeDeleted of its child watch (which kazoo pops from
both tables), its data callback again: the node was reported deleted and made twice. Marks
are per path that fired and wait for a re-read: a handful; a node the follower reports
deleted is never armed again, and its marks go with the report (``released``).

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
watch is armed in between), handing the new map the old one's followers under the old
one's lock (``follow`` retries on the map it finds current); any other client is left as
kazoo made it, with a warning, and a tree watch's callbacks are stored per path there.
``tests/registry/test_zookeeper_watchers.py`` checks the tables against a real server,
across a dropped connection.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from kazoo.client import KazooClient

from registry.paths import shared

__all__ = ["Follower", "compact_watcher_tables", "follow", "released", "unfollow"]

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


class Follower(Protocol):
    """A watch whose two callbacks stand for every path it follows (a tree watch): the map
    keeps no entry for those (module docstring). Keys are the caller's paths."""

    @property
    def data_callback(self) -> _Callback: ...

    @property
    def child_callback(self) -> _Callback: ...

    def follows(self, key: str, child: bool) -> bool:
        """Whether a ``child`` (else data) watch of ``key`` may be this watch's: any path it
        covers, at least every path it arms. Called on kazoo's connection thread: no
        blocking, no I/O."""
        ...

    def followed(self, child: bool) -> list[str]:
        """The keys it has armed a ``child`` (else data) watch on, for a view's listing."""
        ...


def _follower_callback(follower: Follower, child: bool) -> _Callback:
    return follower.child_callback if child else follower.data_callback


class _WatcherStore(dict[str, _Slots]):
    """caller's path -> its ``_Slots``, for both of kazoo's tables (module docstring).
    Written under ``_lock`` only; a read of one entry is one dict lookup."""

    def __init__(self, namespace: str) -> None:
        super().__init__()
        self._namespace = namespace
        # re-entrant: a reset lists the map (kazoo's ``values()``) while holding it
        self._lock = threading.RLock()
        #: the one ``_Slots`` of each pair of parts that are single callbacks; an entry
        #: leaves once no path holds its ``_Slots`` (a cancelled watch's callbacks go too)
        self._shared: weakref.WeakValueDictionary[tuple[_Callback | None, _Callback | None], _Slots] = (
            weakref.WeakValueDictionary()
        )
        #: the watches whose paths answer without an entry (copied on write, under _lock)
        self.followers: tuple[Follower, ...] = ()
        #: by follower (its id): the keys whose data, and whose child, watch has fired
        #: since the follower last armed it. A watch is one-shot, and these answer as
        #: unarmed until armed again (``take``, ``add``; written under _lock)
        self._fired: dict[int, tuple[set[str], set[str]]] = {}

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

    def callbacks(self, key: str, child: bool) -> list[_Callback]:
        """``key``'s ``child`` callbacks: those stored, then its followers'."""
        stored = _callbacks(self.part(key, child))
        return stored + self._implied(key, child, stored)

    def _implied(
        self, key: str, child: bool, besides: list[_Callback], *, fire: bool = False
    ) -> list[_Callback]:
        """The callbacks of the followers that hold ``key``'s ``child`` watch armed: they
        follow it and it has not fired since they armed it. ``fire``: it fires now, and
        answers as unarmed from here (lock held by the caller)."""
        if not self.followers or key.startswith(_OUTSIDE):
            return []
        implied = []
        for follower in self.followers:
            callback = _follower_callback(follower, child)
            fired = self._fired.get(id(follower))
            if fired is not None and key in fired[child]:
                continue
            if callback not in besides and follower.follows(key, child):
                implied.append(callback)
                if fire:
                    self._fired.setdefault(id(follower), (set(), set()))[child].add(key)
        return implied

    def held(self, child: bool) -> list[tuple[str, list[_Callback]]]:
        """Every key with a ``child`` callback, and its callbacks: the map's entries (a copy
        taken under the lock: another thread may change the map meanwhile), then each
        follower's paths."""
        with self._lock:
            entries = [(key, _callbacks(slots.part(child))) for key, slots in dict.items(self)]
            followers = self.followers
            fired = {id(f): set(self._fired[id(f)][child]) if id(f) in self._fired else set() for f in followers}
        held = {key: callbacks for key, callbacks in entries if callbacks}
        for follower in followers:
            callback = _follower_callback(follower, child)
            for key in follower.followed(child):
                if key in fired[id(follower)]:
                    continue
                callbacks = held.setdefault(key, [])
                if callback not in callbacks:
                    callbacks.append(callback)
        return list(held.items())

    def follow(self, follower: Follower) -> None:
        """Let ``follower``'s callbacks stand for its paths (lock held by the caller)."""
        if follower not in self.followers:
            self.followers = (*self.followers, follower)

    def unfollow(self, follower: Follower) -> None:
        """Its paths answer with their stored callbacks only (lock held by the caller)."""
        self.followers = tuple(f for f in self.followers if f is not follower)
        self._fired.pop(id(follower), None)

    def released(self, follower: Follower, key: str) -> None:
        """``follower`` reported ``key``'s node deleted: its fired watches need no mark
        (lock held by the caller). Sound because a tree watch reports a deletion only
        after a read whose answer came after every event of the node before it, so no
        event of the node it had armed is still on its way."""
        fired = self._fired.get(id(follower))
        if fired is not None:
            fired[0].discard(key)
            fired[1].discard(key)

    def add(self, key: str, child: bool, callback: _Callback) -> None:
        with self._lock:
            if not key.startswith(_OUTSIDE):
                for follower in self.followers:
                    if callback == _follower_callback(follower, child):
                        # a follower arms only what it follows: it answers for the path
                        # (armed again, if it had fired), and is not asked (its
                        # ``exclude`` would run once more for every new node)
                        fired = self._fired.get(id(follower))
                        if fired is not None:
                            fired[child].discard(key)
                        return
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

    def take(self, key: str, child: bool) -> list[_Callback]:
        """Remove ``key``'s ``child`` part and return its callbacks, its followers' too
        (what kazoo does when a watch fires): the path then answers as unarmed for them
        until they arm it again, as an entry would (a data watch that fired for a change
        must not fire again for the deletion that follows, which kazoo pops from both
        tables)."""
        with self._lock:
            slots = dict.get(self, key)
            stored = None if slots is None else slots.part(child)
            if stored is not None:
                self._store(key, slots, child, None)
            callbacks = _callbacks(stored)
            return callbacks + self._implied(key, child, callbacks, fire=True)

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
        return iter(self._store.callbacks(self._key, self._child))

    def __len__(self) -> int:
        return len(self._store.callbacks(self._key, self._child))


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
        return isinstance(path, str) and bool(self.store.callbacks(self.store.key(path), self._child))

    def __iter__(self) -> Iterator[str]:
        return iter([self.store.server_path(key) for key, _ in self.store.held(self._child)])

    def __len__(self) -> int:
        return len(self.store.held(self._child))

    def get(self, path: str, default: Any = None) -> Any:
        key = self.store.key(path)
        return _Entry(self.store, key, self._child) if self.store.callbacks(key, self._child) else default

    def pop(self, path: str, *default: Any) -> Any:
        callbacks = self.store.take(self.store.key(path), self._child)
        if not callbacks:
            if default:
                return default[0]
            raise KeyError(path)
        return callbacks

    def values(self) -> list[list[_Callback]]:
        return [callbacks for _, callbacks in self.items()]

    def items(self) -> list[tuple[str, list[_Callback]]]:
        store = self.store
        return [(store.server_path(key), callbacks) for key, callbacks in store.held(self._child)]


def _tables(
    namespace: str,
    data: Iterable[tuple[str, Iterable[_Callback]]],
    child: Iterable[tuple[str, Iterable[_Callback]]],
    followers: tuple[Follower, ...] = (),
) -> tuple[_WatcherTable, _WatcherTable]:
    """The data and child views of one new map, holding ``data``'s and ``child``'s entries
    (server paths and their callbacks) and following ``followers``."""
    store = _WatcherStore(namespace)
    store.followers = followers
    tables = (_WatcherTable(store, False), _WatcherTable(store, True))
    for table, entries in zip(tables, (data, child), strict=True):
        for path, callbacks in entries:
            for callback in callbacks:
                table[path].add(callback)
    return tables


def _install(client: Any, namespace: str, followers: tuple[Follower, ...] = ()) -> None:
    data, child = _tables(namespace, client._data_watchers.items(), client._child_watchers.items(), followers)
    client._data_watchers, client._child_watchers = data, child


def _current_store(client: Any) -> _WatcherStore | None:
    table = getattr(client, "_data_watchers", None)
    return table.store if isinstance(table, _WatcherTable) else None


def _on_current_store(client: Any, change: Callable[[_WatcherStore], None]) -> bool:
    """``change(store)`` on ``client``'s current map, under its lock, retried on the new map
    when a reset replaced it meanwhile; False when the tables are not compact."""
    while True:
        store = _current_store(client)
        if store is None:
            return False
        with store._lock:
            if _current_store(client) is store:
                change(store)
                return True


def follow(client: Any, follower: Follower) -> bool:
    """Let ``follower``'s callbacks stand for its paths in ``client``'s tables, now and
    after every reset; False when the tables are not compact (its callbacks are then
    stored per path, as kazoo's own tables keep them)."""
    return _on_current_store(client, lambda store: store.follow(follower))


def unfollow(client: Any, follower: Follower) -> None:
    """Undo ``follow``: ``follower``'s paths answer with their stored callbacks only."""
    _on_current_store(client, lambda store: store.unfollow(follower))


def released(client: Any, follower: Follower, key: str) -> None:
    """``follower`` reported the node of ``key`` deleted (``_WatcherStore.released``)."""
    _on_current_store(client, lambda store: store.released(follower, key))


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
        old = _current_store(client)
        if old is None:  # cannot be: this reset installs the views
            kazoo_reset()
            _install(client, namespace)
            return
        with old._lock:  # a follow meanwhile waits, then finds the new map
            kazoo_reset()
            _install(client, namespace, old.followers)

    client._reset_watchers = reset_watchers
    _install(client, namespace)
    return True
