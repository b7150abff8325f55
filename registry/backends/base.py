"""What every backend shares: argument checks, the namespace, event and listener threads,
and the watch mirror that turns raw notifications into exactly-once, in-order events.

A backend subclasses :class:`BaseRegistry` and implements the ``_``-prefixed primitives on
*stored* paths (namespace applied). Invariants kept here, so that they hold identically on
every backend:

- callers only ever see their own paths (the namespace is stripped from events and errors);
- values are bytes of at most ``MAX_VALUE_BYTES``; transactions hold at most
  ``MAX_TXN_OPS`` ops and ``MAX_TXN_BYTES`` of values, and write a path at most once;
- each watch keeps the stamp (version) of the nodes it has reported, so a duplicate or
  stale notification is dropped and a resynchronisation after a gap emits exactly the
  difference;
- watch callbacks run in order on one event thread per client, listeners on another, so a
  slow listener never stalls event delivery or the backend's own I/O thread.
"""

from __future__ import annotations

import abc
import functools
import logging
import math
import threading
from collections.abc import Callable, Container, Mapping, Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import TypeVar

from registry.backends.dispatcher import Dispatcher
from registry.backends.op_failures import TxnOpFailed, op_failed
from registry.backends.watch_registration import WatchRegistration, below_leaves, depth
from registry.call_stats import CallStats
from registry.errors import (
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    RegistryError,
    TransactionError,
)
from registry.paths import Namespace, ancestors, shared, validate_path
from registry.protocol import (
    Characteristic,
    Check,
    Create,
    Delete,
    Event,
    EventCallback,
    EventKind,
    ListenerCallback,
    Node,
    Op,
    SessionState,
    Set,
    Watch,
)
from registry.shared_values import shared_number
from registry.url import DEFAULT_MAX_TXN_OPS, RegistryURL

__all__ = [
    "MAX_TXN_BYTES",
    "MAX_TXN_OPS",
    "MAX_VALUE_BYTES",
    "BaseRegistry",
]

log = logging.getLogger("registry")
_T = TypeVar("_T")
#: what a write or delete of "/" is told, by every way in (``_stored_writable``, ``_check_ops``)
_ROOT_UNWRITABLE = "the root path '/' cannot be written or deleted"

# One limit for every backend, inside the strictest server default (ZooKeeper's 1 MiB
# request, etcd's 128 ops and 1.5 MiB request), so that the same call succeeds or fails
# the same way everywhere. The ops of a transaction may go above MAX_TXN_OPS only where the
# URL says so (``max_txn_ops``, for a server set up to take more), and then on every backend.
MAX_VALUE_BYTES = 1_000_000
MAX_TXN_OPS = DEFAULT_MAX_TXN_OPS
MAX_TXN_BYTES = 1_000_000


def _moved(op: Create | Set | Delete, path: str) -> Create | Set | Delete:
    """``op`` at ``path``: built directly, as ``dataclasses.replace`` costs several times
    more and every op of every fire's transaction passes here."""
    if isinstance(op, Create):
        return Create(path, op.value, op.ephemeral)
    if isinstance(op, Set):
        return Set(path, op.value, op.version)
    return Delete(path, op.version)


