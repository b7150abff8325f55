"""Watches re-armed after a reconnect by ZooKeeper's SetWatches, as its Java client does,
instead of every node read again; after a session expired too (the request arms the new
session's watches just the same, and the old session's ephemeral nodes, deleted since,
are reported like any deletion). A tree watch's scan arms the watches of what it read
the same way (``zookeeper_watch``), relative to the zxid of its first read's answer.

The server drops a connection's watches with the connection, and kazoo forgets its
callbacks (it does not send SetWatches). Reading the whole subtree again re-arms them but
costs two requests per node: 360,000 at 10,000 jobs, which kept a reconnecting scheduler's
fires waiting behind the reads for some twenty seconds. SetWatches sends the paths once;
the server arms the watch of every path unchanged since the client's last zxid and, for
each one that changed meanwhile, sends at once the event that watch would have fired
(``NodeDataChanged``, ``NodeChildrenChanged``, ``NodeDeleted``, ``NodeCreated`` for an
exists watch), which the tree watch handles like any other. Only what changed is read.

Invariants:

- ``relative_zxid`` is the last zxid the client saw *before the connection dropped*: a
  change after it has a later zxid, so the server reports it; a change before it was
  notified on the old connection before that zxid's answer (the server sends a
  connection's notifications and answers in commit order). A zxid read after the
  reconnect could be newer than changes never notified, so the caller keeps the one of
  the first drop until a re-arm succeeds;
- kazoo's callback tables get the callbacks back before the request is sent, so an event
  the server sends in answer finds them;
- each request holds at most ``MAX_REQUEST_BYTES`` of paths (the Java client's bound,
  far under ``jute.maxbuffer``); the requests are pipelined and all must be answered.

Hazard: sent through ``KazooClient._call``, as ``zookeeper_wire`` sends its multis, and the
callbacks added to kazoo's private tables; a kazoo that changes either fails the reconnect
tests of the contract suite, not silently.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_REQUEST_BYTES", "Rearm", "SetWatches", "rearm"]

#: the Java client's bound on the paths of one SetWatches request
MAX_REQUEST_BYTES = 128 * 1024
_SET_WATCHES = 101
_LONG = struct.Struct("!q")
_INT = struct.Struct("!i")


@dataclass
class Rearm:
    """What one watch had armed: its callbacks and the paths of each kind of watch."""

    data_callback: Callable[[Any], None]
    child_callback: Callable[[Any], None]
    data: list[str] = field(default_factory=list)
    exist: list[str] = field(default_factory=list)
    child: list[str] = field(default_factory=list)


class SetWatches:
    """ZooKeeper's SetWatches request (type 101), in kazoo's request shape: ``type``,
    ``serialize()``, ``deserialize()``; the answer has no body."""

    type = _SET_WATCHES

    def __init__(self, relative_zxid: int, data: list[str], exist: list[str], child: list[str]) -> None:
        self.relative_zxid = relative_zxid
        self.data, self.exist, self.child = data, exist, child

    def serialize(self) -> bytes:
        parts = [_LONG.pack(self.relative_zxid)]
        for paths in (self.data, self.exist, self.child):
            parts.append(_INT.pack(len(paths)))
            for path in paths:
                encoded = path.encode("utf-8")
                parts.append(_INT.pack(len(encoded)))
                parts.append(encoded)
        return b"".join(parts)

    @classmethod
    def deserialize(cls, buffer: bytes, offset: int) -> None:
        return None


def _requests(relative_zxid: int, watches: Iterable[Rearm]) -> list[SetWatches]:
    """The paths of ``watches`` in requests of at most ``MAX_REQUEST_BYTES`` of paths."""
    requests: list[SetWatches] = []
    current = SetWatches(relative_zxid, [], [], [])
    size = 0
    for watch in watches:
        for kind, paths in (("data", watch.data), ("exist", watch.exist), ("child", watch.child)):
            for path in paths:
                cost = len(path.encode("utf-8")) + _INT.size
                if size + cost > MAX_REQUEST_BYTES and size:
                    requests.append(current)
                    current, size = SetWatches(relative_zxid, [], [], []), 0
                getattr(current, kind).append(path)
                size += cost
    if size:
        requests.append(current)
    return requests


def rearm(client: Any, relative_zxid: int, watches: list[Rearm], wait: Callable[[Any], Any]) -> int:
    """Give ``watches``' callbacks back to ``client``'s tables and arm them at the server
    relative to ``relative_zxid``; the number of requests sent. ``wait(result)`` waits for
    one answer (raising its error, or a timeout)."""
    data_table, child_table = client._data_watchers, client._child_watchers
    for watch in watches:
        for path in watch.data:
            data_table[path].add(watch.data_callback)
        for path in watch.exist:
            data_table[path].add(watch.data_callback)
        for path in watch.child:
            child_table[path].add(watch.child_callback)
    pending = []
    for request in _requests(relative_zxid, watches):
        result = client.handler.async_result()
        client._call(request, result)
        pending.append(result)
    for result in pending:
        wait(result)
    return len(pending)
