"""``memory://`` — an in-process registry with real sessions, for the demo and fast tests.

Every client in the process that names the same store shares it, each with its own
session. It keeps the same semantics as the server backends (the contract suite runs on
it unchanged), including the failures, so that code above can be tested against them:

- ``MemoryStore.cut_link(name)`` / ``restore_link(name)`` sever the clients that connected
  with ``?link=name`` (SUSPENDED; their session expires ``session_timeout`` later, as a
  partitioned ZooKeeper or etcd client's would, and they learn it — LOST — on restore);
- ``MemoryStore.outage()`` / ``recover()`` take the whole "server" down and back (sessions
  survive, as they do across a ZooKeeper or etcd restart);
- ``MemoryStore.expire(client)`` expires one session now.

Invariants: one store lock orders every write, so versions (a store-wide revision) only
grow and each watch sees the changes of a node in order; a disconnected client neither
reads nor writes and receives nothing until it reconnects and resynchronises.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from registry.backends.base import BaseRegistry
from registry.backends.op_failures import OpFailure, TxnOpFailed, raise_first_failed_op
from registry.backends.watch_registration import WatchRegistration
from registry.children import ChildIndex
from registry.errors import NodeExistsError, RegistryConnectionError, SessionLostError
from registry.paths import ancestors, basename, is_below, parent, shared
from registry.protocol import Characteristic, Create, Delete, EventKind, Node, Op, SessionState, Set
from registry.shared_values import shared_value
from registry.url import RegistryURL

__all__ = ["MemoryRegistry", "MemoryStore"]


#: a stored node, in the smallest shape that holds it: an ephemeral node is (value,
#: version, owning session); a persistent one (value, version), or its bare version when
#: its value is empty (seven of a job's thirteen nodes: the parents), as the cache keeps
#: it. Plain tuples and ints, not objects: they drop out of the garbage collector's lists,
#: and a scheduler's store holds a dozen nodes per job (an object each made every full
#: collection walk them, a pause that landed on fires); the bare version spares a tuple's
#: 64 bytes per parent; a value equal to other nodes' is one object (``shared_value``)
_Entry = int | tuple[bytes, int] | tuple[bytes, int, int]
#: a node as a transaction sees it: (value, version — None when written earlier in the
#: same transaction, owning session or None)
_Staged = tuple[bytes, int | None, int | None]


def _entry(value: bytes, version: int, owner: int | None) -> _Entry:
    value = shared_value(value)
    if owner is not None:
        return (value, version, owner)
    return (value, version) if value else version


def _version_of(entry: _Entry) -> int:
    return entry if isinstance(entry, int) else entry[1]


def _owner_of(entry: _Entry) -> int | None:
    return entry[2] if isinstance(entry, tuple) and len(entry) == 3 else None


def _staged(entry: _Entry) -> _Staged:
    if isinstance(entry, int):
        return (b"", entry, None)
    return (entry[0], entry[1], _owner_of(entry))


def _node_of(entry: _Entry) -> Node:
    if isinstance(entry, int):
        return Node(b"", entry, False)
    return Node(entry[0], entry[1], len(entry) == 3)


@dataclass(eq=False)
class _Session:
    id: int
    timeout: float
    ephemerals: set[str] = field(default_factory=set)
    alive: bool = True
    expires_at: float | None = None  # set while its client is cut off


_ABSENT = object()


class MemoryStore:
    """A named in-process store; see the module docstring for fault injection."""

    _stores: dict[str, MemoryStore] = {}
    _stores_lock = threading.Lock()

    @classmethod
    def named(cls, name: str) -> MemoryStore:
        with cls._stores_lock:
            store = cls._stores.get(name)
            if store is None:
                store = cls._stores[name] = MemoryStore(name)
            return store

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._nodes: dict[str, _Entry] = {}
        #: children by parent, only for nodes that have some
        self._kids = ChildIndex()
        self._revision = 0
        self._sequences: dict[str, int] = {}
        self._session_ids = itertools.count(1)
        self._sessions: dict[int, _Session] = {}
        self._clients: list[MemoryRegistry] = []
        self._down = False
        self._cut_links: set[str] = set()
        self._reaper: threading.Thread | None = None

    # -- fault injection ---------------------------------------------------------------
    def cut_link(self, link: str) -> None:
        """Sever every client connected with ``?link=<link>`` (and refuse new ones)."""
        if not link:
            raise ValueError("link name must not be empty")
        with self._lock:
            self._cut_links.add(link)
        self._connectivity_changed()

    def restore_link(self, link: str) -> None:
        with self._lock:
            self._cut_links.discard(link)
        self._connectivity_changed()

    def outage(self) -> None:
        """Take the store down: every client is SUSPENDED; sessions do not expire meanwhile."""
        with self._lock:
            self._down = True
        self._connectivity_changed()

    def recover(self) -> None:
        with self._lock:
            self._down = False
        self._connectivity_changed()

    def expire(self, client: MemoryRegistry) -> None:
        """Expire ``client``'s session now, as a server would after its timeout."""
        with self._lock:
            session = self._sessions.get(client._session_id)
            if session is not None:
                self._end_session(session)
        client._connectivity_changed()

    # -- sessions ----------------------------------------------------------------------
    def reachable(self, link: str) -> bool:
        return not self._down and link not in self._cut_links

    def _open_session(self, client: MemoryRegistry, timeout: float) -> int:
        with self._lock:
            session = _Session(next(self._session_ids), timeout)
            self._sessions[session.id] = session
            if client not in self._clients:
                self._clients.append(client)
            return session.id

    def _session_alive(self, session_id: int) -> bool:
        with self._lock:
            session = self._sessions.get(session_id)
            return session is not None and session.alive

    def _close_client(self, client: MemoryRegistry) -> None:
        with self._lock:
            session = self._sessions.get(client._session_id)
            if session is not None:
                self._end_session(session)
            if client in self._clients:
                self._clients.remove(client)

    def _end_session(self, session: _Session) -> None:
        session.alive = False
        self._sessions.pop(session.id, None)
        for path in sorted(session.ephemerals, key=lambda p: -p.count("/")):
            if path in self._nodes:
                self._remove_subtree(path)
        session.ephemerals.clear()

    def _connectivity_changed(self) -> None:
        now = time.monotonic()
        with self._lock:
            clients = list(self._clients)
            for client in clients:
                session = self._sessions.get(client._session_id)
                if session is None:
                    continue
                if self.reachable(client._link) or self._down:
                    session.expires_at = None  # an outage does not expire sessions
                elif session.expires_at is None:
                    session.expires_at = now + session.timeout
            self._ensure_reaper()
            self._changed.notify_all()
        for client in clients:
            client._connectivity_changed()

    def _ensure_reaper(self) -> None:
        if self._reaper is None or not self._reaper.is_alive():
            self._reaper = threading.Thread(target=self._reap, name=f"memory-reaper-{self.name}", daemon=True)
            self._reaper.start()

    def _reap(self) -> None:
        """Expire the sessions of clients cut off longer than their timeout."""
        with self._lock:
            while True:
                deadlines = [s.expires_at for s in self._sessions.values() if s.expires_at is not None]
                if not deadlines:
                    self._reaper = None
                    return
                now = time.monotonic()
                for session in list(self._sessions.values()):
                    if session.expires_at is not None and session.expires_at <= now:
                        self._end_session(session)
                pending = [s.expires_at for s in self._sessions.values() if s.expires_at is not None]
                if pending:
                    self._changed.wait(max(0.0, min(pending) - now))

    def wait_reachable(self, link: str, timeout: float) -> bool:
        if self.reachable(link):  # the common case, without the store lock
            return True
        deadline = time.monotonic() + timeout
        with self._lock:
            while not self.reachable(link):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
            return True

    # -- data (callers hold no lock; every method takes the store lock) ----------------
    def get(self, path: str) -> Node | None:
        with self._lock:
            entry = self._nodes.get(path)
            return None if entry is None else _node_of(entry)

    def children(self, path: str) -> list[str]:
        with self._lock:
            return [basename(p) for p in self._kids.of(path)]

    def snapshot(self, root: str) -> dict[str, Node]:
        with self._lock:
            return {p: _node_of(self._nodes[p]) for p in self._subtree(root) if p in self._nodes}

    def create(self, path: str, value: bytes, session_id: int | None) -> None:
        with self._lock:
            if path in self._nodes:
                raise NodeExistsError(path)
            self._require_session(session_id)
            self._make_parents(path)
            self._insert(path, value, session_id)

    def create_sequential(self, prefix: str, value: bytes, session_id: int | None) -> str:
        with self._lock:
            owner = parent(prefix)
            number = self._sequences.get(owner, 0)
            self._sequences[owner] = number + 1
            path = f"{prefix}{number:010d}"
            self.create(path, value, session_id)
            return path

    def put(self, path: str, value: bytes, session_id: int | None) -> None:
        with self._lock:
            entry = self._nodes.get(path)
            if entry is None:
                self._require_session(session_id)
                self._make_parents(path)
                self._insert(path, value, session_id)
            else:
                self._update(path, entry, value)

    def delete(self, path: str) -> None:
        with self._lock:
            if path in self._nodes:
                self._remove_subtree(path)

    def transaction(self, ops: list[Op], session_id: int | None) -> None:
        with self._lock:
            for op in ops:
                if isinstance(op, Create) and op.ephemeral:
                    self._require_session(session_id)
                    break
            if self._transaction_in_place(ops, session_id):
                return
            staged: dict[str, object] = {}  # path -> _Staged or _ABSENT

            def current(path: str) -> object:
                if path in staged:
                    return staged[path]
                entry = self._nodes.get(path)
                return _ABSENT if entry is None else _staged(entry)

            def below(path: str) -> list[str]:
                found = [p for p in self._subtree(path) if current(p) is not _ABSENT]
                found += [p for p, v in staged.items() if v is not _ABSENT and is_below(p, path)]
                return sorted(set(found))

            for index, op in enumerate(ops):
                node = current(op.path)
                if isinstance(op, Create):
                    if node is not _ABSENT:
                        raise TxnOpFailed(index, OpFailure.EXISTS)
                    for ancestor in ancestors(op.path):
                        if current(ancestor) is _ABSENT:
                            staged[ancestor] = (b"", None, None)
                    staged[op.path] = (op.value, None, session_id if op.ephemeral else None)
                    continue
                if node is _ABSENT:
                    raise TxnOpFailed(index, OpFailure.NO_NODE)
                if op.version is not None and node[1] != op.version:  # type: ignore[index]
                    raise TxnOpFailed(index, OpFailure.BAD_VERSION)
                if isinstance(op, Set):
                    staged[op.path] = (op.value, None, node[2])  # type: ignore[index]
                elif isinstance(op, Delete):
                    for path in below(op.path):
                        staged[path] = _ABSENT
            # every op holds: apply in op order, parents before children
            for op in ops:
                if isinstance(op, Create):
                    self._make_parents(op.path)
                    self._insert(op.path, op.value, session_id if op.ephemeral else None)
                elif isinstance(op, Set):
                    self._update(op.path, self._nodes[op.path], op.value)
                elif isinstance(op, Delete) and op.path in self._nodes:
                    self._remove_subtree(op.path)

    # -- internals (store lock held) ---------------------------------------------------
    def _transaction_in_place(self, ops: list[Op], session_id: int | None) -> bool:
        """The common shape — no deletes, each path once, every created node's parent
        there already — where no op can see another's effect: check each against the store
        as it is, then apply. False (nothing done) for any other shape, which the staged
        path handles. A running mark per fire takes this way: staging cost it a third."""
        paths = {op.path for op in ops}
        if len(paths) != len(ops):
            return False
        nodes = self._nodes
        for op in ops:
            if isinstance(op, Delete) or (
                isinstance(op, Create) and (owner := parent(op.path)) != "/" and owner not in nodes
            ):
                return False
        raise_first_failed_op(ops, lambda path: None if (entry := nodes.get(path)) is None else _version_of(entry))
        for op in ops:
            if isinstance(op, Create):
                self._insert(op.path, op.value, session_id if op.ephemeral else None)
            elif isinstance(op, Set):
                self._update(op.path, nodes[op.path], op.value)
        return True

    def _subtree(self, path: str) -> Iterator[str]:
        yield path
        for child in self._kids.of(path):
            yield from self._subtree(child)

    def _make_parents(self, path: str) -> None:
        for ancestor in ancestors(path):
            if ancestor not in self._nodes:
                self._insert(ancestor, b"", None)

    def _next_version(self) -> int:
        self._revision += 1
        return self._revision

    def _require_session(self, session_id: int | None) -> None:
        """An ephemeral write by an expired session fails, as on a server."""
        if session_id is not None and session_id not in self._sessions:
            raise SessionLostError(f"session {session_id} of memory store {self.name!r} expired")

    def _insert(self, path: str, value: bytes, session_id: int | None) -> None:
        session = self._sessions.get(session_id) if session_id is not None else None
        entry = _entry(value, self._next_version(), session.id if session else None)
        path = shared(path)
        self._nodes[path] = entry
        if path != "/":
            self._kids.add(parent(path), path)
        if session is not None:
            session.ephemerals.add(path)
        self._broadcast(EventKind.CREATED, path, _node_of(entry))

    def _update(self, path: str, entry: _Entry, value: bytes) -> None:
        entry = self._nodes[path] = _entry(value, self._next_version(), _owner_of(entry))
        self._broadcast(EventKind.UPDATED, path, _node_of(entry))

    def _remove_subtree(self, path: str) -> None:
        for child in sorted(self._kids.of(path)):
            self._remove_subtree(child)
        entry = self._nodes.pop(path, None)
        self._kids.pop(path)
        self._kids.discard(parent(path), path)
        if entry is None:
            return
        owner = _owner_of(entry)
        if owner is not None and owner in self._sessions:
            self._sessions[owner].ephemerals.discard(path)
        self._broadcast(EventKind.DELETED, path, None)

    def _broadcast(self, kind: EventKind, path: str, node: Node | None) -> None:
        for client in self._clients:
            if self.reachable(client._link):
                client._store_changed(kind, path, node)