class BaseRegistry(abc.ABC):
    """Template for backends: public methods check and translate, primitives do the I/O."""

    backend_name = "base"
    #: the URL query options this backend takes (documented in its class docstring)
    url_options: frozenset[str] = frozenset({"session_timeout", "connect_timeout", "max_txn_ops"})
    #: what callers may rely on (``registry.protocol.Characteristic``); a server's by default
    characteristics: frozenset[Characteristic] = frozenset(
        {Characteristic.NETWORK, Characteristic.DISTRIBUTED}
    )

    def __init__(self, parsed: RegistryURL) -> None:
        self._parsed = parsed
        self._ns = Namespace(parsed.namespace)
        tag = f"{self.backend_name}-{id(self):x}"
        self._events = Dispatcher(f"registry-events-{tag}")
        self._session_events = Dispatcher(f"registry-session-{tag}")
        self._listeners: list[ListenerCallback] = []
        self._listeners_lock = threading.Lock()
        self._state = SessionState.CONNECTED
        self._state_lock = threading.Lock()
        #: replaced, never changed in place (under the lock): readers take it without one
        self._watches: tuple[WatchRegistration, ...] = ()
        self._watches_lock = threading.Lock()
        self._closed = False
        #: round trips and errors by operation (registry/call_stats.py)
        self.call_stats = CallStats()

    # -- identity ---------------------------------------------------------------------
    @property
    def url(self) -> str:
        return self._parsed.masked()

    @property
    def session_timeout(self) -> float:
        return self._parsed.session_timeout

    @property
    def connect_timeout(self) -> float:
        return self._parsed.connect_timeout

    @property
    def max_txn_ops(self) -> int:
        return self._parsed.max_txn_ops

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def closed(self) -> bool:
        return self._closed

    def session_deadline(self) -> float:
        """The ``time.monotonic()`` until which this client's session is known to hold,
        from the answers the server has given it: its ephemeral nodes are still there and
        no other client can have been handed what they fence. Past it the session may
        have expired though every call still succeeds (an answer held on its way here
        arrives after the server gave the session up). ``inf`` on a backend whose answers
        cannot come late (in-process)."""
        return math.inf

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url} state={self._state.value}>"

    # -- key-value --------------------------------------------------------------------
    def get(self, path: str) -> bytes | None:
        node = self.get_node(path)
        return None if node is None else node.value

    def get_node(self, path: str) -> Node | None:
        return self._call(self._get_node, self._stored(path))

    def exists(self, path: str) -> bool:
        stored = self._stored(path)
        if path == "/":
            return True
        return self._call(self._exists, stored)

    def children(self, path: str) -> list[str]:
        return sorted(self._call(self._children, self._stored(path)))

    def read_tree(self, path: str) -> dict[str, Node]:
        nodes = self._call(self._read_tree, self._stored(path))
        tree = {self._ns.to_client(stored): node for stored, node in nodes.items()}
        tree.pop("/", None)  # the implicit root (under a namespace, the namespace's own node)
        return tree

    def create(self, path: str, value: bytes = b"", *, ephemeral: bool = False) -> None:
        stored = self._stored_writable(path)
        self._call(self._create, stored, _check_value(path, value), ephemeral)

    def create_sequential(self, prefix: str, value: bytes = b"", *, ephemeral: bool = False) -> str:
        stored = self._stored_writable(prefix)
        created = self._call(self._create_sequential, stored, _check_value(prefix, value), ephemeral)
        return self._ns.to_client(created)

    def put(self, path: str, value: bytes, *, ephemeral: bool = False) -> None:
        stored = self._stored_writable(path)
        self._call(self._put, stored, _check_value(path, value), ephemeral)

    def delete(self, path: str) -> None:
        stored = self._stored_writable(path)
        self._call(self._delete, stored)

    def transaction_cost(self, ops: Sequence[Op]) -> int:
        return len(ops)

    def transaction(self, ops: Sequence[Op]) -> None:
        ops = list(ops)
        stored_ops = self._check_ops(ops)
        if not stored_ops:
            return
        try:
            self._call(self._transaction, stored_ops)
        except TxnOpFailed as failed:
            raise op_failed(ops, failed) from None

    #: True where ``transactions`` sends its transactions in ONE request (etcd's nested
    #: transactions): the group commit then nests several joined transactions in each
    #: request instead of sending one (``registry.recipes.batch``)
    separate_transactions = False

    def transactions(self, groups: Sequence[Sequence[Op]]) -> list[BaseException | None]:
        """Apply each of ``groups`` as a transaction of its own (each all-or-nothing, as
        ``transaction``; independent of the others, which may be applied in any order),
        and return each one's outcome: None once applied, else the error that refused it
        (or left its outcome unknown). Here one request per group; a backend that sets
        ``separate_transactions`` sends them together, and raises when that request's
        outcome is unknown (for every group)."""
        outcomes: list[BaseException | None] = []
        for group in groups:
            try:
                self.transaction(group)
            except Exception as exc:
                outcomes.append(exc)
            else:
                outcomes.append(None)
        return outcomes

    # -- watches ----------------------------------------------------------------------
    def watch(
        self,
        path: str,
        callback: EventCallback,
        *,
        initial: bool = False,
        exclude: Callable[[str], bool] | None = None,
        leaves: Callable[[str], bool] | None = None,
    ) -> Watch:
        stored = self._stored(path)
        if not callable(callback):
            raise ValueError("watch callback must be callable")
        if exclude is not None and not callable(exclude):
            raise ValueError("watch exclude must be a predicate on paths (callable) or None")
        if leaves is not None and not callable(leaves):
            raise ValueError("watch leaves must be a predicate on paths (callable) or None")
        watch = Watch(path, self._cancel_watch)
        excluded = None if exclude is None else self._on_client_paths(exclude, "exclude", "the node is included")
        leaf = None if leaves is None else self._on_client_paths(leaves, "leaves", "its children are followed")
        registration = WatchRegistration(
            watch=watch,
            root=stored,
            callback=callback,
            to_client=self._ns.to_client,
            excluded=excluded if leaf is None else below_leaves(excluded, leaf),
            leaf=leaf,
        )
        with self._watches_lock:
            self._watches = (*self._watches, registration)
        try:
            self._call(self._start_watch, registration, initial)
        except BaseException:
            with self._watches_lock:
                self._watches = tuple(r for r in self._watches if r is not registration)
            raise
        return watch

    def _on_client_paths(
        self, predicate: Callable[[str], bool], name: str, otherwise: str
    ) -> Callable[[str], bool]:
        """The watch's ``name`` predicate (on client paths) on stored paths. Where it raises
        it answers False, and the log says ``otherwise``: what that answer means."""
        to_client = self._ns.to_client

        def on_stored(stored: str) -> bool:
            try:
                return bool(predicate(to_client(stored)))
            except Exception:
                # a predicate that raises must not wedge the backend's watch thread
                log.exception("watch %s predicate raised on %s; %s", name, stored, otherwise)
                return False

        return on_stored

    def _cancel_watch(self, watch: Watch) -> None:
        with self._watches_lock:
            found = [r for r in self._watches if r.watch is watch]
            self._watches = tuple(r for r in self._watches if r.watch is not watch)
        for registration in found:
            try:
                self._stop_watch(registration)
            except Exception:
                log.debug("stopping watch %s failed", watch.path, exc_info=True)

    def _active_watches(self) -> tuple[WatchRegistration, ...]:
        return self._watches  # every change of a watched store asks: no lock, no copy

    def _notify(
        self,
        registration: WatchRegistration,
        kind: EventKind,
        stored_path: str,
        node: Node | None,
        stamp: int | None = None,
        *,
        covered: bool = False,
    ) -> None:
        """Report one raw change; duplicates and stale repeats are dropped here: a change
        whose ``stamp`` (default: the node's version) is the one reported last. ``covered``:
        the caller has just seen ``registration.covers(stored_path)`` hold (a new node's
        first check walks its parents and the watch's predicates: once is enough)."""
        if not covered and not registration.covers(stored_path):
            return
        path = registration.to_client(stored_path)
        with registration.lock:
            known = registration.versions.get(path)
            if kind is EventKind.DELETED:
                if known is None:
                    return
                del registration.versions[path]
                event = Event(EventKind.DELETED, path, None, None)
            else:
                assert node is not None
                if stamp is None:
                    stamp = node.version
                if known == stamp:
                    return
                path = shared(path)
                registration.versions[path] = shared_number(stamp)
                real_kind = EventKind.CREATED if known is None else EventKind.UPDATED
                event = Event(real_kind, path, node.value, node.version)
            self._deliver(registration, [event])

    def _resync(
        self,
        registration: WatchRegistration,
        snapshot: Mapping[str, Node],
        *,
        emit: bool = True,
        stamps: Mapping[str, int] | None = None,
    ) -> None:
        """Replace a watch's view by ``snapshot`` (stored paths), emitting the difference;
        ``stamps`` by stored path where a node's is not its version (``_notify``).

        Used for the initial state (``emit`` as the caller asked) and after any gap in
        notifications (reconnect, new session, compaction).
        """
        to_client = registration.to_client
        with registration.lock:
            old = registration.versions
            # client path -> stored path, of the nodes the watch covers
            fresh = {shared(to_client(p)): p for p in snapshot if registration.covers(p)}

            def stamp_of(stored: str) -> int:
                return snapshot[stored].version if stamps is None else stamps[stored]

            events: list[Event] = []
            gone = sorted((p for p in old if p not in fresh), key=lambda p: (-depth(p), p))
            for path in gone:
                events.append(Event(EventKind.DELETED, path, None, None))
            for path in sorted(fresh, key=lambda p: (depth(p), p)):
                stored = fresh[path]
                known = old.get(path)
                if known == stamp_of(stored):
                    continue
                node = snapshot[stored]
                kind = EventKind.CREATED if known is None else EventKind.UPDATED
                events.append(Event(kind, path, node.value, node.version))
            registration.versions = {p: shared_number(stamp_of(stored)) for p, stored in fresh.items()}
            if emit and events:
                self._deliver(registration, events)

    def _deliver(self, registration: WatchRegistration, events: list[Event]) -> None:
        watch = registration.watch
        callback = registration.callback

        def run() -> None:
            for event in events:
                if not watch.active:
                    return
                try:
                    callback(event)
                except Exception:
                    log.exception("watch callback for %s raised on %s; watch continues", watch.path, event)

        self._events.submit(run)

    def flush_events(self, timeout: float = 5.0) -> bool:
        """Wait until every event notified so far has been delivered."""
        return self._events.flush(timeout)

    # -- session ----------------------------------------------------------------------
    def add_listener(self, callback: ListenerCallback) -> None:
        if not callable(callback):
            raise ValueError("listener must be callable")
        with self._listeners_lock:
            self._listeners.append(callback)

    def remove_listener(self, callback: ListenerCallback) -> None:
        with self._listeners_lock:
            if callback in self._listeners:
                self._listeners.remove(callback)

    def _set_state(self, state: SessionState) -> None:
        """Record a session transition and tell listeners (on their own thread)."""
        with self._state_lock:
            if state is self._state and state is not SessionState.LOST:
                return
            self._state = state
        log.info("registry %s: session %s", self.url, state.value)
        with self._listeners_lock:
            listeners = list(self._listeners)
        for listener in listeners:
            self._session_events.submit(functools.partial(listener, state))

    # -- locks ------------------------------------------------------------------------
    def lock(self, path: str, timeout: float | None = None) -> AbstractContextManager[None]:
        from registry.recipes.lock import Lock

        validate_path(path)
        if timeout is not None and timeout < 0:
            raise ValueError(f"lock timeout must be >= 0 seconds, got {timeout!r}")
        return Lock(self, path).hold(timeout)

    # -- lifecycle --------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for registration in self._active_watches():
            registration.watch.cancel()
        try:
            self._close()
        finally:
            self._events.stop()
            self._session_events.stop()

    def __enter__(self) -> BaseRegistry:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- helpers for subclasses -------------------------------------------------------
    def _stored(self, path: str) -> str:
        if self._closed:
            raise RegistryError(f"registry client {self.url} is closed")
        # validated and joined per op, remembered nowhere: a memo of every path a fire
        # names saves a few substring scans per op and holds an entry per path for good
        return self._ns.to_server(path)

    def _stored_writable(self, path: str) -> str:
        stored = self._stored(path)
        if path == "/":
            raise ValueError(_ROOT_UNWRITABLE)
        return stored

    def _client_path(self, stored: str) -> str:
        return self._ns.to_client(stored)

    def _call(self, fn: Callable[..., _T], *args: object) -> _T:
        """Run a primitive, rewriting stored paths in node errors back to caller paths;
        counted in ``call_stats`` under the operation's name (``_get_node`` -> ``get_node``)."""
        operation = fn.__name__.lstrip("_")
        try:
            result = fn(*args)
        except (NodeExistsError, NoNodeError) as exc:
            self.call_stats.record(operation, type(exc).__name__)
            raise type(exc)(self._ns.to_client(exc.path)) from None
        except BadVersionError as exc:
            self.call_stats.record(operation, "BadVersionError")
            raise BadVersionError(self._ns.to_client(exc.path), exc.expected) from None
        except TxnOpFailed:
            self.call_stats.record(operation, "TransactionError")  # what the caller gets
            raise
        except Exception as exc:
            self.call_stats.record(operation, type(exc).__name__)
            raise
        self.call_stats.record(operation)
        return result

    def _check_groups(
        self, groups: Sequence[Sequence[Op]]
    ) -> tuple[list[BaseException | None], list[tuple[int, list[Op], list[Op]]]]:
        """``_check_ops`` of each of ``transactions``' groups: the outcome of each group
        refused here, and ``(index, caller's ops, stored ops)`` of each one to send.
        Raises ``ValueError`` when one group writes inside a subtree another deletes: one
        request cannot hold both (etcd refuses it whole), so the caller sends them apart."""
        outcomes: list[BaseException | None] = [None] * len(groups)
        checked: list[tuple[int, list[Op], list[Op]]] = []
        for index, group in enumerate(groups):
            ops = list(group)
            try:
                stored = self._check_ops(ops)
            except (TransactionError, ValueError) as exc:
                outcomes[index] = exc
                continue
            if stored:
                checked.append((index, ops, stored))
        every = [op for _, ops, _ in checked for op in ops]
        deletes = {op.path: index for index, op in enumerate(every) if isinstance(op, Delete)}
        if deletes and any(isinstance(op, (Create, Set)) for op in every):
            _refuse_writes_below_deletes(every, deletes)
        return outcomes, checked

    def _check_ops(self, ops: list[Op]) -> list[Op]:
        if len(ops) > self._parsed.max_txn_ops:
            raise TransactionError(
                f"transaction has {len(ops)} ops; at most {self._parsed.max_txn_ops} are allowed"
                " (URL option max_txn_ops)"
            )
        if ops and self._closed:
            raise RegistryError(f"registry client {self.url} is closed")
        to_server = self._ns.to_server
        stored_ops: list[Op] = []
        written: dict[str, int] = {}
        deletes: dict[str, int] = {}
        total = 0
        for index, op in enumerate(ops):
            if isinstance(op, Check):
                stored_path = to_server(op.path)
                stored_ops.append(op if stored_path == op.path else Check(stored_path, op.version))
                continue
            if not isinstance(op, (Create, Set, Delete)):
                raise ValueError(f"transaction op {index} is not a registry op: {op!r}")
            if op.path == "/":  # _stored_writable's check, inline (closed: checked above)
                raise ValueError(_ROOT_UNWRITABLE)
            stored = to_server(op.path)
            if op.path in written:
                raise ValueError(
                    f"transaction op {index} writes {op.path!r} again (op {written[op.path]} already does)"
                )
            written[op.path] = index
            if isinstance(op, Delete):
                deletes[op.path] = index
            else:
                value = op.value
                # bytes (every op shardjob makes) need no copy to be measured
                total += (
                    len(value)
                    if type(value) is bytes and len(value) <= MAX_VALUE_BYTES
                    else len(_check_value(op.path, value))
                )
            stored_ops.append(op if stored == op.path else _moved(op, stored))
        if total > MAX_TXN_BYTES:
            raise TransactionError(
                f"transaction carries {total} bytes of values; at most {MAX_TXN_BYTES} are allowed"
            )
        if deletes and len(deletes) < len(written):
            _refuse_writes_below_deletes(ops, deletes)
        return stored_ops

    # -- primitives (stored paths) ----------------------------------------------------
    @abc.abstractmethod
    def _get_node(self, path: str) -> Node | None: ...

    def _exists(self, path: str) -> bool:
        return self._get_node(path) is not None

    @abc.abstractmethod
    def _children(self, path: str) -> list[str]: ...

    @abc.abstractmethod
    def _read_tree(self, path: str) -> dict[str, Node]:
        """Stored path -> node for ``path`` and everything below it."""

    @abc.abstractmethod
    def _create(self, path: str, value: bytes, ephemeral: bool) -> None: ...

    @abc.abstractmethod
    def _create_sequential(self, prefix: str, value: bytes, ephemeral: bool) -> str: ...

    @abc.abstractmethod
    def _put(self, path: str, value: bytes, ephemeral: bool) -> None: ...

    @abc.abstractmethod
    def _delete(self, path: str) -> None: ...

    @abc.abstractmethod
    def _transaction(self, ops: list[Op]) -> None:
        """Apply ``ops`` atomically or raise ``TxnOpFailed`` naming the first failing op."""

    @abc.abstractmethod
    def _start_watch(self, registration: WatchRegistration, initial: bool) -> None:
        """Establish the watch, then call ``_resync(registration, snapshot, emit=initial)``
        with the nodes present at that moment, then ``_notify`` for every later change."""

    @abc.abstractmethod
    def _stop_watch(self, registration: WatchRegistration) -> None: ...

    @abc.abstractmethod
    def server_time(self) -> float: ...

    @abc.abstractmethod
    def _close(self) -> None: ...


