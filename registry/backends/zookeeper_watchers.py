"""kazoo's tables of one-shot watch callbacks, kept compact.

kazoo keeps the callbacks of the watches it has armed in ``client._data_watchers`` and
``client._child_watchers``: a ``defaultdict(set)`` each, keyed by the path kazoo prefixed
itself. A tree watch arms a data and a child watch on each of a job's dozen nodes, each
entry holding one callback: a set per entry (216 bytes) and a private copy of each path
came to about 4.4 KiB per job.

Invariant: each table maps ``shared(path)`` (one ``str`` per path, the one the tree
watch's own maps hold) to a ``_Callbacks``: one callback in a slot, more in a list, with
a set's ``add`` and ``discard``; an entry holds one or two callbacks, so a scan costs
what a hash does. kazoo uses the tables through ``table[path].add(callback)``,
``pop(path, default)``, ``get`` and ``values()``, all of which these give.

Hazard: the tables are kazoo's private attributes, and kazoo replaces them with new
``defaultdict(set)`` in ``_reset_watchers`` at every connection loss.
``compact_watcher_tables`` installs only over a client whose tables are kazoo's own
``defaultdict(set)`` and whose reset is ``KazooClient._reset_watchers`` itself, and
installs again after each reset, on the same connection thread that arms watches (so no
watch is armed in between); any other client is left as kazoo made it, with a warning. ``tests/registry/test_zookeeper_watchers.py`` checks the tables
against a real server, across a dropped connection.
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


class _Callbacks:
    """The callbacks armed on one path, with the part of a set's interface kazoo uses
    (``add``, ``discard``, iteration, ``len``): nearly always one callback, held in a slot
    (48 bytes, against 92 for a list of one); a list only from the second on."""

    __slots__ = ("_more", "_one")

    def __init__(self, callbacks: Iterable[Callable[[Any], None]] = ()) -> None:
        self._one: Callable[[Any], None] | None = None
        self._more: list[Callable[[Any], None]] | None = None  # two or more, else None
        for callback in callbacks:
            self.add(callback)

    def add(self, callback: Callable[[Any], None]) -> None:
        more = self._more
        if more is not None:
            if callback not in more:
                more.append(callback)
        elif self._one is None:
            self._one = callback
        elif self._one != callback:
            self._more, self._one = [self._one, callback], None

    def discard(self, callback: Callable[[Any], None]) -> None:
        more = self._more
        if more is not None:
            if callback in more:
                more.remove(callback)
                if len(more) == 1:
                    self._one, self._more = more[0], None
        elif self._one == callback:
            self._one = None

    def __iter__(self) -> Iterator[Callable[[Any], None]]:
        if self._more is not None:
            return iter(list(self._more))
        return iter(() if self._one is None else (self._one,))

    def __len__(self) -> int:
        if self._more is not None:
            return len(self._more)
        return 0 if self._one is None else 1


class _WatcherTable(dict[str, _Callbacks]):
    """path -> its callbacks; a missing path gets an empty entry, as a ``defaultdict``."""

    def __missing__(self, path: str) -> _Callbacks:
        callbacks = self[shared(path)] = _Callbacks()
        return callbacks


def _table(entries: Iterable[tuple[str, Iterable[Callable[[Any], None]]]]) -> _WatcherTable:
    table = _WatcherTable()
    for path, callbacks in entries:
        table[shared(path)] = _Callbacks(callbacks)
    return table


def _install(client: Any) -> None:
    for name in _TABLES:
        setattr(client, name, _table(getattr(client, name).items()))


def compact_watcher_tables(client: Any) -> bool:
    """Keep ``client``'s watch callbacks in compact tables, now and after every reset
    (module docstring); False, with a warning, when this kazoo's tables are not the ones
    expected."""
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
        _install(client)

    client._reset_watchers = reset_watchers
    _install(client)
    return True
