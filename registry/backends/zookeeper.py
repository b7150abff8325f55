"""``zk://`` — the registry on Apache ZooKeeper, through kazoo.

``ZooKeeperRegistry(parsed)`` returns connected (``registry.connect("zk://...")``). The
namespace is applied by the base class, so no kazoo chroot is used and the primitives here
receive stored paths. Helpers: :mod:`zookeeper_io` (deadlines, retries, error map),
:mod:`zookeeper_txn` (multi requests, planned), :mod:`zookeeper_wire` (multi requests,
encoded), :mod:`zookeeper_poll` (the connection thread's select), :mod:`zookeeper_connect`
(a bound on each connection attempt) over :mod:`zookeeper_socket` (the connection's bytes
moved in bulk), :mod:`zookeeper_watch` (subtree watches).

Invariants kept here:

- a fixed set of threads per client: kazoo's three, plus one watch worker that does every
  read a watch needs (kazoo's event thread is never blocked), plus the base's two;
- session transitions map one to one: SUSPENDED when the connection drops, RECONNECTED
  when it returns with the same session, LOST when the session expired, then CONNECTED on
  the new session kazoo opens by itself. kazoo forgets its watches whenever the
  connection drops: after RECONNECTED, and after CONNECTED on a new session, they are
  re-armed relative to the last zxid seen before the first drop since they were last
  armed (``zookeeper_rewatch``; the server reports what changed since, the old session's
  ephemeral nodes deleted included); when that fails, or no zxid is known, every watch is
  read again, and until that read completes a further drop leads to reading again, never
  to a re-arm;
- with ``user:password`` every node this client creates, parents included, carries an ACL
  giving that digest identity every right and everyone else READ only;
- a failed connect leaves no kazoo thread running and names only the hosts.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError as KzNodeExists
from kazoo.exceptions import NoNodeError as KzNoNode
from kazoo.exceptions import NotEmptyError
from kazoo.protocol.states import KazooState
from kazoo.retry import KazooRetry
from kazoo.security import make_acl, make_digest_acl

from registry.backends.base import BaseRegistry
from registry.backends.dispatcher import Dispatcher
from registry.backends.watch_registration import WatchRegistration
from registry.backends.zookeeper_connect import granted_timeout, tune_connection
from registry.backends.zookeeper_io import ZkIO, is_connection_failure, kazoo_logger, visible_children
from registry.backends.zookeeper_poll import PollingHandler
from registry.backends.zookeeper_rewatch import rearm
from registry.backends.zookeeper_txn import run_transaction
from registry.backends.zookeeper_watch import TreeWatcher
from registry.backends.zookeeper_watchers import compact_watcher_tables
from registry.backends.zookeeper_wire import send_multi
from registry.errors import NoNodeError, RegistryConnectionError, RegistryError
from registry.paths import parent
from registry.protocol import Node, Op, SessionState
from registry.url import RegistryURL

__all__ = ["ZooKeeperRegistry"]

log = logging.getLogger("registry.zookeeper")

# Races a loop tolerates (a node appearing or vanishing between two requests of one call)
# before it gives up with an error rather than spinning.
_RACE_ATTEMPTS = 8
#: deletes per multi of a subtree's delete (some 60 request bytes each: far below 1 MB)
_DELETES = 500
_CLOCK_NODE = "/.shardjob/clock"


class _Attempt:
    """One call run on the watch worker, its outcome read by the thread that waits."""

    def __init__(self, fn: Callable[[], None], still_wanted: Callable[[], bool]) -> None:
        self._fn = fn
        self._still_wanted = still_wanted
        self.done = threading.Event()
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            if self._still_wanted():
                self._fn()
        except BaseException as exc:
            self.failure = exc
        finally:
            self.done.set()


def _hosts_text(hosts: tuple[tuple[str, int], ...]) -> str:
    return ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in hosts)


class ZooKeeperRegistry(BaseRegistry):
    """A ZooKeeper session: ``zk://[user:password@]host:port[,host:port...][/namespace]``
    (alias ``zookeeper://``, default port 2181); see the module docstring.

    URL options: ``session_timeout`` (s, default 10; the server bounds it to 2-20 ticks),
    ``connect_timeout`` (s, default 5: the wait for a first session, and for the server
    to answer each connection attempt, see ``zookeeper_connect``), ``max_txn_ops``
    (default 128; a multi request is bounded by its bytes only). ``user:password`` is
    digest authentication: the nodes this client creates are writable by that identity
    only, readable by all."""

    backend_name = "zookeeper"

    def __init__(self, parsed: RegistryURL) -> None:
        super().__init__(parsed)
        self._hosts = _hosts_text(parsed.hosts)
        self._closing = False
        self._session_id: int | None = None
        self._lost = False
        #: the last zxid seen before the first drop since the watches were last armed
        self._rearm_zxid: int | None = None
        #: the watches must be read again (a new session, or a re-arm that failed)
        self._reread_pending = False
        #: connection drops so far: a re-arm or read clears the state above only if no
        #: drop came while it ran
        self._drops = 0
        self._state_guard = threading.Lock()
        self._worker = Dispatcher(f"registry-zkwatch-{id(self):x}")
        self._clock_path = self._ns.prefix + _CLOCK_NODE
        #: when the latest applied transaction was sent (``session_deadline``)
        self._answered_sent = -math.inf

        auth_data: list[tuple[str, str]] | None = None
        acl: list[Any] | None = None
        if parsed.user is not None and parsed.password is not None:
            auth_data = [("digest", f"{parsed.user}:{parsed.password}")]
            acl = [
                make_digest_acl(parsed.user, parsed.password, all=True),
                make_acl("world", "anyone", read=True),
            ]
        self._client: Any = KazooClient(
            hosts=self._hosts,
            handler=PollingHandler(connect_timeout=parsed.connect_timeout),
            timeout=parsed.session_timeout,
            auth_data=auth_data,
            default_acl=acl,
            # kazoo's default backs off to an hour between attempts after a long outage
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_jitter=0.4, max_delay=1.0),
            logger=kazoo_logger(),
        )
        tune_connection(self._client, parsed.connect_timeout)
        compact_watcher_tables(self._client, self._ns.prefix)
        self._io = ZkIO(
            self._client,
            hosts=self._hosts,
            connect_timeout=parsed.connect_timeout,
            session_timeout=parsed.session_timeout,
            client_path=self._client_path,
        )
        self._io.watched_existence = self._watched_existence
        self._client.add_listener(self._on_kazoo_state)
        try:
            self._client.start(timeout=parsed.connect_timeout)
        except Exception:
            self._closing = True
            self._shutdown_client()
            self._worker.stop()
            self._events.stop()
            self._session_events.stop()
            raise RegistryConnectionError(
                f"no ZooKeeper server answered at {self._hosts} within {parsed.connect_timeout:g}s"
            ) from None

    # -- session ------------------------------------------------------------------------
    def session_credentials(self) -> tuple[int, bytes]:
        """The current session's id and password (for tests that expire it from outside)."""
        client_id = self._client.client_id
        if client_id is None:
            raise RegistryConnectionError(f"not connected to ZooKeeper at {self._hosts}")
        return int(client_id[0]), bytes(client_id[1])

    def _on_kazoo_state(self, state: Any) -> None:
        """kazoo's listener, on its connection thread: record and hand over, never block."""
        if self._closing:
            return
        with self._state_guard:
            if state == KazooState.SUSPENDED:
                self._drops += 1
                if self._rearm_zxid is None:
                    self._rearm_zxid = self._client.last_zxid
                self._io.connected.clear()
                self._set_state(SessionState.SUSPENDED)
            elif state == KazooState.LOST:
                self._drops += 1
                self._io.connected.clear()
                self._lost = True
                self._answered_sent = -math.inf  # nothing answered so far vouches any more
                self._set_state(SessionState.LOST)
            elif state == KazooState.CONNECTED:
                client_id = self._client.client_id
                session_id = None if client_id is None else client_id[0]
                previous, self._session_id = self._session_id, session_id
                lost, self._lost = self._lost, False
                self._io.connected.set()
                if previous is None:
                    return  # the first session: nothing was watched before it
                if not lost and session_id == previous:
                    self._set_state(SessionState.RECONNECTED)
                else:
                    self._answered_sent = -math.inf  # a new session: the old one's answers say nothing
                    if not lost:
                        self._set_state(SessionState.LOST)
                    self._set_state(SessionState.CONNECTED)
                zxid, drops = self._rearm_zxid, self._drops
                if self._reread_pending or zxid is None:
                    self._worker.submit(functools.partial(self._reread_watches, drops))
                else:
                    self._worker.submit(functools.partial(self._rearm_watches, zxid, drops))

    def _watchers(self) -> list[TreeWatcher]:
        found = [registration.backend_state for registration in self._active_watches()]
        return [watcher for watcher in found if isinstance(watcher, TreeWatcher) and watcher.usable]

    def _watches_armed(self, drops: int) -> None:
        """Every watch is armed as of now, unless the connection dropped since ``drops``."""
        with self._state_guard:
            if self._drops == drops:
                self._rearm_zxid = None
                self._reread_pending = False

    def _rearm_watches(self, zxid: int, drops: int) -> None:
        """After a reconnect, to the same session or a new one: SetWatches relative to
        ``zxid``. The server must hold the history that zxid belongs to (a new session may
        have reached a server whose data was wiped): its answer's zxid, at or past ours,
        says so, else every watch is read again."""
        watchers = self._watchers()
        try:
            rearm(self._client, zxid, [w.armed() for w in watchers], self._io.wait_answer)
        except Exception as exc:
            if not self._client.connected:
                return  # the next reconnect re-arms from the same zxid
            log.warning("watches not re-armed after the reconnect (%s); reading them again", type(exc).__name__)
            with self._state_guard:
                self._reread_pending = True
            self._reread_watches(drops)
            return
        if self._client.last_zxid < zxid:
            log.warning(
                "ZooKeeper at %s is behind the history these watches saw (zxid %#x < %#x); reading them again",
                self._hosts, self._client.last_zxid, zxid,
            )  # fmt: skip
            with self._state_guard:
                self._reread_pending = True
            self._reread_watches(drops)
            return
        self._watches_armed(drops)
        for watcher in watchers:
            watcher.resume()

    def _reread_watches(self, drops: int) -> None:
        """Read every watch's subtree again (no zxid to re-arm from, or a failed re-arm)."""
        if all([watcher.resync_after_gap() for watcher in self._watchers()]):
            self._watches_armed(drops)

    # -- reads --------------------------------------------------------------------------
    def _get_node(self, path: str) -> Node | None:
        def read(deadline: float) -> Node | None:
            try:
                data, stat = self._io.wait(self._client.get_async(path), deadline)
            except KzNoNode:
                return None
            return Node(data or b"", stat.version, stat.ephemeralOwner != 0)

        return self._io.read(path, read)

    def _exists(self, path: str) -> bool:
        return (
            self._io.read(path, lambda deadline: self._io.wait(self._client.exists_async(path), deadline))
            is not None
        )

    def _read_tree(self, path: str) -> dict[str, Node]:
        return self._io.read(path, functools.partial(self._io.tree, path))

    def _children(self, path: str) -> list[str]:
        def read(deadline: float) -> list[str]:
            try:
                names = self._io.wait(self._client.get_children_async(path), deadline)
            except KzNoNode:
                return []
            return visible_children(path, names)

        return self._io.read(path, read)

    # -- writes -------------------------------------------------------------------------
    def _create(self, path: str, value: bytes, ephemeral: bool) -> None:
        self._io.write(
            path, lambda deadline: self._create_node(path, value, ephemeral, False, deadline), action="create"
        )

    def _create_sequential(self, prefix: str, value: bytes, ephemeral: bool) -> str:
        return self._io.write(
            prefix,
            lambda deadline: self._create_node(prefix, value, ephemeral, True, deadline),
            action="create",
        )

    def _create_node(self, path: str, value: bytes, ephemeral: bool, sequence: bool, deadline: float) -> str:
        for _ in range(_RACE_ATTEMPTS):
            try:
                created = self._io.wait(
                    self._client.create_async(
                        path, value, ephemeral=ephemeral, sequence=sequence, makepath=True
                    ),
                    deadline,
                )
                return str(created)
            except KzNoNode:
                continue  # a parent vanished after kazoo made it; the create was refused, so retry
        raise NoNodeError(parent(path))

    def _put(self, path: str, value: bytes, ephemeral: bool) -> None:
        def put(deadline: float) -> None:
            for _ in range(_RACE_ATTEMPTS):
                try:
                    self._io.wait(self._client.set_async(path, value), deadline)
                    return
                except KzNoNode:
                    pass
                try:
                    self._io.wait(
                        self._client.create_async(path, value, ephemeral=ephemeral, makepath=True), deadline
                    )
                    return
                except (KzNodeExists, KzNoNode):
                    continue  # created (or a parent removed) by someone else meanwhile
            raise RegistryError(f"put {self._client_path(path)}: the node kept appearing and vanishing")

        self._io.write(path, put, action="write")

    def _delete(self, path: str) -> None:
        for _ in range(_RACE_ATTEMPTS):
            nodes = self._io.read(path, lambda deadline: self._io.subtree(path, deadline))
            if not nodes:
                return
            if self._io.write(path, functools.partial(self._delete_nodes, nodes), action="delete"):
                return
        raise RegistryError(f"delete {self._client_path(path)}: nodes kept being added below it")

    def _delete_nodes(self, nodes: list[str], deadline: float) -> bool:
        """Delete ``nodes`` deepest level first; False when one gained a child meanwhile.

        A level goes in multis of ``_DELETES`` deletes each (``ZkIO.windowed``): a namespace of
        10,000 jobs is some 260 requests, not 130,000. A multi that fails applied nothing
        (a node gone already, or one that gained a child): its nodes are then deleted one
        by one, which tells the two apart."""
        by_depth: dict[int, list[str]] = {}
        for node in nodes:
            by_depth.setdefault(node.count("/"), []).append(node)
        encode = self._io.encoder
        for depth in sorted(by_depth, reverse=True):
            complete = True
            level = by_depth[depth]
            chunks = [level[start : start + _DELETES] for start in range(0, len(level), _DELETES)]
            multis = self._io.windowed(
                chunks, lambda chunk: send_multi(self._client, [encode.delete(n, -1) for n in chunk]), deadline
            )
            for chunk, answer in multis:
                if all(result is True for result in answer):
                    continue
                pending = [self._client.delete_async(node) for node in chunk]
                for result in pending:
                    try:
                        self._io.wait(result, max(deadline, self._io.read_deadline()))
                    except KzNoNode:
                        pass
                    except NotEmptyError:
                        complete = False
            if not complete:
                return False
        return True

    def _transaction(self, ops: list[Op]) -> None:
        sent = time.monotonic()
        run_transaction(self._io, ops, self._client_path)
        if sent > self._answered_sent:  # a lost race keeps an earlier time: a nearer deadline
            self._answered_sent = sent

    def session_deadline(self) -> float:
        """Invariant: ZooKeeper expires a session the granted timeout after it last heard
        from the client, and it heard a request it answered no earlier than the request
        was sent: the latest applied transaction's send time plus that timeout (or the
        requested one, if smaller or the grant is unknown). kazoo's pings and other calls
        are not counted: the deadline is only ever earlier than the session's end."""
        requested = self.session_timeout
        granted = granted_timeout(self._client)
        return self._answered_sent + (requested if granted is None else min(requested, granted))

    def server_time(self) -> float:
        path = self._clock_path
        self._stored("/")  # refuses a closed client like every other call

        def touch(deadline: float) -> float:
            for _ in range(_RACE_ATTEMPTS):
                try:
                    stat = self._io.wait(self._client.set_async(path, b""), deadline)
                    return float(stat.mtime) / 1000.0
                except KzNoNode:
                    pass
                try:
                    _, stat = self._io.wait(
                        self._client.create_async(path, b"", makepath=True, include_data=True), deadline
                    )
                    return float(stat.mtime) / 1000.0
                except (KzNodeExists, KzNoNode):
                    continue
            raise RegistryError("server_time: the clock node kept appearing and vanishing")

        return self._io.write(path, touch, action="write the clock node")

    # -- watches ------------------------------------------------------------------------
    def _start_watch(self, registration: WatchRegistration, initial: bool) -> None:
        watcher = TreeWatcher(self, self._io, registration, self._worker.submit)
        registration.backend_state = watcher
        deadline = time.monotonic() + self.connect_timeout
        while True:
            if not self._io.connected.wait(deadline - time.monotonic()):
                self._abandon(watcher)  # it follows the client's tables from its making
                raise RegistryConnectionError(
                    f"not connected to ZooKeeper at {self._hosts} within {self.connect_timeout:g}s; "
                    f"watch on {registration.watch.path} not established"
                )
            attempt = _Attempt(functools.partial(watcher.sync, emit=initial), lambda: not watcher.dead)
            self._worker.submit(attempt.run)
            # the worker may first finish earlier work, itself bounded by read deadlines
            if not attempt.done.wait(
                self.connect_timeout + self.session_timeout + max(0.0, deadline - time.monotonic())
            ):
                self._abandon(watcher)
                raise RegistryConnectionError(
                    f"watch on {registration.watch.path}: ZooKeeper reads did not finish"
                )
            failure = attempt.failure
            if failure is None:
                return
            exc = failure
            if is_connection_failure(exc) and time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            self._abandon(watcher)
            if isinstance(exc, RegistryError):
                raise exc
            raise self._io.map_error(exc, registration.root, action="watch") from None

    def _watched_existence(self, path: str) -> bool | None:
        """Whether ``path`` exists, as the first synced tree watch covering it has
        reported; None when none covers it. Stale either way by a notification in flight:
        a re-plan that trusted it fails with nothing applied and reads (``zookeeper_txn``)."""
        for registration in self._active_watches():
            watcher = registration.backend_state
            if isinstance(watcher, TreeWatcher) and watcher.usable and registration.covers(path):
                return watcher.has_reported(path)
        return None

    def _stop_watch(self, registration: WatchRegistration) -> None:
        watcher = registration.backend_state
        if isinstance(watcher, TreeWatcher):
            self._abandon(watcher)

    def _abandon(self, watcher: TreeWatcher) -> None:
        watcher.dead = True
        self._worker.submit(watcher.forget)

    # -- lifecycle ----------------------------------------------------------------------
    def _close(self) -> None:
        self._closing = True
        self._io.connected.clear()
        try:
            self._shutdown_client()
        finally:
            self._worker.stop()

    def _shutdown_client(self) -> None:
        """Stop kazoo (its session ends: ephemerals vanish) and free its threads and sockets."""
        with contextlib.suppress(Exception):
            self._client.stop()
        with contextlib.suppress(Exception):
            self._client.close()