def _refuse_writes_below_deletes(ops: list[Op], deletes: dict[str, int]) -> None:
    """No transaction writes inside a subtree it deletes, in either order: etcd cannot (a
    put inside a range the same transaction deletes is a "duplicate key" there), so no
    backend does. A write lies strictly inside a deleted subtree iff one of its proper
    ancestors is a deleted path: a look-up per ancestor, not a comparison with every delete.

    Trick: an ancestor that is a deleted path is as long as one, so only the prefixes at
    the deleted paths' lengths need a look-up, and only where a "/" ends them. A group
    commit's removals are alike (a few lengths), so a write costs a character compare or
    two where it cost a slice per ancestor; with more lengths than the write has
    ancestors, its ancestors are walked instead. Shortest first: the outermost is named."""
    lengths = sorted({len(path) for path in deletes})
    for index, op in enumerate(ops):
        if not isinstance(op, (Create, Set)):
            continue  # a Create also writes its missing parents: ancestors of its path too
        path = op.path
        root = _deleted_ancestor(path, lengths, deletes)
        if root is not None:
            raise ValueError(
                f"transaction op {index} writes {path!r} inside the subtree that op "
                f"{deletes[root]} deletes ({root!r}); split it into two transactions"
            )


def _deleted_ancestor(path: str, lengths: list[int], deletes: Container[str]) -> str | None:
    """The outermost proper ancestor of ``path`` in ``deletes``, whose paths have the
    ``lengths`` (ascending), or None (``_refuse_writes_below_deletes``)."""
    if len(lengths) > path.count("/"):
        return next((a for a in ancestors(path) if a in deletes), None)
    for length in lengths:
        if length >= len(path):
            return None
        if path[length] == "/" and path[:length] in deletes:
            return path[:length]
    return None


def _check_value(path: str, value: object) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise ValueError(f"value for {path!r} must be bytes, got {type(value).__name__}")
    data = bytes(value)
    if len(data) > MAX_VALUE_BYTES:
        raise ValueError(
            f"value for {path!r} is {len(data)} bytes; the limit is {MAX_VALUE_BYTES} on every backend"
        )
    return data