class MemoryRegistry(BaseRegistry):
    """A client of an in-process store: ``memory://[store][/namespace][?options]``.

    URL options: ``session_timeout`` (s, default 10: how long a cut-off client keeps its
    session), ``connect_timeout`` (s, default 5), ``max_txn_ops`` (default 128, as on
    every backend), ``link`` (a name whose clients ``MemoryStore.cut_link`` severs
    together: a "network" for fault injection). No hosts, no user or password."""

    backend_name = "memory"
    url_options = frozenset({"session_timeout", "connect_timeout", "max_txn_ops", "link"})
    #: in this process only, and its calls never wait on a network
    characteristics: frozenset[Characteristic] = frozenset()

    def __init__(self, parsed: RegistryURL) -> None:
        super().__init__(parsed)
        self.store = MemoryStore.named(parsed.store)
        self._link = parsed.link
        self._connected = True
        self._transition_lock = threading.Lock()
        if not self.store.wait_reachable(self._link, parsed.connect_timeout):
            self._events.stop()
            self._session_events.stop()
            raise RegistryConnectionError(
                f"memory store {parsed.store!r} unreachable within {parsed.connect_timeout:g}s"
            )
        self._session_id = self.store._open_session(self, parsed.session_timeout)

    # -- connectivity ------------------------------------------------------------------
    def _connectivity_changed(self) -> None:
        """Re-evaluate the link; report SUSPENDED / RECONNECTED / LOST+CONNECTED."""
        if self._closed:
            return
        with self._transition_lock:
            reachable = self.store.reachable(self._link)
            alive = self.store._session_alive(self._session_id)
            if not reachable:
                if self._connected:
                    self._connected = False
                    self._set_state(SessionState.SUSPENDED)
                return
            if alive and self._connected:
                return
            if alive:
                self._connected = True
                self._set_state(SessionState.RECONNECTED)
            else:
                self._set_state(SessionState.LOST)
                self._session_id = self.store._open_session(self, self.session_timeout)
                self._connected = True
                self._set_state(SessionState.CONNECTED)
        for registration in self._active_watches():
            self._resync(registration, self.store.snapshot(registration.root))

    def _online(self) -> None:
        """Wait (up to connect_timeout) for the link, as a real client waits to reconnect."""
        if not self.store.wait_reachable(self._link, self.connect_timeout):
            raise RegistryConnectionError(
                f"memory store {self.store.name!r} unreachable (link {self._link!r} cut or store down)"
            )

    def _owner(self, ephemeral: bool) -> int | None:
        return self._session_id if ephemeral else None

    # -- primitives --------------------------------------------------------------------
    def _get_node(self, path: str) -> Node | None:
        self._online()
        return self.store.get(path)

    def _children(self, path: str) -> list[str]:
        self._online()
        return self.store.children(path)

    def _read_tree(self, path: str) -> dict[str, Node]:
        self._online()
        return self.store.snapshot(path)

    def _create(self, path: str, value: bytes, ephemeral: bool) -> None:
        self._online()
        self.store.create(path, value, self._owner(ephemeral))

    def _create_sequential(self, prefix: str, value: bytes, ephemeral: bool) -> str:
        self._online()
        return self.store.create_sequential(prefix, value, self._owner(ephemeral))

    def _put(self, path: str, value: bytes, ephemeral: bool) -> None:
        self._online()
        self.store.put(path, value, self._owner(ephemeral))

    def _delete(self, path: str) -> None:
        self._online()
        self.store.delete(path)

    def _transaction(self, ops: list[Op]) -> None:
        self._online()
        self.store.transaction(ops, self._session_id)

    def _start_watch(self, registration: WatchRegistration, initial: bool) -> None:
        self._online()
        # the store lock orders the snapshot before any later change notification
        with self.store._lock:
            self._resync(registration, self.store.snapshot(registration.root), emit=initial)

    def _stop_watch(self, registration: WatchRegistration) -> None:
        """Nothing to release: cancelled watches are no longer in ``_active_watches``."""

    def _store_changed(self, kind: EventKind, path: str, node: Node | None) -> None:
        for registration in self._active_watches():
            if registration.covers(path):
                self._notify(registration, kind, path, node, covered=True)

    def server_time(self) -> float:
        self._online()
        return time.time()

    def _close(self) -> None:
        self.store._close_client(self)
