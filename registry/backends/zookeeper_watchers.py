"""kazoo's tables of one-shot watch callbacks, kept compact.

kazoo keeps the callbacks of the watches it has armed in ``client._data_watchers`` and
``client._child_watchers``: a ``defaultdict(set)`` each, keyed by the path kazoo prefixed
itself. A tree watch arms a data and a child watch on each of a job's dozen nodes, each
entry holding one callback: a set per entry (216 bytes) and a private copy of each path
came to about 4.4 KiB per job; an object per entry holding its one callback, to 1.5 KiB.

Invariant: each table maps a path to its one callback itself, or to a list from the
second callback on (an entry holds one or two, so a scan costs what a hash does); a path
whose last callback is discarded leaves the table. kazoo names paths as sent to the
server, with the registry's namespace in front; the table keys each by ``shared`` of the
caller's path (the namespace cut off: one ``str`` per path, the one the cache and the tree
watch hold too), where a key of its own per node and its entry in the table of interned
strings cost about 1 KiB a job. A path outside the namespace (none of ours) is kept
whole, behind a NUL no caller's path holds. Every path in and out of the table is the
server's, as kazoo's own table has it. The table gives kazoo what it uses of a
``defaultdict(set)``: ``table[path].add(callback)`` (``_Entry``, writing through to the
table), ``pop(path, default)``, ``get`` and ``values()``, each entry as an iterable of
callbacks.

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
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from kazoo.client import KazooClient

from registry.paths import shared

__all__ = ["compact_watcher_tables"]

log = logging.getLogger("registry.zookeeper")

_TABLES = ("_data_watchers", "_child_watchers")


_Callback = Callable[[Any], None]
#: what a table holds for a path: its one callback, or a list of two or more
_Stored = _Callback | list[_Callback]


def _callbacks(stored: _Stored | None) -> list[_Callback]:
    """``stored`` as a list of its callbacks, a copy (a caller may discard while it goes)."""
    if stored is None:
        return []
    return list(stored) if isinstance(stored, list) else [stored]


class _Entry:
    """The callbacks armed on one path, with the part of a set's interface kazoo uses
    (``add``, ``discard``, iteration, ``len``), read from and written to the table: made
    for the call, never stored. ``path`` is the table's key (``_WatcherTable.key``)."""

    __slots__ = ("_path", "_table")

    def __init__(self, table: _WatcherTable, path: str) -> None:
        self._table, self._path = table, path

    def add(self, callback: _Callback) -> None:
        table, path = self._table, self._path
        stored = dict.get(table, path)
        if stored is None:
            dict.__setitem__(table, shared(path), callback)
        elif isinstance(stored, list):
            if callback not in stored:
                stored.append(callback)
        elif stored != callback:
            both: list[_Callback] = [stored, callback]
            dict.__setitem__(table, path, both)

    def discard(self, callback: _Callback) -> None:
        table, path = self._table, self._path
        stored = dict.get(table, path)
        if isinstance(stored, list):
            if callback in stored:
                stored.remove(callback)
                if len(stored) == 1:
                    dict.__setitem__(table, path, stored[0])
        elif stored is not None and stored == callback:
            dict.pop(table, path, None)  # kazoo may have popped it meanwhile

    def __iter__(self) -> Iterator[_Callback]:
        return iter(_callbacks(dict.get(self._table, self._path)))

    def __len__(self) -> int:
        return len(_callbacks(dict.get(self._table, self._path)))


#: marks a key that is a server path outside the namespace, kept whole
_OUTSIDE = "\x00"


class _WatcherTable(dict[str, _Stored]):
    """server path -> its callbacks, keyed by the caller's path (module docstring);
    ``table[path]`` of a path never armed is an empty entry, as a ``defaultdict``'s, but
    adds nothing to the table until a callback is added to it."""

    def __init__(self, namespace: str) -> None:
        super().__init__()
        self._namespace = namespace

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

    def __getitem__(self, path: str) -> _Entry:  # type: ignore[override]  # kazoo's view
        return _Entry(self, self.key(path))

    def __contains__(self, path: object) -> bool:
        return isinstance(path, str) and dict.__contains__(self, self.key(path))

    def __iter__(self) -> Iterator[str]:
        return iter([self.server_path(key) for key in dict.keys(self)])

    def get(self, path: str, default: Any = None) -> Any:
        key = self.key(path)
        return _Entry(self, key) if dict.__contains__(self, key) else default

    def pop(self, path: str, *default: Any) -> Any:
        stored = dict.pop(self, self.key(path), None)
        if stored is None:
            if default:
                return default[0]
            raise KeyError(path)
        return _callbacks(stored)

    def values(self) -> list[list[_Callback]]:  # type: ignore[override]  # kazoo's view
        return [_callbacks(stored) for stored in dict.values(self)]

    def items(self) -> list[tuple[str, list[_Callback]]]:  # type: ignore[override]
        return [(self.server_path(key), _callbacks(stored)) for key, stored in dict.items(self)]


def _table(namespace: str, entries: Iterable[tuple[str, Iterable[_Callback]]]) -> _WatcherTable:
    table = _WatcherTable(namespace)
    for path, callbacks in entries:
        for callback in callbacks:
            table[path].add(callback)
    return table


def _install(client: Any, namespace: str) -> None:
    for name in _TABLES:
        setattr(client, name, _table(namespace, getattr(client, name).items()))


def compact_watcher_tables(client: Any, namespace: str = "") -> bool:
    """Keep ``client``'s watch callbacks in compact tables, now and after every reset,
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
