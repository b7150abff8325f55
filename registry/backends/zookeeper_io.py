"""How the ZooKeeper backend talks to kazoo: one rule for reads, one for writes, one error map.

Invariants kept here:

- no kazoo exception leaves this module unmapped: every failure becomes a class from
  :mod:`registry.errors` (paths in node errors stay *stored* paths; the base class rewrites
  them), and no message names more than the hosts (never a password);
- idempotent reads are retried (``retrying.call_with_retries``) while the connection is down or drops,
  bounded by ``connect_timeout``;
- a write is sent once, and only while connected (kazoo would otherwise queue it and send
  it whenever the connection returns); when its answer never comes the caller gets
  ``RegistryConnectionError`` saying the outcome is unknown, and nothing repeats it;
- no call blocks forever: kazoo's synchronous API waits without a timeout, so every
  request here goes through ``*_async`` and a deadline;
- kazoo logs through :func:`kazoo_logger`, which blanks the credentials kazoo would
  otherwise print at DEBUG level (the digest ``user:password`` of its Auth packet, the
  session password).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from kazoo.exceptions import (
    BadArgumentsError,
    ConnectionClosedError,
    ConnectionDropped,
    ConnectionLoss,
    KazooException,
    NoAuthError,
    NoChildrenForEphemeralsError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.exceptions import (
    BadVersionError as KzBadVersion,
)
from kazoo.exceptions import (
    NodeExistsError as KzNodeExists,
)
from kazoo.exceptions import (
    NoNodeError as KzNoNode,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.serialization import Auth, Connect
from kazoo.security import OPEN_ACL_UNSAFE

from registry.backends.retrying import call_with_retries
from registry.backends.zookeeper_wire import MultiEncoder, get_children, get_data, send_multi_read
from registry.errors import (
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    RegistryConnectionError,
    RegistryError,
    SessionLostError,
)
from registry.paths import join
from registry.protocol import Node

__all__ = [
    "ROOT_SYSTEM_NODE",
    "NotConnected",
    "ZkIO",
    "is_connection_failure",
    "kazoo_logger",
    "visible_child_paths",
    "visible_children",
]

_T = TypeVar("_T")
_C = TypeVar("_C")

#: ZooKeeper's own subtree under the real root; never shown to callers.
ROOT_SYSTEM_NODE = "zookeeper"
_SYSTEM_PATH = "/" + ROOT_SYSTEM_NODE

# Requests that each carry many nodes' reads or deletes: at most _IN_FLIGHT are sent and
# not yet answered (``ZkIO.windowed``), so a huge level neither floods the connection nor
# holds its whole answer at once.
_IN_FLIGHT = 4
# Subtree reads (``multi_read``) go in multiReads of at most this many nodes. Hazard: a
# multiRead's answer holds every value it read, and nothing bounds it but the node count:
# 250 nodes of this layout are some 100 KB; 250 of ZooKeeper's largest (1 MB) values
# would be 250 MB.
_READ_NODES = 250
# request bytes per multiRead, at most: well under ZooKeeper's jute.maxbuffer (1 MB)
_READ_BYTES = 256 * 1024


class NotConnected(Exception):
    """Raised before a request is sent: the client had no live connection in time."""


_CONNECTION_FAILURES: tuple[type[BaseException], ...] = (
    ConnectionLoss,
    ConnectionDropped,
    OperationTimeoutError,
    KazooTimeoutError,
    NotConnected,
)


def is_connection_failure(exc: BaseException) -> bool:
    """True for failures a reconnect can cure (ConnectionClosedError means closed for good)."""
    if isinstance(exc, ConnectionClosedError):
        return False
    return isinstance(exc, (*_CONNECTION_FAILURES, SessionExpiredError))


class ZkIO:
    """Deadline-bounded requests on one kazoo client.

    ``connected`` mirrors kazoo's connection (set by the backend's state listener) so that
    a caller can wait for it without reaching into kazoo.
    """

    def __init__(
        self,
        client: Any,
        *,
        hosts: str,
        connect_timeout: float,
        session_timeout: float,
        client_path: Callable[[str], str],
    ) -> None:
        self.client = client
        self.hosts = hosts
        self.connect_timeout = connect_timeout
        self.session_timeout = session_timeout
        self._client_path = client_path
        self.connected = _Flag()
        #: stored paths known to exist, that a transaction's re-plan need not read again:
        #: a hint kept by ``zookeeper_txn`` (starting N jobs would otherwise read their
        #: shared parents once per batch). A path leaves it when a tree watch reports it,
        #: since ``watched_existence`` answers for it from then on: what stays is what no
        #: watch follows (a job's ``running`` node), where every parent of every job held
        #: 500 bytes a job
        self.known_parents: set[str] = set()
        #: what this client's tree watches say of a stored path: True (reported), False
        #: (covered, never reported), None (no synced watch covers it); a hint as well,
        #: which the same re-plan consults next (set by the registry)
        self.watched_existence: Callable[[str], bool | None] = lambda path: None
        #: encodes this client's multi ops (a create carries the client's default ACL, as
        #: kazoo's own create would)
        self.encoder = MultiEncoder(client.default_acl or OPEN_ACL_UNSAFE)

    # -- waiting ------------------------------------------------------------------------
    @staticmethod
    def wait(result: Any, deadline: float) -> Any:
        """The value of a kazoo async result, raising its exception or KazooTimeoutError.

        Hazard: the result keeps the exception it raises, whose traceback holds the frames
        it passed (kazoo's ``get``, this one), which hold the result: a cycle, left to the
        garbage collector, for every refused request (every new node's put, a NoNode on a
        read). The trick: raise it without those frames, and without the result here."""
        try:
            return result.get(timeout=max(0.001, deadline - time.monotonic()))
        except BaseException as failure:
            del result
            raise failure.with_traceback(None) from None

    def read_deadline(self) -> float:
        return time.monotonic() + self.connect_timeout

    def wait_answer(self, result: Any) -> Any:
        """``wait`` for one answer, given the read timeout from now."""
        return self.wait(result, self.read_deadline())

    def write_deadline(self) -> float:
        # A request on a connection that died silently fails once kazoo notices (its read
        # timeout is 2/3 of the session timeout); waiting longer than that learns nothing.
        return time.monotonic() + self.connect_timeout + self.session_timeout

    # -- the two call rules -------------------------------------------------------------
    def read(self, path: str, fn: Callable[[float], _T]) -> _T:
        """Run the idempotent read ``fn(deadline)``, retrying it while the connection is down."""
        started = time.monotonic()
        deadline = started + self.connect_timeout

        def attempt() -> _T:
            if not self.connected.wait(deadline - time.monotonic()):
                raise NotConnected()
            return fn(deadline)

        try:
            return call_with_retries(attempt, transient=is_connection_failure, budget=self.connect_timeout)
        except (KazooException, KazooTimeoutError, NotConnected) as exc:
            raise self.map_error(exc, path, action="read") from None

    def write(self, path: str, fn: Callable[[float], _T], *, action: str = "change") -> _T:
        """Run ``fn(deadline)``, which sends writes, once; never while disconnected."""
        if not self.connected.wait(self.connect_timeout):
            raise RegistryConnectionError(
                f"not connected to ZooKeeper at {self.hosts} within {self.connect_timeout:g}s; "
                f"did not {action} {self._client_path(path)}"
            )
        try:
            return fn(self.write_deadline())
        except (KazooException, KazooTimeoutError, NotConnected) as exc:
            raise self.map_error(exc, path, action=action, write=True) from None

    # -- error map ----------------------------------------------------------------------
    def map_error(
        self, exc: BaseException, path: str, *, action: str = "change", write: bool = False
    ) -> RegistryError:
        """The registry error for a kazoo failure on stored ``path``."""
        shown = self._client_path(path)
        if isinstance(exc, KzNodeExists):
            return NodeExistsError(path)
        if isinstance(exc, KzNoNode):
            return NoNodeError(path)
        if isinstance(exc, KzBadVersion):
            return BadVersionError(path)
        if isinstance(exc, NoAuthError):
            return RegistryError(
                f"not authorised to {action} {shown}: its ZooKeeper ACL refuses this identity"
            )
        if isinstance(exc, NoChildrenForEphemeralsError):
            return RegistryError(
                f"cannot {action} {shown}: a parent is an ephemeral node, which takes no children"
            )
        if isinstance(exc, ConnectionClosedError):
            return RegistryConnectionError(f"the ZooKeeper client for {self.hosts} is closed")
        if isinstance(exc, SessionExpiredError):
            return SessionLostError(f"ZooKeeper session expired during {action} of {shown}")
        if isinstance(exc, NotConnected):
            return RegistryConnectionError(
                f"not connected to ZooKeeper at {self.hosts} within {self.connect_timeout:g}s ({action} {shown})"
            )
        if isinstance(exc, _CONNECTION_FAILURES):
            if write:
                return RegistryConnectionError(
                    f"connection to ZooKeeper at {self.hosts} lost during {action} of {shown}; "
                    "the outcome is unknown"
                )
            return RegistryConnectionError(f"ZooKeeper at {self.hosts} did not answer ({action} {shown})")
        if isinstance(exc, BadArgumentsError):
            return RegistryError(f"ZooKeeper refused to {action} {shown}: path or value not allowed")
        return RegistryError(f"ZooKeeper failed to {action} {shown}: {type(exc).__name__}")

    # -- listings -----------------------------------------------------------------------
    def subtree(self, root: str, deadline: float) -> list[str]:
        """Every node at or below ``root``, parents before children; ``[]`` when absent.

        Read level by level, each level's children in multiReads (``read_levels``). Not a
        snapshot: nodes may come and go meanwhile, and callers that act on the list must
        cope with that."""
        out: list[str] = []
        for path, _, _ in self.read_levels(root, deadline, data=False):
            out.append(path)
        return out

    def tree(self, root: str, deadline: float) -> dict[str, Node]:
        """``root`` and every node below it, with values, read as ``subtree`` reads it: the
        requests follow the node count divided by ``_READ_NODES``, and round trips the
        depth. Not a snapshot (see ``subtree``); a node gone meanwhile is left out."""
        nodes: dict[str, Node] = {}
        for path, value, stat in self.read_levels(root, deadline, data=True):
            nodes[path] = Node(value, stat.version, stat.ephemeralOwner != 0)
        return nodes

    def read_levels(self, root: str, deadline: float, *, data: bool) -> Iterator[tuple[str, bytes, Any]]:
        """``(path, value, stat)`` of ``root`` and every node below it, parents first
        (``b""`` and None unless ``data``), read in multiReads (``multi_read``). A node gone
        between its parent's listing and its own read is left out, with what lay below
        it; nothing when ``root`` is absent."""
        level = [root]
        while level:
            next_level: list[str] = []
            for path, got, names in self.multi_read([(p, data, True) for p in level], deadline):
                if isinstance(got, KzNoNode) or isinstance(names, KzNoNode):
                    continue  # gone since its parent was listed
                for answer in (got, names):
                    if isinstance(answer, Exception):
                        raise answer
                value, stat = got if data else (b"", None)
                yield path, value, stat
                next_level.extend(join(path, n) for n in visible_children(path, names))
            level = next_level

    def watched_read(self, path: str, children: bool, watch: Callable[[Any], None]) -> Any:
        """One read of ``path``'s data (or its child names when ``children``) that arms
        ``watch`` with its answer: one request, where a ``multi_read`` and the SetWatches
        arming what it read are two. The answer as ``multi_read`` gives it, a missing node
        or a refused read as that read's exception instance; a failure of the connection
        raises."""
        call = self.client.get_children_async if children else self.client.get_async
        try:
            return self.wait_answer(call(path, watch=watch))
        except (KzNoNode, NoAuthError) as exc:
            return exc

    def multi_read(
        self, reads: list[tuple[str, bool, bool]], deadline: float = 0.0, *, zxids: list[int] | None = None
    ) -> Iterator[tuple[str, Any, Any]]:
        """``(path, data answer, children answer)`` for each ``(path, read its data, read its
        children)`` of ``reads``, in order, read in multiReads of at most ``_READ_NODES``
        entries and ``_READ_BYTES`` of request, which arm no watch. A data answer is
        ``(value, ZnodeStat)``, a children answer the child names; either is the read's
        exception instance where it failed (each read fails on its own), or None where it
        was not asked for. ``zxids`` gets each multiRead's answer zxid
        (``zookeeper_wire.EncodedMultiRead``), in order."""

        def chunks() -> Iterator[tuple[list[tuple[str, bool, bool]], list[bytes]]]:
            # built as they are sent: a level of 100,000 nodes is megabytes of requests
            chunk: list[tuple[str, bool, bool]] = []
            ops: list[bytes] = []
            size = 0
            for entry in reads:
                path, data, children = entry
                read = ([get_data(path)] if data else []) + ([get_children(path)] if children else [])
                request = sum(map(len, read))
                if chunk and (len(chunk) >= _READ_NODES or size + request > _READ_BYTES):
                    yield chunk, ops
                    chunk, ops, size = [], [], 0
                chunk.append(entry)
                ops.extend(read)
                size += request
            if chunk:
                yield chunk, ops

        for (entries, _), answer in self.windowed(chunks(), lambda c: send_multi_read(self.client, c[1]), deadline):
            if zxids is not None:
                zxids.append(answer.zxid)
            results = iter(answer)
            for path, data, children in entries:
                got = next(results) if data else None
                yield path, got, next(results) if children else None

    def windowed(
        self, chunks: Iterable[_C], send: Callable[[_C], Any], deadline: float = 0.0
    ) -> Iterator[tuple[_C, Any]]:
        """Each chunk with its answer, in order: ``send(chunk)`` queues its request (a kazoo
        async result), at most ``_IN_FLIGHT`` ahead of the one waited for, so the server
        answers one while the client builds or reads another. Each answer is due within
        ``connect_timeout`` of its sending, or by ``deadline`` if later.

        Hazard: one deadline over a whole walk failed every subtree too large to walk in
        ``connect_timeout`` (a namespace of 10,000 jobs holds 130,000 nodes) with "did not
        answer", while the server answered all along. A request's own deadline fails a
        walk only when the answers stop; a dead connection fails its requests sooner anyway.
        """
        sent: collections.deque[tuple[_C, Any, float]] = collections.deque()
        for chunk in chunks:
            if len(sent) >= _IN_FLIGHT:
                done, result, answered_by = sent.popleft()
                yield done, self.wait(result, answered_by)
            sent.append((chunk, send(chunk), max(deadline, self.read_deadline())))
        while sent:
            done, result, answered_by = sent.popleft()
            yield done, self.wait(result, answered_by)


def visible_children(path: str, names: Iterable[str], *, namespace: str = "") -> list[str]:
    """Child names of ``path`` that callers may see (ZooKeeper's own /zookeeper is hidden).
    ``path`` is the server's, or a caller's under ``namespace`` (then nothing is hidden:
    the server's root is not below a namespace)."""
    if path == "/" and not namespace:
        return sorted(n for n in names if n != ROOT_SYSTEM_NODE)
    return sorted(names)


def visible_child_paths(path: str, names: Iterable[str], *, namespace: str = "") -> set[str]:
    """The paths of ``visible_children``, unordered: what a parent listed again and again
    (a namespace of thousands of jobs) is compared by, with no sort and no call per name."""
    prefix = path.rstrip("/") + "/"
    paths = {prefix + name for name in names}
    if not namespace:
        paths.discard(_SYSTEM_PATH)  # listed under "/" only
    return paths


class _Flag:
    """A ``threading.Event`` whose ``wait`` accepts a negative timeout."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(max(0.0, timeout))


class _BlankCredentials(logging.Filter):
    """Replaces the secrets in kazoo's log records before any handler formats them."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and args:
            blanked = [_blank(arg) for arg in args]
            if "passwd" in str(record.msg):
                blanked = [("***" if isinstance(a, (bytes, bytearray)) else a) for a in blanked]
            record.args = tuple(blanked)
        return True


def _blank(arg: object) -> object:
    if isinstance(arg, Auth):
        return f"Auth(scheme={arg.scheme!r}, auth=***)"
    if isinstance(arg, Connect):
        return arg._replace(passwd=b"***")
    return arg


_KAZOO_LOGGER = logging.getLogger("registry.zookeeper.kazoo")
_KAZOO_LOGGER.addFilter(_BlankCredentials())


def kazoo_logger() -> logging.Logger:
    """The logger every kazoo client of this backend writes to (credentials blanked)."""
    return _KAZOO_LOGGER
