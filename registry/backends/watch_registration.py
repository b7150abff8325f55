"""A watch's backend-side state (``WatchRegistration``): its root, what it leaves out, and
the stamp of each node it has reported, which ``BaseRegistry`` compares every raw
notification with so that a duplicate or stale one is dropped."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from registry.paths import is_below, parent, shared
from registry.protocol import EventCallback, Watch

__all__ = ["WatchRegistration", "below_leaves", "depth"]


def below_leaves(
    excluded: Callable[[str], bool] | None, leaf: Callable[[str], bool]
) -> Callable[[str], bool]:
    """A watch's exclusion with ``leaf`` nodes' children added to it: every backend then
    leaves out what is below a leaf exactly as it leaves out an excluded subtree."""

    def excluded_or_below_leaf(stored: str) -> bool:
        return leaf(parent(stored)) or (excluded is not None and excluded(stored))

    return excluded_or_below_leaf


def depth(path: str) -> int:
    """Segments in ``path``: a resync reports parents before their children, deletions
    children first (``/`` is a namespace's root, above ``/a``)."""
    return 0 if path == "/" else path.count("/")


#: paths left out that a watch with ``exclude`` remembers
_LEFT_OUT_MEMO = 65_536


@dataclass(eq=False)
class WatchRegistration:
    """A watch's backend-side state: its root (stored path) and the versions it reported.

    Invariant: the maps a registration keeps for as long as a node exists (``versions``,
    the memo of paths ``covers`` left out) key it by ``shared`` of its *client* path, the
    ``str`` the cache keys the node by too. Under a namespace, keyed by the stored path
    instead, every node cost a second path string and a second entry in the interpreter's
    table of interned strings (about 1.4 KiB a job on etcd); a stored path is now made when
    it is needed.
    """

    watch: Watch
    root: str
    callback: EventCallback
    #: the caller's path of a stored one (``Namespace.to_client``)
    to_client: Callable[[str], str] = field(default=str)
    #: the stamp reported of each node, by client path: its version, or where a backend
    #: restarts versions when a node is made again, one int that tells the incarnations
    #: apart too (``_notify``'s ``stamp``; ZooKeeper's tree watch folds the creation zxid
    #: in and keeps no map of its own beside this one)
    versions: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # free slot for the backend (e.g. an etcd watch id, a ZooKeeper watcher set)
    backend_state: object = None
    # the caller's ``exclude`` and the children of its ``leaves``, on stored paths
    # strictly below the root
    excluded: Callable[[str], bool] | None = None
    # the caller's ``leaves``, on stored paths: nodes whose children need no watch
    leaf: Callable[[str], bool] | None = None
    # client paths ``covers`` answered False for: the same few paths (running marks)
    # change on every fire. A covered node needs no memo: once reported it is in
    # ``versions``, and so, nearly always, is its parent (a memo of every node held
    # another entry per node: 320 bytes a job)
    _left_out: dict[str, None] = field(default_factory=dict)

    def covers(self, stored_path: str) -> bool:
        if self.excluded is None:
            return is_below(stored_path, self.root)
        client_path = self.to_client(stored_path)
        if client_path in self.versions:
            return True  # reported, so it passed; ``exclude`` and ``leaves`` never change
        if client_path in self._left_out:
            return False
        # ``is_below and not excluded_below``, through ``versions``: a job's dozen nodes
        # share their ancestors, so a new node's predicates run for it alone
        if stored_path == self.root:
            return True
        if (
            is_below(stored_path, self.root)
            and self.covers(parent(stored_path))
            and not self.excluded(stored_path)
        ):
            return True
        if len(self._left_out) >= _LEFT_OUT_MEMO:
            self._left_out.clear()  # bounded: paths seen once (sequential nodes) cannot pile up
        self._left_out[shared(client_path)] = None
        return False
