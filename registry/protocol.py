"""The RegistryCenter protocol and its value types, in one module.

Everything above ``registry/`` programs against :class:`RegistryCenter` only; a need that
only one backend could meet becomes a method here, implemented by every backend and
covered by the contract suite (``tests/contract``).
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, runtime_checkable

__all__ = [
    "Characteristic",
    "Check",
    "Create",
    "Delete",
    "Event",
    "EventCallback",
    "EventKind",
    "ListenerCallback",
    "Node",
    "Op",
    "RegistryCenter",
    "SessionState",
    "Set",
    "Watch",
]


@dataclass(frozen=True, slots=True)
class Node:
    """A node's value and its version.

    ``version`` grows with every write of the node while it exists (a node deleted and
    created again may start over) and is what ``Set``/``Delete``/``Check`` compare
    against; "the cache has caught up with my write" is a version comparison.
    ``ephemeral`` tells whether the node lives only as long as the session that created it.
    """

    value: bytes
    version: int
    ephemeral: bool = False


class EventKind(enum.Enum):
    CREATED = "created"
    UPDATED = "updated"
    DELETED = "deleted"


@dataclass(frozen=True, slots=True)
class Event:
    """One change below a watched path. ``value`` is ``None`` for ``DELETED``."""

    kind: EventKind
    path: str
    value: bytes | None
    version: int | None = None


class SessionState(enum.Enum):
    """Session transitions reported to listeners.

    ``SUSPENDED``: the connection dropped, the session may still be alive.
    ``RECONNECTED``: the connection is back and the session (and its ephemerals) intact.
    ``LOST``: the session expired; every ephemeral node of this client is gone.
    ``CONNECTED``: a (new) session is established.
    """

    CONNECTED = "connected"
    SUSPENDED = "suspended"
    LOST = "lost"
    RECONNECTED = "reconnected"


@dataclass(frozen=True, slots=True)
class Create:
    path: str
    value: bytes = b""
    ephemeral: bool = False


@dataclass(frozen=True, slots=True)
class Set:
    path: str
    value: bytes
    version: int | None = None


@dataclass(frozen=True, slots=True)
class Delete:
    """Deletes the node and everything below it; ``version`` checks the node itself."""

    path: str
    version: int | None = None


@dataclass(frozen=True, slots=True)
class Check:
    """Asserts the node exists (and, with ``version``, is at that version)."""

    path: str
    version: int | None = None


Op = Create | Set | Delete | Check
EventCallback = Callable[[Event], None]
ListenerCallback = Callable[[SessionState], None]


class Watch:
    """Handle of a subtree watch; ``cancel()`` stops delivery (idempotent)."""

    def __init__(self, path: str, on_cancel: Callable[[Watch], None]) -> None:
        self.path = path
        self._on_cancel = on_cancel
        self._cancelled = threading.Event()

    @property
    def active(self) -> bool:
        return not self._cancelled.is_set()

    def cancel(self) -> None:
        if not self._cancelled.is_set():
            self._cancelled.set()
            self._on_cancel(self)

    def __repr__(self) -> str:
        return f"Watch({self.path!r}, active={self.active})"


class Characteristic(enum.Enum):
    """What a backend lets its callers rely on, declared by each backend (as tooz's
    ``Characteristics``), so that nothing above the registry asks which backend it is."""

    #: every call waits on a round trip to a server: callers gain by keeping several in
    #: flight, where in-process calls are pure CPU and only take turns on the GIL
    NETWORK = "network"
    #: the registry outlives this process and coordinates the processes of a fleet
    DISTRIBUTED = "distributed"


@runtime_checkable
class RegistryCenter(Protocol):
    """A hierarchical store with sessions, as ZooKeeper and etcd both provide.

    Paths are absolute, without namespace (the client applies it). Values are bytes.
    """

    @property
    def url(self) -> str:
        """The URL this client was opened with, password masked."""
        ...

    @property
    def characteristics(self) -> frozenset[Characteristic]:
        """What this backend lets callers rely on (``Characteristic``)."""
        ...

    @property
    def session_timeout(self) -> float:
        """Seconds after which a silent client's session (and ephemerals) expire."""
        ...

    @property
    def max_txn_ops(self) -> int:
        """The most ops ``transaction`` takes: 128 on every backend unless the URL option
        ``max_txn_ops`` raises it for a server set up to take more."""
        ...

    @property
    def state(self) -> SessionState:
        """The latest session state reported to listeners."""
        ...

    def get(self, path: str) -> bytes | None: ...

    def get_node(self, path: str) -> Node | None: ...

    def exists(self, path: str) -> bool: ...

    def children(self, path: str) -> list[str]:
        """Direct child names in ascending order; ``[]`` when the node is absent."""
        ...

    def read_tree(self, path: str) -> dict[str, Node]:
        """Every node at or below ``path`` (caller paths, ``path`` itself included), ``{}``
        when it is absent; ``read_tree("/")`` leaves out the implicit root.

        Round trips do not grow with the node count: one range read on etcd, one round of
        multiReads per tree level on ZooKeeper, none on memory. A consistent snapshot on etcd
        and memory; on ZooKeeper levels are read one after another, so a node written
        meanwhile may show either value, and one created meanwhile may be missing.
        """
        ...

    def create(self, path: str, value: bytes = b"", *, ephemeral: bool = False) -> None:
        """Create ``path``; missing parents are created persistent and empty.

        Raises ``NodeExistsError`` if present.
        """
        ...

    def create_sequential(self, prefix: str, value: bytes = b"", *, ephemeral: bool = False) -> str:
        """Create ``prefix`` + a 10-digit sequence number unique and increasing under the
        parent of ``prefix``; returns the created path. Used by queue and lock recipes."""
        ...

    def put(self, path: str, value: bytes, *, ephemeral: bool = False) -> None:
        """Create or overwrite. An existing node keeps its lifetime (persistent or the
        session it belongs to); ``ephemeral`` applies when the node is created."""
        ...

    def delete(self, path: str) -> None:
        """Delete ``path`` and everything below it; no error when absent."""
        ...

    def transaction(self, ops: Sequence[Op]) -> None:
        """Apply every op or none; ``TransactionError`` names the failing op.

        Missing parents of ``Create`` ops are created in the same transaction. A path is
        written (Create/Set/Delete) at most once per transaction, and never inside a
        subtree the same transaction deletes (``ValueError`` for either).
        """
        ...

    def transaction_cost(self, ops: Sequence[Op]) -> int:
        """The share of one transaction's room that ``ops`` take on this backend.

        Transactions whose costs sum to at most ``max_txn_ops`` (128 by default) fit ONE
        transaction of the server as they are, parents they create aside: a group commit
        fills its shared transactions by this count. ``len(ops)`` where the server takes the ops as
        they come (ZooKeeper, memory); more where it expands them (etcd)."""
        ...

    def watch(
        self,
        path: str,
        callback: EventCallback,
        *,
        initial: bool = False,
        exclude: Callable[[str], bool] | None = None,
        leaves: Callable[[str], bool] | None = None,
    ) -> Watch:
        """Deliver every change at or below ``path``, in order per node, from now on.

        Established when this returns. With ``initial=True`` the callback first receives
        a ``CREATED`` event for every node already present (parents first). Callbacks run
        on the client's single event thread; one that raises is logged, the watch lives.

        ``exclude`` (a predicate on paths below ``path``) leaves out every node for which
        it holds, and everything below it: no event, and where the backend arms watches
        per node (ZooKeeper) none is armed. It exists so that hot, churning subtrees
        (running marks, written twice per fire by every instance) cost the instances that
        cache a job's subtree nothing.

        ``leaves`` (a predicate on paths at or below ``path``) names nodes the caller knows
        never have children: they are reported, but nothing below them is (as if excluded),
        and where the backend arms watches per node (ZooKeeper) none is armed for their
        children. A job's layout is mostly such nodes, and each would otherwise cost a
        children read and a child watch.
        """
        ...

    def flush_events(self, timeout: float = 5.0) -> bool:
        """Wait until every event notified so far has reached its callback (False on
        timeout). Lets a cache say it holds the initial state, and tests show absence."""
        ...

    def lock(self, path: str, timeout: float | None = None) -> AbstractContextManager[None]:
        """A mutual-exclusion lock across every client; freed when the holder's session
        ends. Raises ``LockTimeout`` when not acquired within ``timeout`` seconds."""
        ...

    def add_listener(self, callback: ListenerCallback) -> None: ...

    def remove_listener(self, callback: ListenerCallback) -> None: ...

    def server_time(self) -> float:
        """The registry's clock as a UNIX timestamp (for clock-skew checks)."""
        ...

    def close(self) -> None:
        """End the session: its ephemeral nodes vanish at once."""
        ...

    def __enter__(self) -> RegistryCenter: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...
