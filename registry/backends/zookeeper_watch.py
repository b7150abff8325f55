"""Subtree watches on ZooKeeper from one-shot watches re-armed, as Curator's TreeCache does.

kazoo 2.11 has no persistent recursive watch (no ``add_watch``), so each registration keeps
a data watch and a child watch on every node of its subtree (an ``exists`` watch on the
root while it is absent), re-reading a node whenever its watch fires (which re-arms it).
kazoo also forgets every watch when the connection drops (it does not re-register them on
reconnect): after a reconnect the backend re-arms them with one SetWatches per 128 KiB of
paths (``zookeeper_rewatch``, from ``armed()``), and only what changed meanwhile is read;
if that fails, the whole subtree is read again and handed to ``_resync``. Every read goes
in multiReads, and the watches of what it read are armed afterwards by SetWatches
(``_scan``, ``_handle``): a few requests per 250 nodes, where a read per node armed its
watch (a node the watch's ``leaves`` names gets no child watch and no children read). A
lone read goes as a read that arms its watch (``_WATCHED_LONE_READ``).

Invariants kept here:

- kazoo's event thread only enqueues: every read runs on the client's single watch worker
  (one thread, one queue), so a registration's state is touched by that thread alone and
  the reads of one session happen in order, which keeps the events of a node in order;
- read results are applied in the order the reads were issued, so the view never goes
  back in time. The worker takes every notification queued so far as one batch (one wait
  on the server for all of them, not one per notification: starting 1,000 jobs queues
  thousands): it reads each again in multiReads and arms their watches by SetWatches
  (as a scan does; a lone one in a read that arms its watch), applies the answers in the
  notifications' order, and only then reads the new subtrees those answers revealed, in
  one scan;
- ``_known`` (the registration's ``versions``) holds exactly the nodes this registration
  has reported, each with its creation zxid and version folded into one stamp
  (``_stamp``), so a node deleted and created again between two reads is reported as
  DELETED then CREATED even though ZooKeeper restarts its version at 0, and a duplicate
  of either is dropped (``_notify``). One map: a map of creation zxids beside it held
  another entry per node;
- ``_known`` and ``root`` hold the caller's paths (the namespace cut off), the
  ``str`` the cache and kazoo's tables (``zookeeper_watchers``) key the node by too; the
  server's path is made per request (``_server``), since one kept per node, and its
  entry in the table of interned strings, cost about 1 KiB a job;
- parents are reported before their children, deletions deepest first, with no index of
  children (``_drop``);
- an absent root whose exists watch fired, and which is gone again by its read, is
  reported DELETED (``_came_and_went``): it was there in between;
- a cancelled (or failed-to-start) registration ignores every later notification;
- notifications whose reads the connection's drop interrupted are kept and handled
  after the reconnect (``resume``): their watches fired, so no re-arm reports them again;
- an excluded node (the watch's ``exclude``) is never read, so nothing below it is armed;
  a leaf (the watch's ``leaves``) is read, but never listed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import NoAuthError
from kazoo.exceptions import NoNodeError as KzNoNode
from kazoo.protocol.states import EventType

from registry.backends.base import BaseRegistry
from registry.backends.watch_registration import WatchRegistration
from registry.backends.zookeeper_io import ZkIO, is_connection_failure, visible_child_paths, visible_children
from registry.backends.zookeeper_rewatch import Rearm, rearm
from registry.backends.zookeeper_watchers import follow, released, unfollow
from registry.paths import ancestors, join, parent, shared
from registry.protocol import Event, EventKind, Node

__all__ = ["TreeWatcher"]

log = logging.getLogger("registry.zookeeper")

_SYNC_ATTEMPTS = 3
#: seconds between two tries of a resync that failed while connected (doubling, capped)
_RESYNC_BACKOFF = 0.05
_RESYNC_BACKOFF_MAX = 2.0
#: a batch of one read (a lone change, a lone new leaf: the steady state's usual batch)
#: goes as a read that arms its own watch: one request, where a multiRead and its
#: SetWatches are two. False sends it as any batch (tests of that path)
_WATCHED_LONE_READ = True


def _deepest_first(path: str) -> tuple[int, str]:
    return (-path.count("/"), path)


class TreeWatcher:
    """The watches of one registration. Every method but ``on_*`` runs on the worker."""

    def __init__(
        self,
        owner: BaseRegistry,
        io: ZkIO,
        registration: WatchRegistration,
        submit: Callable[[Callable[[], None]], None],
    ) -> None:
        self._owner = owner
        self._io = io
        self.registration = registration
        #: the namespace: caller's paths to the server's (per request) and back
        self._namespace = owner._ns.prefix
        self._server = owner._ns.to_server_valid
        self._client = owner._ns.to_client
        self.root = self._client(registration.root)
        self._submit = submit
        self.synced = False  # the initial read is done: notifications may be acted on
        self.dead = False  # failed to start or cancelled
        #: notifications not yet handled: (is a child event, event type, path)
        self._events: list[tuple[bool, Any, str]] = []
        self._events_lock = threading.Lock()
        self._drain_scheduled = False
        #: the absent root's exists watch fired (it was created) and it is not read yet
        self._root_came = False
        #: kazoo keeps the callback of every watch it arms: one bound method for all of
        #: them, not one made per read
        self.data_callback: Callable[[Any], None] = self.on_data
        self.child_callback: Callable[[Any], None] = self.on_child
        # the client's tables keep no entry for the paths this watch follows
        # (``zookeeper_watchers.follow``): one a node, all alike, where its callbacks are
        # all the entry would hold
        follow(io.client, self)

    @property
    def _known(self) -> dict[str, int]:
        """caller's path -> stamp (``_stamp``) of every node reported: the registration's
        map, which ``_notify`` and ``_resync`` keep (and ``_resync`` replaces)."""
        return self.registration.versions

    @property
    def usable(self) -> bool:
        return self.synced and not self.dead and self.registration.watch.active

    def has_reported(self, stored_path: str) -> bool:
        """The node exists as far as this watch has reported (any thread may ask: one
        lookup in a dict only the worker changes)."""
        return self._client(stored_path) in self._known

    # -- the client's tables (``zookeeper_watchers.Follower``) ----------------------------
    def follows(self, key: str, child: bool) -> bool:
        """A watch of ``key`` (a caller's path) may be ours: a node we cover, and for a child
        watch, not a leaf. Asked on kazoo's connection thread; dict lookups and the
        watch's predicates only (``covers`` memoizes what it leaves out)."""
        if self.dead:
            return False
        registration = self.registration
        stored = None
        if key not in self._known:
            stored = self._server(key)
            if not registration.covers(stored):
                return False
        if not child or registration.leaf is None:
            return True
        return not registration.leaf(self._server(key) if stored is None else stored)

    def followed(self, child: bool) -> list[str]:
        """The paths this watch keeps a ``child`` (else data) watch on: ``armed()``'s."""
        if self.dead:
            return []
        known = list(self._known)
        if not known:
            return [] if child else [self.root]  # the absent root's exists watch
        leaf = self.registration.leaf
        if not child or leaf is None:
            return known
        return [key for key in known if not leaf(self._server(key))]

    # -- kazoo's event thread: never block, only hand over ----------------------------
    def on_data(self, event: Any) -> None:
        if event.type == EventType.NONE or self.dead:
            return  # NONE: kazoo dropping its watches on disconnect; the resync follows
        self._enqueue(False, event.type, self._client(event.path))

    def on_child(self, event: Any) -> None:
        if event.type != EventType.CHILD or self.dead:
            return  # a deleted node's child watch: its data watch reports the deletion
        self._enqueue(True, event.type, self._client(event.path))

    def _enqueue(self, child: bool, event_type: Any, path: str) -> None:
        with self._events_lock:
            self._events.append((child, event_type, path))
            if self._drain_scheduled:
                return  # the drain already on the worker's queue takes this one too
            self._drain_scheduled = True
        self._submit(self._drain)

    # -- worker -------------------------------------------------------------------------
    def sync(self, emit: bool) -> None:
        """Read the whole subtree, re-arming every watch, and report what changed.

        Raises on failure without touching the registration's state.
        """
        found = self._scan([self.root])
        for _ in range(_SYNC_ATTEMPTS):
            if found:
                break
            # root absent: watch for its creation; if it appeared meanwhile, read again
            exists = self._io.client.exists_async(self._server(self.root), watch=self.data_callback)
            if self._io.wait(exists, self._io.read_deadline()) is None:
                break
            found = self._scan([self.root])
        fresh = {shared(path): czxid for path, _, czxid in found}
        # this watch answers for them now
        self._io.known_parents.difference_update(map(self._server, fresh))
        # a node made again since it was reported: DELETED now, CREATED by the resync
        stale = [p for p, stamp in self._known.items() if fresh.get(p) != _czxid(stamp)]
        for path in sorted(stale, key=_deepest_first):
            self._owner._notify(self.registration, EventKind.DELETED, self._server(path), None)
        stored = [(self._server(path), node, czxid) for path, node, czxid in found]
        self._owner._resync(
            self.registration,
            {path: node for path, node, _ in stored},
            emit=emit,
            stamps={path: _stamp(czxid, node.version) for path, node, czxid in stored},
        )
        self.synced = True

    def armed(self) -> Rearm:
        """The watches this registration keeps armed at the server: a data and a child
        watch on every node it has reported (no child watch on a leaf), or an exists
        watch on its absent root."""
        rearm = Rearm(self.data_callback, self.child_callback)
        if not self._known:
            rearm.exist.append(self._server(self.root))
            return rearm
        leaf = self.registration.leaf
        rearm.data = list(map(self._server, self._known))
        rearm.child = [path for path in rearm.data if leaf is None or not leaf(path)]
        return rearm

    def resume(self) -> None:
        """After a reconnect: handle the notifications the drop interrupted."""
        with self._events_lock:
            if not self._events or self._drain_scheduled:
                return
            self._drain_scheduled = True
        self._submit(self._drain)

    def resync_after_gap(self) -> bool:
        """After a reconnect or a new session: every watch is gone, read everything again.

        Tried until it succeeds or the connection drops (the next reconnect schedules
        another): a watch given up on while connected would stay partly unarmed, its
        changes never seen. True once read, False when the connection dropped first."""
        attempt = 0
        while self.usable:
            try:
                self.sync(emit=True)
                self.resume()
                return True
            except Exception as exc:
                attempt += 1
                if not self._io.client.connected:
                    log.warning(
                        "watch %s: resync failed (%s); the reconnect reads it again",
                        self.registration.watch.path, type(exc).__name__,
                    )  # fmt: skip
                    return False
                if attempt >= _SYNC_ATTEMPTS:
                    log.warning(
                        "watch %s: resync failed %d times (%s); trying again",
                        self.registration.watch.path, attempt, type(exc).__name__,
                    )  # fmt: skip
                time.sleep(min(_RESYNC_BACKOFF_MAX, _RESYNC_BACKOFF * 2**attempt))
        return True  # cancelled: nothing left to read

    def forget(self) -> None:
        """Cancelled: drop our callbacks from kazoo's tables so the watcher can be freed.

        kazoo keeps a one-shot watch's callback until the node changes, which for a quiet
        node is forever; it offers no call to remove one (ZooKeeper's removeWatches is not
        in kazoo 2.11), so this reaches into its tables, tolerating their absence.
        """
        self.dead = True
        unfollow(self._io.client, self)
        tables = [
            getattr(self._io.client, "_data_watchers", None),
            getattr(self._io.client, "_child_watchers", None),
        ]
        for path in map(self._server, [self.root, *self._known]):
            for table in tables:
                callbacks = table.get(path) if table is not None else None
                if callbacks:
                    callbacks.discard(self.data_callback)
                    callbacks.discard(self.child_callback)
        self._known.clear()

    def _drain(self) -> None:
        with self._events_lock:
            events, self._events = self._events, []
            self._drain_scheduled = False  # a notification from now on schedules the next batch
        if not events or not self.usable:
            return
        try:
            self._handle(events)
        except Exception as exc:
            if not self._io.client.connected and is_connection_failure(exc):
                with self._events_lock:  # handled again after the reconnect (``resume``)
                    self._events[:0] = events
                return
            # a watch may be left unarmed: read the subtree again to re-arm it
            log.warning(
                "watch %s: handling %d change(s) failed (%s); resynchronising",
                self.registration.watch.path,
                len(events),
                type(exc).__name__,
            )
            self.resync_after_gap()

    def _handle(self, events: list[tuple[bool, Any, str]]) -> None:
        """Handle a batch of notifications (module docstring: reads applied in order)."""
        # 1. The first read of each, which arms its watch again (``_read_and_arm``). A read
        # is skipped where the node is not known now: it cannot become known before its
        # answer would be applied (only step 3 adds nodes).
        wanted = [(child, path) for child, _, path in events if path in self._known]
        answered = iter(self._read_and_arm(wanted))
        answers = [next(answered) if path in self._known else None for _, _, path in events]
        # 2. The answers, in the notifications' order; new nodes are only noted
        adopt: list[str] = []
        for (child, event_type, path), answer in zip(events, answers, strict=True):
            if child:
                self._apply_children(path, answer, adopt)
            else:
                self._apply_data(path, event_type, answer, adopt)
        # 3. The new subtrees, read after every answer above was applied
        if adopt:
            self._adopt(_outermost(adopt))

    def _read_and_arm(self, reads: list[tuple[bool, str]]) -> list[Any]:
        """The answer to each ``(children, path)`` of ``reads``, its watch armed: in
        multiReads, and then the watches of what they read armed by SetWatches relative to
        their first answer's zxid (as ``_scan``). A lone read (a lone change, the steady
        state's usual batch) goes as a read that arms its own watch (``_WATCHED_LONE_READ``)."""
        if len(reads) == 1 and _WATCHED_LONE_READ:
            children, path = reads[0]
            callback = self.child_callback if children else self.data_callback
            return [self._io.watched_read(self._server(path), children, callback)]
        answers: list[Any] = []
        zxids: list[int] = []
        armed = Rearm(self.data_callback, self.child_callback)
        server = self._server
        for (children, _), (path, got, names) in zip(
            reads,
            self._io.multi_read([(server(path), not children, children) for children, path in reads], zxids=zxids),
            strict=True,
        ):
            answer = names if children else got
            answers.append(answer)
            if not isinstance(answer, Exception):
                (armed.child if children else armed.data).append(path)
        if zxids:
            rearm(self._io.client, min(zxids), [armed], self._io.wait_answer)
        return answers

    def _apply_children(self, path: str, answer: Any, adopt: list[str]) -> None:
        """``answer``: the child names read, the read's exception, or None (not read)."""
        if answer is None or path not in self._known or isinstance(answer, KzNoNode):
            return  # not read, or deleted since: its data watch reports it
        if isinstance(answer, Exception):
            raise answer
        # Hazard: a parent of N jobs is listed again whenever jobs are added, so a start
        # of N jobs lists N names hundreds of times. The trick: one lookup per name, and
        # the watch's predicate on new names only (no known node is excluded). A known
        # child missing from the listing is not dropped here: its own data watch reports
        # its deletion (every known node has one armed, or its re-read under way).
        known = self._known
        new = sorted(c for c in visible_child_paths(path, answer, namespace=self._namespace) if c not in known)
        excluded = self.registration.excluded
        adopt.extend(new if excluded is None else [c for c in new if not excluded(self._server(c))])

    def _apply_data(self, path: str, event_type: Any, answer: Any, adopt: list[str]) -> None:
        """``answer``: ``(value, ZnodeStat)``, the read's exception, or None (not read)."""
        if event_type == EventType.DELETED:
            self._drop(path, below=False)
        # Read it again even after a deletion: it may exist anew, and the parent's child
        # event that announced it may already have been handled while it still looked
        # like the old node (a child list gives names, not identities).
        if path != self.root and parent(path) not in self._known:
            return  # below a deleted node: the parent's child watch covers a re-creation
        known = self._known.get(path)
        if known is None or answer is None:
            if path == self.root and known is None and event_type == EventType.CREATED:
                self._root_came = True
            adopt.append(path)
            return
        if isinstance(answer, KzNoNode):
            self._drop(path)
            if path == self.root:
                adopt.append(path)
            return
        if isinstance(answer, Exception):
            raise answer
        data, stat = answer
        if stat.czxid != _czxid(known):
            self._drop(path)
            adopt.append(path)
            return
        self._owner._notify(
            self.registration, EventKind.UPDATED, self._server(path), _node(data, stat), _stamp(stat.czxid, stat.version)
        )

    def _adopt(self, paths: list[str]) -> None:
        """Read new nodes and everything below them, arm their watches, report them."""
        found = self._scan(paths)
        if self.root in paths and not any(p == self.root for p, _, _ in found):
            exists = self._io.client.exists_async(self._server(self.root), watch=self.data_callback)
            if self._io.wait(exists, self._io.read_deadline()) is not None:
                found = self._scan(paths)
        if self.root in paths:
            came, self._root_came = self._root_came, False
            if came and self.root not in self._known and not any(p == self.root for p, _, _ in found):
                self._came_and_went()
        for path, node, czxid in found:
            if path != self.root and parent(path) not in self._known:
                continue  # its parent vanished between the reads
            previous = self._known.get(path)
            if previous is not None and _czxid(previous) != czxid:
                self._drop(path)
            path = shared(path)
            stored = self._server(path)
            self._io.known_parents.discard(stored)  # this watch answers for it now
            self._owner._notify(self.registration, EventKind.CREATED, stored, node, _stamp(czxid, node.version))

    def _came_and_went(self) -> None:
        """The root was created and deleted before its read: report it DELETED, though
        never reported CREATED (what it held is gone with it).

        Hazard: a one-shot watch hears of a change and reads the node afterwards, so a node
        that came and went in between is otherwise never reported at all; a watch of one
        node (an election's of its leader node) would miss that its node went. Here the
        exists watch that fired is the proof that it came. Below the root the proof is a
        parent's child watch, which names no child: such a node stays unreported."""
        registration = self.registration
        with registration.lock:  # in order with ``_notify``'s events, as they are sent
            gone = Event(EventKind.DELETED, registration.to_client(registration.root), None, None)
            self._owner._deliver(registration, [gone])

    def _drop(self, path: str, *, below: bool = True) -> None:
        """Report ``path`` deleted, and with ``below`` every known node below it before it,
        deepest first.

        Invariant: deletions are reported deepest first, with no index of children. A
        node's NodeDeleted (``below=False``) comes after those of its children: ZooKeeper
        deletes a node only once it has none, and sends each child's event first (a child
        whose watch had fired is read again in the same or an earlier batch, answers
        NoNode, and is dropped in order). A read that finds a node gone or made again
        (``below=True``) may come before its children's events, so the known nodes below
        it are found by a pass over the known paths: O(known nodes), for a node that is
        not a leaf (a leaf has none), on a path that is rare (a parent changed, then
        deleted, before its read). An index of children kept for it cost 3 MiB at 10,000
        jobs."""
        if path not in self._known:
            return
        gone = [path]
        leaf = self.registration.leaf
        if below and (leaf is None or not leaf(self._server(path))):
            prefix = path if path.endswith("/") else path + "/"
            gone.extend(p for p in self._known if p.startswith(prefix) and p != path)
        for current in sorted(gone, key=_deepest_first):
            self._owner._notify(self.registration, EventKind.DELETED, self._server(current), None)
            released(self._io.client, self, current)

    def _watched_children(self, path: str, names: list[str]) -> list[str]:
        """The children to read and arm: excluded subtrees are never read, so they cost
        no watch and no re-read when they change (the parent's child watch still fires
        when one is created or deleted, once)."""
        children = [join(path, n) for n in visible_children(path, names, namespace=self._namespace)]
        excluded = self.registration.excluded
        if excluded is None:
            return children
        return [c for c in children if not excluded(self._server(c))]

    def _scan(self, starts: list[str]) -> list[tuple[str, Node, int]]:
        """Read ``starts`` and their subtrees, level by level, and arm a data watch on each
        node read and a child watch on each but the watch's leaves (whose children it
        leaves out). Returns (path, node, czxid) of each, parents first.

        The reads go in multiReads (``ZkIO.multi_read``), which arm nothing; the watches
        are armed afterwards by SetWatches (``zookeeper_rewatch.rearm``) relative to the
        zxid of the first multiRead's answer: the last change the server had applied when
        it began those reads (``zookeeper_wire.EncodedMultiRead``). Every change after it
        to a node read is reported by the server at once, as the watch it armed would have
        fired, so nothing between a read and its arming goes unseen; a change that a later
        read already saw may come once more, and is read again for nothing. (Relative to
        the zxid the client saw before the reads, every change that set off the reads came
        again, and a batch of notifications was read twice.) A few requests per 250 nodes,
        where a read per node armed its watch."""
        leaf, server = self.registration.leaf, self._server
        if len(starts) == 1 and _WATCHED_LONE_READ and leaf is not None and leaf(server(starts[0])):
            # a lone new leaf (an instance joining a job): one read, as ``_read_and_arm``
            (got,) = self._read_and_arm([(False, starts[0])])
            if isinstance(got, (KzNoNode, NoAuthError)):
                return []
            if isinstance(got, Exception):
                raise got
            data, stat = got
            return [(starts[0], _node(data, stat), stat.czxid)]
        zxids: list[int] = []
        found: list[tuple[str, Node, int]] = []
        level = list(starts)
        while level:
            next_level: list[str] = []
            reads = [(server(p), True, leaf is None or not leaf(server(p))) for p in level]
            for path, (_, got, names) in zip(level, self._io.multi_read(reads, zxids=zxids), strict=True):
                if isinstance(got, (KzNoNode, NoAuthError)):
                    continue  # gone, or not ours to read: skip it and what is below
                if names is None:
                    names = []  # a leaf: not listed
                elif isinstance(names, (KzNoNode, NoAuthError)):
                    names = []  # deleted since the data read: its data watch reports it
                for answer in (got, names):
                    if isinstance(answer, Exception):
                        raise answer
                data, stat = got
                children = self._watched_children(path, names)
                found.append((path, _node(data, stat), stat.czxid))
                next_level.extend(children)
            level = next_level
        armed = Rearm(self.data_callback, self.child_callback)
        armed.data = [server(path) for path, _, _ in found]
        armed.child = [path for path in armed.data if leaf is None or not leaf(path)]
        if zxids:
            rearm(self._io.client, min(zxids), [armed], self._io.wait_answer)
        return found


def _outermost(paths: list[str]) -> list[str]:
    """``paths`` without repeats and without those below another of them (a scan of a
    node reads its subtree), in their first order."""
    unique = list(dict.fromkeys(paths))
    chosen = set(unique)
    below_root = "/" in chosen  # ancestors() leaves the root out
    return [p for p in unique if not (p != "/" and below_root) and not any(a in chosen for a in ancestors(p))]


def _stamp(czxid: int, version: int) -> int:
    """A node's creation zxid and version in one int (``_known``): its version alone
    starts again at 0 when the node is made again."""
    return czxid << 32 | version


def _czxid(stamp: int | None) -> int | None:
    return None if stamp is None else stamp >> 32


def _node(data: bytes | None, stat: Any) -> Node:
    return Node(data or b"", stat.version, stat.ephemeralOwner != 0)
