"""Watch supervision for the etcd backend: one thread per client owns every watch.

pyetcd's stream callbacks only enqueue. The supervisor thread takes the queue in order,
turns etcd events into ``_notify`` calls, and repairs watches:

- it tracks, per watch, the last revision it delivered and drops anything at or below it
  (a half-closed old stream may repeat events);
- when a stream breaks (server restart, dropped connection, a compacted revision) it
  watches each lost key range again *from now*, then re-reads the watch's subtree once
  and calls ``_resync``, so what changed meanwhile arrives as events (*re-listing*);
- a watch refused by the server (id -1, e.g. an expired token) gets a new token and a new
  stream; the old stream is aborted, never left running.

A ``sentinel`` watch on a key no node can have keeps a stream open at all times, so a
dropped connection is noticed at once (``on_trouble`` wakes the lease keeper) even when
the client watches nothing.

A watch with ``exclude`` is one etcd watcher per key range: its subtree minus the excluded
subtrees found so far (*holes*, from its snapshot and from the first event in each). The
server then never sends what the watch leaves out — at 100 instances of a job, every
instance's cache would otherwise receive every instance's running marks, two writes per
fire each, and spend its CPU on events it drops. A hole is punched by replacing the
watcher of the range it falls in with watchers of the pieces around it, each resuming
after the last revision delivered, so nothing is lost or repeated.

Re-listing rather than resuming each range after its last delivered revision: a range
whose keys rarely change (most of a job's subtree) last delivered an event long ago, and
etcd catches a resumed watcher up by reading every revision since its start revision,
512 watchers at a time. At 10,000 jobs a watch is 10,000 ranges, most of them quiet, and
resuming them after a four-second cut kept etcd busy re-reading minutes of history for
as long as fires kept writing, and fires fell to under half. A watcher from now costs
etcd no catch-up, and the one read of the subtree fills the gap. The trick that keeps it
exact: watch first, read after, so the read's revision S is at or above every new
watcher's start; every range of the watch then drops what it delivers at or below S
(the read holds it), and nothing after S is missed.

Invariant: every subscribe, cancel and notification happens on the supervisor thread, so
events of one node are delivered in revision order and never after the watch's
cancellation (events of different key ranges of one watch may interleave out of revision
order right after a hole is punched, while the new watchers catch up).
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pyetcd import etcdrpc
from pyetcd import exceptions as etcd_exc
from pyetcd.etcdrpc import kv_pb2
from pyetcd.utils import prefix_range_end

from registry.backends.etcd_conn import EtcdConnection
from registry.backends.etcd_errors import translate
from registry.backends.etcd_stream import WatchStream
from registry.backends.etcd_txn import enc, kv_node, range_op, subtree_prefix
from registry.backends.watch_registration import WatchRegistration
from registry.errors import RegistryConnectionError, RegistryError
from registry.paths import excluded_subtree, is_below
from registry.protocol import EventKind, Node

__all__ = ["WatchSupervisor"]

log = logging.getLogger("registry.etcd")

_DELETE = kv_pb2.Event.DELETE  # an etcd event's ``type``: PUT or DELETE


class Notify(Protocol):
    """``BaseRegistry._notify``: reports one raw change of a watched node."""

    def __call__(
        self,
        registration: WatchRegistration,
        kind: EventKind,
        stored_path: str,
        node: Node | None,
        *,
        covered: bool,
    ) -> None: ...


Resync = Callable[[WatchRegistration, Mapping[str, Node], bool], None]  # (registration, nodes, emit)

_RETRY_MIN = 0.05
_RETRY_MAX = 1.0
#: holes per watch: past this, further excluded subtrees are dropped on arrival instead.
#: Each hole adds a watcher (one key range); a job's running marks are one hole, and each
#: mark that arrives costs the client more CPU than its watcher costs the server
_MAX_HOLES = 16_384


class _Compacted(Exception):
    """The revision a watch should resume from is gone: re-read the subtree."""


@dataclass(eq=False)
class _Group:
    """One watch's key ranges (``subs``, an ordered set: a hole replaces one of thousands
    in O(1)) and the excluded subtrees cut out of them."""

    subs: dict[_Sub, None]
    holes: set[str]
    cancelled: bool = False


@dataclass(eq=False, slots=True)
class _Sub:
    registration: WatchRegistration | None  # None: the sentinel
    key: bytes
    range_end: bytes
    group: _Group | None = None  # None: the sentinel
    last_rev: int = 0  # highest revision delivered; resume from last_rev + 1
    generation: int = 0  # bumped per subscription; stale callbacks carry an older one
    watch_id: int | None = None
    stream: WatchStream | None = None
    cancelled: bool = False
    retry_at: float | None = None
    delay: float = _RETRY_MIN
    #: its next subscription resumes after ``last_rev`` (a piece of a range just punched,
    #: whose revision is fresh) instead of re-listing the watch (``_relist``)
    resumes: bool = False


class _Delivery:
    """A subscription's stream callback: hands each response to the supervisor's queue
    with the subscription and its generation. A slotted object, where a closure (its
    function object, its defaults and its cell) held 250 bytes per key range: two a job."""

    __slots__ = ("_generation", "_queue", "_sub")

    def __init__(self, out: queue.SimpleQueue[tuple[Any, ...]], sub: _Sub, generation: int) -> None:
        self._queue, self._sub, self._generation = out, sub, generation

    def __call__(self, response: Any) -> None:
        self._queue.put(("response", self._sub, (self._generation, response)))


class WatchSupervisor:
    """Owns the watch stream(s) and the thread that processes their responses."""

    def __init__(
        self,
        conn: EtcdConnection,
        notify: Notify,
        resync: Resync,
        on_trouble: Callable[[], None],
        sentinel_key: str,
        name: str,
    ) -> None:
        self._conn = conn
        self._notify = notify
        self._resync = resync
        self._on_trouble = on_trouble
        self._queue: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        #: the subscribed subs (sentinel aside), an ordered set: touched only on the
        #: supervisor thread, once per hole punched, so never scanned
        self._subs: dict[_Sub, None] = {}
        #: the subs (sentinel included) with a ``retry_at``, in the order they got it: the
        #: loop looks at these after every response, never at every sub (one per hole)
        self._retrying: dict[_Sub, None] = {}
        self._stream: WatchStream | None = None
        self._stopped = False
        self._sentinel = _Sub(None, enc(sentinel_key), b"")
        #: events the server sent for watches (the sentinel's aside), excluded or not
        self.events_received = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    # -- API for the registry (caller threads) --------------------------------------------
    def start(self) -> None:
        """Start the thread and open the sentinel watch (not fatal if refused)."""
        self._thread.start()
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._queue.put(("subscribe", self._sentinel, done))
        try:
            done.result(timeout=self._conn.call_timeout + 1)
        except Exception as exc:
            log.debug("etcd sentinel watch not established yet: %s", exc)

    def add(self, registration: WatchRegistration, initial: bool) -> None:
        """Read the subtree, report it (``initial``), then watch from the next revision."""
        snapshot, revision = self.snapshot(registration)
        self._resync(registration, snapshot, initial)
        below = enc(subtree_prefix(registration.root))
        start = enc(registration.root) if _includes_root(registration) else below
        holes = _holes_in(registration, snapshot)
        group = _Group({}, holes)
        subs = [
            _Sub(registration, key, range_end, group, revision)
            for key, range_end in _cut((start, prefix_range_end(below)), holes)
        ]
        group.subs.update(dict.fromkeys(subs))  # before the first subscription: ours alone
        registration.backend_state = group
        pending: list[concurrent.futures.Future[None]] = []
        for sub in subs:  # not group.subs: the supervisor punches holes in it meanwhile
            done: concurrent.futures.Future[None] = concurrent.futures.Future()
            self._queue.put(("subscribe", sub, done))
            pending.append(done)
        deadline = time.monotonic() + self._conn.call_timeout * 2 + 1
        try:
            for done in pending:
                done.result(timeout=max(0.0, deadline - time.monotonic()))
        except concurrent.futures.TimeoutError:
            self.remove(registration)
            raise RegistryConnectionError(
                f"etcd at {self._conn.servers}: watch on {registration.watch.path!r} not established in time"
            ) from None
        except BaseException:
            self.remove(registration)
            raise

    def remove(self, registration: WatchRegistration) -> None:
        group = registration.backend_state
        if isinstance(group, _Group):
            group.cancelled = True  # deliveries stop now; the watchers end on the thread
            self._queue.put(("cancel_group", None, group))

    def stop(self, timeout: float = 2.0) -> None:
        self._stopped = True
        self._queue.put(("stop", None, None))
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if self._stream is not None:
            self._stream.abort()

    def snapshot(self, registration: WatchRegistration) -> tuple[dict[str, Node], int]:
        """Every node the watch covers and the revision they were read at (one txn)."""
        below = enc(subtree_prefix(registration.root))
        reads = [range_op(below, prefix_range_end(below))]
        if _includes_root(registration):
            reads.insert(0, range_op(enc(registration.root)))
        response = self._conn.txn(
            etcdrpc.TxnRequest(compare=[], success=reads, failure=[]), idempotent=True, action="read"
        )
        nodes = {
            kv.key.decode("utf-8", "replace"): kv_node(kv)
            for r in response.responses
            for kv in r.response_range.kvs
        }
        return nodes, int(response.header.revision)

    # -- the supervisor thread ----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            wait = self._next_retry_in()
            try:
                kind, sub, payload = self._queue.get(timeout=wait)
            except queue.Empty:
                kind, sub, payload = "tick", None, None
            if kind == "stop":
                return
            try:
                self._handle(kind, sub, payload)
                self._retry_due()
            except Exception:
                log.exception("etcd watch supervisor: unexpected failure; continuing")

    def _handle(self, kind: str, sub: _Sub | None, payload: Any) -> None:
        if kind == "cancel_group":
            for member in list(payload.subs):
                self._cancel(member)
            return
        if kind == "tick" or sub is None:
            return
        if kind == "subscribe":
            self._first_subscribe(sub, payload)
        elif kind == "response":
            generation, response = payload
            if generation == sub.generation and not sub.cancelled and not _group_cancelled(sub):
                self._on_response(sub, response)

    def _first_subscribe(self, sub: _Sub, done: concurrent.futures.Future[None] | None) -> None:
        try:
            self._subscribe(sub, resume=True)  # after the snapshot ``add`` just read
        except _Compacted:
            # compacted since our snapshot: the retry re-lists
            self._retry_at(sub, time.monotonic())
        except Exception as exc:
            if isinstance(exc, RegistryConnectionError):
                self._on_trouble()
            if sub is self._sentinel:
                log.debug("etcd sentinel watch not established (%s); will retry", exc)
                self._schedule(sub)
                if done is not None:
                    done.set_result(None)
                return
            if done is not None:
                done.set_exception(_as_registry_error(exc, self._conn.servers))
            return
        if sub is not self._sentinel:
            self._subs[sub] = None
        if done is not None:
            done.set_result(None)
        if sub.cancelled or _group_cancelled(sub):  # the caller gave up while we subscribed
            self._cancel(sub)

    def _cancel(self, sub: _Sub) -> None:
        sub.cancelled = True
        sub.generation += 1
        self._subs.pop(sub, None)
        if sub.stream is not None and sub.watch_id is not None:
            sub.stream.cancel(sub.watch_id)
        sub.watch_id = None

    def _on_response(self, sub: _Sub, response: Any) -> None:
        if isinstance(response, etcd_exc.RevisionCompactedError):
            self._broken(sub)
        elif response is None or isinstance(response, BaseException):
            self._on_trouble()
            self._broken(sub)
        elif sub.registration is not None:
            self._deliver(sub, sub.registration, response)

    def _deliver(self, sub: _Sub, registration: WatchRegistration, response: Any) -> None:
        seen = sub.last_rev
        found: set[str] = set()
        self.events_received += len(response.events)
        for event in response.events:  # etcd's own (``WatchStream``): ``type`` and ``kv``
            kv = event.kv
            revision = kv.mod_revision
            if revision <= seen:
                continue  # repeated by a stream we already replaced
            path = kv.key.decode("utf-8", "replace")
            if not registration.covers(path):
                hole = _hole_of(registration, path)
                if hole is not None:
                    found.add(hole)
            elif event.type == _DELETE:
                self._notify(registration, EventKind.DELETED, path, None, covered=True)
            else:
                kind = EventKind.CREATED if kv.version == 1 else EventKind.UPDATED
                node = Node(kv.value, revision, kv.lease != 0)
                self._notify(registration, kind, path, node, covered=True)
            sub.last_rev = max(sub.last_rev, revision)
        if found:
            self._punch(sub, found)

    def _punch(self, sub: _Sub, found: set[str]) -> None:
        """Replace ``sub``'s watcher by watchers of the pieces of its range around the
        newly found holes; they resume after its last delivered revision."""
        group = sub.group
        if group is None or group.cancelled or sub not in group.subs:
            return
        room = _MAX_HOLES - len(group.holes)
        fresh = sorted(found - group.holes)[: max(room, 0)]
        if not fresh:
            return
        group.holes.update(fresh)
        pieces = _cut((sub.key, sub.range_end), set(fresh))
        if pieces == [(sub.key, sub.range_end)]:
            return
        self._cancel(sub)
        now = time.monotonic()
        replacements = [
            _Sub(sub.registration, key, range_end, group, sub.last_rev, retry_at=now, resumes=True)
            for key, range_end in pieces
        ]
        self._retrying.update(dict.fromkeys(replacements))
        del group.subs[sub]
        group.subs.update(dict.fromkeys(replacements))
        self._subs.update(dict.fromkeys(replacements))  # subscribed by _retry_due, right after this response
        log.debug(
            "etcd watch on %s: %d excluded subtree(s) left out at the server", sub.key.decode(), len(fresh)
        )

    def _broken(self, sub: _Sub) -> None:
        sub.watch_id = None
        sub.generation += 1  # later responses of the dead subscription are dropped
        sub.delay = _RETRY_MIN
        self._retry_at(sub, time.monotonic())

    def _schedule(self, sub: _Sub) -> None:
        self._retry_at(sub, time.monotonic() + sub.delay)
        sub.delay = min(sub.delay * 2, _RETRY_MAX)

    def _retry_at(self, sub: _Sub, when: float | None) -> None:
        sub.retry_at = when
        if when is None:
            self._retrying.pop(sub, None)
        else:
            self._retrying[sub] = None

    def _next_retry_in(self) -> float | None:
        due = [s.retry_at for s in self._retrying if s.retry_at is not None and not s.cancelled]
        return None if not due else max(0.0, min(due) - time.monotonic())

    def _retry_due(self) -> None:
        if not self._retrying:
            return
        now = time.monotonic()
        lost: dict[_Group, list[_Sub]] = {}
        for sub in list(self._retrying):
            if sub.cancelled or sub.retry_at is None:
                self._retrying.pop(sub, None)
                continue
            if sub.retry_at > now or self._stopped:
                continue
            if sub.group is not None and not sub.resumes:
                lost.setdefault(sub.group, []).append(sub)
            else:  # the sentinel, and pieces of a range just punched
                self._resubscribe(sub)
        for group, subs in lost.items():
            self._relist(group, subs)

    def _resubscribe(self, sub: _Sub) -> None:
        """Subscribe ``sub`` again after its last revision."""
        try:
            self._subscribe(sub, resume=True)
        except _Compacted:
            sub.resumes = False  # the next try re-lists
            self._retry_at(sub, time.monotonic())
            return
        except Exception as exc:
            self._failed(sub, exc)
            return
        self._retry_at(sub, None)
        sub.delay = _RETRY_MIN
        sub.resumes = False

    def _relist(self, group: _Group, subs: list[_Sub]) -> None:
        """Watch ``subs`` (lost key ranges of ``group``) from now, then read the watch's
        subtree and emit what changed since it was last seen (module docstring)."""
        if group.cancelled:
            for sub in subs:
                self._retry_at(sub, None)
            return
        registration = subs[0].registration
        assert registration is not None
        watching: list[_Sub] = []
        for index, sub in enumerate(subs):
            try:
                self._subscribe(sub, resume=False)
            except Exception as exc:
                self._failed(sub, exc)
                if isinstance(exc, RegistryConnectionError):  # the rest would fail alike
                    for rest in subs[index + 1 :]:
                        self._schedule(rest)
                    break
                continue
            watching.append(sub)
        if not watching:
            return
        try:
            snapshot, revision = self.snapshot(registration)
        except Exception as exc:
            # without the read the gap stays unknown: the new watchers must deliver nothing
            for sub in watching:
                if sub.stream is not None and sub.watch_id is not None:
                    sub.stream.cancel(sub.watch_id)
                sub.watch_id = None
                sub.generation += 1
                self._failed(sub, exc)
            return
        for member in group.subs:  # the read holds everything up to its revision
            member.last_rev = max(member.last_rev, revision)
        self._resync(registration, snapshot, True)
        for sub in watching:
            self._retry_at(sub, None)
            sub.delay = _RETRY_MIN
        log.info(
            "etcd watch on %s: %d key range(s) watched again, changes since read at revision %d",
            registration.root, len(watching), revision,
        )  # fmt: skip

    def _failed(self, sub: _Sub, exc: BaseException) -> None:
        """A subscription of ``sub`` failed: try again later."""
        log.debug("re-subscribing etcd watch %r failed: %s", sub.key, exc)
        if isinstance(exc, RegistryConnectionError):
            self._on_trouble()
        self._schedule(sub)
        if sub is self._sentinel and not isinstance(exc, RegistryConnectionError):
            self._retry_at(sub, None)  # refused for good (permissions): the keeper still polls

    # -- subscribing (supervisor thread only) -----------------------------------------------------
    def _current_stream(self) -> WatchStream:
        stream = self._stream
        if stream is not None and stream.token_generation == self._conn.token_generation:
            return stream
        # a new token needs a new stream: the token travels once, when a stream opens
        fresh = WatchStream(
            self._conn.channel, self._conn.call_timeout, self._conn.metadata, self._conn.token_generation
        )
        self._stream = fresh
        if stream is not None:
            self._abandon(stream)
        return fresh

    def _abandon(self, stream: WatchStream) -> None:
        for sub in (self._sentinel, *self._subs):
            if sub.stream is stream and sub.watch_id is not None:
                self._broken(sub)
        stream.abort()

    def _subscribe(self, sub: _Sub, *, resume: bool) -> None:
        """Watch ``sub``'s range: after ``last_rev`` when ``resume`` (and it has one),
        else from now."""
        for renewed in (False, True):
            stream = self._current_stream()
            sub.generation += 1
            generation = sub.generation

            callback = _Delivery(self._queue, sub, generation)
            start = sub.last_rev + 1 if resume and sub.last_rev else None
            try:
                watch_id = stream.add_callback(
                    sub.key, callback, range_end=sub.range_end or None, start_revision=start
                )
            except etcd_exc.RevisionCompactedError:
                raise _Compacted() from None
            except Exception as exc:
                raise _as_registry_error(exc, self._conn.servers) from exc
            if watch_id is not None and watch_id >= 0:
                sub.watch_id, sub.stream = watch_id, stream
                return
            stream.forget(watch_id)
            if renewed:
                break
            # refused: most likely an expired token; renew it (the next stream uses it)
            self._conn.reauthenticate(stream.token_generation)
            if self._conn.token_generation == stream.token_generation:
                break
        raise RegistryError(
            f"etcd at {self._conn.servers} refused to watch {sub.key.decode('utf-8', 'replace')!r} "
            "(not authorised?)"
        )


def _group_cancelled(sub: _Sub) -> bool:
    return sub.group is not None and sub.group.cancelled


def _holes_in(registration: WatchRegistration, nodes: Mapping[str, Node]) -> set[str]:
    """The excluded subtrees that ``nodes`` (a snapshot) shows, up to ``_MAX_HOLES``."""
    holes = {
        hole
        for path in nodes
        if not registration.covers(path) and (hole := _hole_of(registration, path)) is not None
    }
    return set(sorted(holes)[:_MAX_HOLES])


def _hole_of(registration: WatchRegistration, path: str) -> str | None:
    """The excluded subtree of ``registration`` that ``path``, a path it does not cover,
    lies in; None when ``path`` is outside its root."""
    if registration.excluded is None or not is_below(path, registration.root):
        return None
    return excluded_subtree(path, registration.root, registration.excluded)


def _cut(span: tuple[bytes, bytes], holes: set[str]) -> list[tuple[bytes, bytes]]:
    """``span`` (a key range) without the keys strictly below each hole, in key order. The
    hole's own key stays in: it sorts before its subtree, and its rare writes are dropped
    on arrival.

    Hazard: a watch over 10,000 jobs starts with a hole per job, and cutting each hole out
    of the pieces left by the others is quadratic (seconds of the supervisor thread at that
    size). The trick: one sweep over the cuts sorted by key, a cursor marking how far the
    span is settled."""
    start, end = span
    if not end:  # b"" end: one key, never cut
        return [span]
    cuts = sorted((below, prefix_range_end(below)) for below in (enc(subtree_prefix(hole)) for hole in holes))
    pieces: list[tuple[bytes, bytes]] = []
    cursor = start  # everything before it is either kept in ``pieces`` or cut
    for cut_start, cut_end in cuts:
        if cut_start >= end:
            break
        if cut_end <= cursor:
            continue  # before the span, or inside a cut already made
        if cursor < cut_start:
            pieces.append((cursor, cut_start))
        cursor = cut_end
    if cursor < end:
        pieces.append((cursor, end))
    return pieces


def _includes_root(registration: WatchRegistration) -> bool:
    """Whether the watched node itself is reported: not for the caller's root ``/``, which
    is implicit on every backend (under a namespace it is the namespace's own key)."""
    return registration.watch.path != "/"


def _as_registry_error(exc: BaseException, servers: str) -> RegistryError:
    if isinstance(exc, RegistryError):
        return exc
    if isinstance(exc, RuntimeError) and "aborted" in str(exc):
        return RegistryConnectionError(f"etcd at {servers}: watch stream closed")
    return translate(exc, "watch", servers)
