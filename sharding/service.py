"""The sharding service of one job on one instance: the composition of the pieces that
make a job sharded, and the read side they share.

- ``Membership`` (``sharding.membership``): this instance's and its server's nodes.
- ``LeaderElection`` (``registry.recipes.election``): who leads the job.
- ``Resharding`` (``sharding.resharding``): the leader's side, from the flag to the new
  assignment; its module tells how a resharding goes.
- ``RunMarks`` (``sharding.run_marks``): the fenced running marks, one per fire.

The service follows the job's nodes in one local cache (every read here is from it, no
round trip), schedules an evaluation on each change that may alter the assignment's basis,
and registers again when its own node vanishes. Steady state costs no reads; a run costs
two writes: the fenced mark and its removal.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from registry.errors import NoNodeError, RegistryError, TransactionError
from registry.paths import is_below, parent
from registry.protocol import Check, Delete, Event, EventKind, Node, RegistryCenter, SessionState
from registry.recipes.batch import Commit
from registry.recipes.cache import TreeCache
from registry.recipes.election import LeaderElection
from registry.recipes.versioned import update
from sharding.assignment import Assignment, AssignmentState, CorruptNodeError
from sharding.errors import ShardingError, ShardingTimeout
from sharding.failover import FailoverEntry, RunTrace
from sharding.instance import InstanceIdentity
from sharding.job_state import JobState, disabled_items, instance_record, server_status
from sharding.layout import JobPaths, is_leaf, is_running_marks
from sharding.membership import Membership
from sharding.operations import plan_items, plan_servers
from sharding.resharding import JobHooks, Resharding
from sharding.run_marks import CurrentAssignment, RunMark, RunMarks
from sharding.settings import ShardingSettings

__all__ = ["ShardingService", "ShardingSettings"]


class Submits(Protocol):
    """Where evaluations and reshardings run: a ``concurrent.futures.Executor`` or any
    pool whose ``submit`` raises ``RuntimeError`` once it is shut down."""

    def submit(self, fn: Callable[[], object], /) -> object: ...


log = logging.getLogger("sharding")

class _Phase(enum.Enum):
    NEW = "new"
    #: registering and joining the election: changes are not reacted to yet
    JOINING = "joining"
    JOINED = "joined"
    #: leaving: no reaction, no resharding, no registration again
    STOPPING = "stopping"


class ShardingService:
    """Sharding of ``job`` as seen from ``identity``; see the module docstring."""

    # one per job, thousands per process: no attribute dict (a new attribute goes here)
    __slots__ = (
        "_assignment_listeners",
        "_cache",
        "_cancelled",
        "_commit",
        "_decoded",
        "_election",
        "_evaluation_pending",
        "_executor",
        "_follow",
        "_last_ready",
        "_max_epoch",
        "_on_leading",
        "_own_cache",
        "_phase",
        "_reg",
        "_rejoin",
        "_reported_corrupt",
        "_resharding",
        "_settings",
        "_state_lock",
        "identity",
        "marks",
        "membership",
        "paths",
        "wait_timeout",
    )

    def __init__(
        self,
        reg: RegistryCenter,
        job: str,
        identity: InstanceIdentity,
        settings: ShardingSettings,
        *,
        executor: Submits,
        rejoin: Callable[[Callable[[], object]], object] | None = None,
        cache: TreeCache | None = None,
        wait_timeout: float = 30.0,
        hooks: JobHooks | None = None,
        commit: Commit | None = None,
        on_leading: Callable[[Sequence[Check]], object] | None = None,
        paths: JobPaths | None = None,
        cancelled: Callable[[], bool] | None = None,
        follow: bool = True,
    ) -> None:
        self._reg = reg
        #: False: the owner hands this service every change under the job's root
        #: (``on_change``) and every session change (``on_session``), from ``start()`` until
        #: ``stop()`` returns; a scheduler's jobs are followed by one listener of each kind
        #: (``scheduler.job_events``), where a bound method and a table entry per job each
        #: were held
        self._follow = follow
        #: the owner is shutting down (before ``stop()``): a registration under way ends
        self._cancelled = cancelled
        # called with this leader's fence on each evaluation it leads: the namespace's
        # layout upgrade (``sharding.layout_version.LayoutUpgrader``) rides on it
        self._on_leading = on_leading
        # registration, election, leaving and resharding transactions: a scheduler's group
        # commit, so N jobs starting, stopping or resharding together share round trips
        self._commit = reg.transaction if commit is None else commit
        if paths is not None and paths.job != job:
            raise ValueError(f"paths of job {paths.job!r} given for job {job!r}")
        # the caller's, when it has them: each JobPaths holds every path it has built
        self.paths = JobPaths(job) if paths is None else paths
        self.identity = identity
        self._settings = settings
        self._executor = executor
        # where a new session's (or a vanished node's) re-registration and campaign run:
        # many jobs of one process rejoin at once, and on ``executor``'s few threads each
        # waited its turn for round trips while their fires waited on those same threads
        self._rejoin = executor.submit if rejoin is None else rejoin
        self._own_cache = cache is None
        self._cache = (
            cache if cache is not None else TreeCache(reg, self.paths.root, exclude=is_running_marks, leaves=is_leaf)
        )
        if not is_below(self.paths.root, self._cache.root):
            raise ValueError(f"cache of {self._cache.root} does not cover job {job}")
        self.wait_timeout = wait_timeout
        self.membership = Membership(
            reg, self.paths, identity, self._cache, commit=self._commit, owner=self
        )
        self._state_lock = threading.Lock()
        #: the highest epoch seen: a new assignment's epoch goes above it even when the node
        #: read is older or corrupt (``Resharding``)
        self._max_epoch = 0
        #: the assignment last decoded, READY or not, at its version: ``_ready`` hands the
        #: same object out while it is READY (a tuple beside it was 72 bytes a job)
        self._decoded: CurrentAssignment | None = None
        self._last_ready: CurrentAssignment | None = None
        self._evaluation_pending = False
        self._phase = _Phase.NEW
        self._reported_corrupt: set[tuple[str, int]] | None = None  # made on first use
        # a tuple, replaced when one is added (once, at a runner's start): a list per job
        # was 88 bytes for its one listener
        self._assignment_listeners: tuple[Callable[[], None], ...] = ()
        #: this instance's running mark: the fencing point of every run
        self.marks = RunMarks(reg, self.paths, identity.instance_id, self._cache, self)
        self._election = LeaderElection(
            reg,
            self.paths.leader,
            identity.instance_id,
            on_elected=self._on_elected,
            cache=self._cache,
            commit=self._commit,
            # off the registry's shared threads when given a pool (``LeaderElection``); never
            # ``executor``: a fire or a resharding waiting there must not queue ahead of the
            # campaign that makes a leader
            defer=rejoin,
            # its changes come through this service's listeners (``on_change``,
            # ``on_session``): no bound method and table entry of its own per job
            follow=False,
        )
        self._resharding = Resharding(
            self,
            reg,
            self._cache,
            self._election,
            commit=self._commit,
            hooks=hooks,
        )

    @property
    def stopping(self) -> bool:
        """The service is leaving (``stop()``): it reacts to nothing more."""
        return self._phase is _Phase.STOPPING

    def leaving(self) -> bool:
        """Stopped, or its owner is shutting down: no registration is wanted any more
        (``MembershipOwner``)."""
        return self._phase is _Phase.STOPPING or (self._cancelled is not None and self._cancelled())

    # -- lifecycle ----------------------------------------------------------------------
    @property
    def job(self) -> str:
        return self.paths.job

    @property
    def settings(self) -> ShardingSettings:
        return self._settings

    @property
    def is_leader(self) -> bool:
        return self._election.is_leader

    @property
    def cache(self) -> TreeCache:
        return self._cache

    @property
    def leader_version(self) -> int | None:
        """The version of the leader node this instance created (its term), if leader."""
        return self._election.leader_version

    @property
    def registered(self) -> bool:
        """This instance's node, as last written by it, is in the registry (per the cache)."""
        return self.membership.registered

    def start(self, *, server_enabled: bool = True) -> None:
        """Register this instance (and its server), join the election."""
        if self._phase is not _Phase.NEW:
            return
        self._phase = _Phase.JOINING
        if self._own_cache:
            self._cache.start()
        if self._follow:
            self._cache.add_listener(self.on_change, under=self.paths.root)
            self._reg.add_listener(self.on_session)
        enabled = self.membership.join(server_enabled=server_enabled)
        self._election.start(participate=enabled)
        with self._state_lock:
            if self._phase is _Phase.JOINING:
                self._phase = _Phase.JOINED
        self.schedule_evaluation()

    def stop(self) -> None:
        """Leave at once: hand leadership over and remove this instance's nodes, so the
        others reshard without waiting for any timeout."""
        if self._phase in (_Phase.NEW, _Phase.STOPPING):
            return
        self._phase = _Phase.STOPPING
        try:
            # leave membership first, so the next leader computes without this instance;
            # with failover, leave the last fire behind so the fires until the hand-over
            # are covered (the leader removes the trace when it reshards)
            self._election.withdraw()
            running, last_fire = self.marks.path, self.marks.last_fire
            if self._settings.failover and last_fire is not None:
                self._reg.put(running, RunTrace("left", (), last_fire).encode())
            elif self.marks.may_be_in_place():
                # a delete of an absent mark fails the shared transaction it is in: one
                # round trip per job if every leaving job sent it
                self._delete(running)
            self.membership.leave()
            self._election.stop()
        except RegistryError:
            log.warning("job %s: leaving the registry cleanly failed; the session's end will", self.job)
        finally:
            # only now: until it stopped, the election followed its node through them
            if self._follow:
                self._cache.remove_listener(self.on_change, under=self.paths.root)
                self._reg.remove_listener(self.on_session)
        if self._own_cache:
            self._cache.close()

    def _delete(self, path: str) -> None:
        try:
            self._commit([Delete(path)])
        except TransactionError as exc:
            if not isinstance(exc.cause, NoNodeError):
                raise

    def update_settings(self, settings: ShardingSettings) -> None:
        """New total count, strategy or flags (e.g. from a config change)."""
        with self._state_lock:
            self._settings = settings
        self.schedule_evaluation()

    def add_assignment_listener(self, listener: Callable[[], None]) -> None:
        """Called (on the registry's event thread) whenever the job's assignment node
        changes; a listener already added is not added again."""
        with self._state_lock:
            if listener not in self._assignment_listeners:
                self._assignment_listeners = (*self._assignment_listeners, listener)

    # -- reads (from the cache: no round trip) ------------------------------------------
    def online_instances(self) -> list[str]:
        return self._cache.children(self.paths.instances)

    def server_enabled(self, ip: str) -> bool:
        """A server with no status node, or one that does not decode, counts as enabled."""
        path = self.paths.server(ip)
        node = self._cache.get_node(path)
        if node is None:
            return True
        try:
            return server_status(path, node.value).enabled
        except CorruptNodeError as exc:
            self.report_corrupt(path, node.version, exc.problem)
            return True

    def available_instances(self) -> list[str]:
        """Online instances on enabled servers, in ElasticJob's order: descending strings."""
        available = []
        for instance_id in self.online_instances():
            ip = instance_record(instance_id, self._cache.get(self.paths.instance(instance_id))).ip
            if self.server_enabled(ip):
                available.append(instance_id)
        return sorted(available, reverse=True)

    def disabled_items(self) -> set[int]:
        path = self.paths.disabled_items
        node = self._cache.held(path)
        if node is None:
            return set()
        try:
            return set(disabled_items(path, node.value))
        except CorruptNodeError as exc:
            self.report_corrupt(path, node.version, exc.problem)
            return set()

    def resharding_pending(self) -> bool:
        """A resharding is flagged or under way (dataflow streaming stops for it)."""
        return self._ready() is None

    def current(self) -> Assignment | None:
        """The assignment as cached (READY or not); None when absent or corrupt."""
        node = self._cache.get_node(self.paths.assignment)
        return None if node is None else self.decode_assignment(node)

    def leader(self) -> str | None:
        raw = self._cache.get(self.paths.leader)
        return None if raw is None else raw.decode(errors="replace")

    def decode_assignment(self, node: Node) -> Assignment | None:
        """The assignment ``node`` holds, or None when it is corrupt (reported once)."""
        memo = self._decoded
        if memo is not None and memo.version == node.version:
            return memo.assignment
        try:
            assignment = Assignment.decode(self.paths.assignment, node.value)
        except CorruptNodeError as exc:
            self.report_corrupt(self.paths.assignment, node.version, exc.problem)
            return None
        self._decoded = CurrentAssignment(assignment, node.version)
        self.saw_epoch(assignment.epoch)
        return assignment

    def saw_epoch(self, epoch: int) -> None:
        """An assignment of ``epoch`` was read or written: the next one goes above it."""
        with self._state_lock:
            self._max_epoch = max(self._max_epoch, epoch)

    def epoch_floor(self) -> int:
        """The highest epoch this instance has seen."""
        return self._max_epoch

    # bound methods, not lambdas, for the per-job callbacks: a closure costs three times the
    # memory, and every job of the process holds them
    @property
    def registration_version(self) -> int | None:
        """This instance's registration node's version as it wrote it (``RunMarks``)."""
        return self.membership.version

    @property
    def marks_persist(self) -> bool:
        """Failover is on: a run's mark is persistent, so a crash leaves its trace."""
        return self._settings.failover

    def report_corrupt(self, path: str, version: int, problem: str) -> None:
        """Log a node of this job that does not decode, once per version; the leader's
        next resharding (or the owner's next write) rewrites it."""
        if self._reported_corrupt is None:
            self._reported_corrupt = set()
        if (path, version) not in self._reported_corrupt:
            self._reported_corrupt.add((path, version))
            log.error("job %s: corrupt registry node %s (%s); it will be rewritten", self.job, path, problem)

    def ready(self) -> CurrentAssignment | None:
        """The READY assignment, unflagged, from the cache — or None (no waiting)."""
        return self._ready()

    def _ready(self) -> CurrentAssignment | None:
        version = self._cache.version(self.paths.assignment)
        if version is None or self._cache.held(self.paths.necessary) is not None:
            return None
        last = self._last_ready
        if last is not None and last.version == version:
            return last  # asked on every fire: the same answer until the node changes
        node = self._cache.get_node(self.paths.assignment)
        if node is None:
            return None
        assignment = self.decode_assignment(node)
        if assignment is None or assignment.state is not AssignmentState.READY:
            return None
        memo = self._decoded
        fresh = memo is not None and memo.assignment is assignment and memo.version == node.version
        self._last_ready = memo if fresh else CurrentAssignment(assignment, node.version)
        return self._last_ready

    # -- the run path ---------------------------------------------------------------------
    def ensure_ready(
        self, timeout: float | None = None, *, cancelled: Callable[[], bool] | None = None
    ) -> CurrentAssignment:
        """A READY assignment with no resharding pending; the leader reshards here when
        flagged, others wait by watch. ``ShardingTimeout`` after ``timeout``, or as soon as
        ``cancelled()`` says the caller gave up (a scheduler shutting down)."""
        bound = self.wait_timeout if timeout is None else timeout
        deadline = time.monotonic() + bound
        while True:
            ready = self._ready()
            if ready is not None:
                return ready
            if cancelled is not None and cancelled():
                raise ShardingTimeout(f"job {self.job}: waiting for an assignment cancelled")
            if self.is_leader:
                self._resharding.evaluate()
                if self.reshard():
                    continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                leader = self.leader() or "none"
                raise ShardingTimeout(
                    f"job {self.job}: no ready assignment within {bound:g}s (leader: {leader})"
                )
            self._cache.wait_until(lambda: self._ready() is not None, min(remaining, 0.5), under=self.paths.root)

    def local_items(self, current: CurrentAssignment) -> list[int]:
        """This instance's items in ``current``, minus disabled items."""
        disabled = self.disabled_items()
        return [i for i in current.assignment.items_of(self.identity.instance_id) if i not in disabled]

    def mark_running(
        self,
        current: CurrentAssignment,
        items: Sequence[int],
        fire_time: float,
        *,
        claimed: Sequence[FailoverEntry] = (),
    ) -> RunMark:
        """The fencing point, applied at once (``RunMarks``, module ``sharding.run_marks``):
        ``FencedOut`` if refused, and then nothing ran."""
        return self.marks.mark_running(current, items, fire_time, claimed=claimed)

    def failover_entries(self, current: CurrentAssignment) -> list[FailoverEntry]:
        """Queued failover work for the items this instance owns in ``current``."""
        node = self._cache.get_node(self.paths.failover_items)
        if node is None:
            return []
        return self.marks.queue(node).for_items(self.local_items(current))

    def queue_failover(self, entries: Sequence[FailoverEntry], why: str) -> int:
        """Add ``entries`` to the failover queue: one versioned write, as the leader's and
        the claimers' are, so none of their changes is lost (the item's owner in the
        current assignment runs each). Returns how many were queued; a registry that
        fails leaves them unqueued, logged with ``why``."""
        if not entries:
            return 0
        path = self.paths.failover_items
        total = self._settings.total
        pairs = sorted((e.item, e.fire_time) for e in entries)
        try:
            update(
                self._reg,
                lambda: self._reg.get_node(path),
                lambda node: self.marks.queue_additions(node, entries, total),
                what=f"queue {path}",
                commit=self._commit,
            )
        except (RegistryError, ShardingError) as exc:
            log.error("job %s: (item, fire) %s %s, not queued for failover: %s", self.job, pairs, why, exc)
            return 0
        log.warning("job %s: (item, fire) %s %s: queued for failover", self.job, pairs, why)
        return len(entries)

    def clear_running(self, mark: RunMark) -> None:
        self.marks.clear_running(mark)

    @property
    def mark_in_doubt(self) -> bool:
        """True while a write of this instance's running mark ended with an unknown
        outcome: the mark may be there with nothing running (see ``remove_stale_mark``)."""
        return self.marks.in_doubt

    def remove_stale_mark(self) -> bool:
        """Remove this instance's running mark if a write in doubt may have left it; the
        caller guarantees it runs nothing of this job. True once nothing is in doubt."""
        return self.marks.remove_stale_mark()

    def running_instances(self) -> list[str]:
        """Instances holding a running mark, read from the registry (one round trip):
        caches leave running marks out (``layout.is_running_marks``)."""
        return self._reg.children(self.paths.running)

    # -- operations -------------------------------------------------------------------
    def set_server_enabled(self, ip: str, enabled: bool) -> None:
        """Enable or disable server ``ip`` for this job: one versioned write."""
        update(
            self._reg,
            lambda: JobState.read(self._reg, self.job),
            lambda state: plan_servers(state, [ip], enabled),
            what=f"job {self.job}: server {ip}",
        )

    def set_items_disabled(self, items: Sequence[int], disabled: bool) -> None:
        """Disable (or enable) ``items`` of this job: ONE write at the version read from the
        registry (not the cache), made again on a race, so a concurrent change is never lost."""
        update(
            self._reg,
            lambda: JobState.read(self._reg, self.job),
            lambda state: plan_items(state, items, disabled, self._settings.total),
            what=f"job {self.job}: disabled items",
        )

    def request_resharding(self, reason: str = "requested") -> None:
        self._reg.put(self.paths.necessary, reason.encode())

    # -- leader work (``sharding.resharding``) ------------------------------------------
    def reconcile(self) -> None:
        """Flag a resharding if the assignment no longer matches the cluster (e.g. it
        names an instance that is gone); the leader also keeps the job's servers tidy."""
        self._resharding.reconcile()

    def reshard(self) -> bool:
        """Leader: bring the assignment up to date. True when the assignment is READY
        and unflagged afterwards; False when not (or no longer) leader."""
        return self._resharding.reshard()

    # -- reactions ------------------------------------------------------------------------
    def schedule_evaluation(self) -> None:
        """Judge on ``executor`` whether the job needs resharding (at most one pending):
        after a change of the job's nodes, a new leadership or a resharding that raced."""
        with self._state_lock:
            if self._evaluation_pending or self._phase is not _Phase.JOINED:
                return
            self._evaluation_pending = True
        try:
            self._executor.submit(self._run_evaluation)
        except RuntimeError:  # executor shut down
            with self._state_lock:
                self._evaluation_pending = False

    def _run_evaluation(self) -> None:
        with self._state_lock:
            self._evaluation_pending = False
        try:
            self._follow_own_server()
            if self.is_leader and self._on_leading is not None:
                self._on_leading(self._election.fence_ops())
            if self.is_leader:
                # A flag this leader just wrote is acted on at once: waiting for its own
                # event to come back through the watch would delay every resharding by that
                # round trip, which grows with the load on the registry.
                flagged = self._resharding.evaluate()
                if flagged or self._cache.held(self.paths.necessary) is not None:
                    self.reshard()
        except ShardingError as exc:
            log.error("%s", exc)
        except RegistryError:
            log.warning("job %s: evaluation failed; retrying on the next change", self.job, exc_info=True)

    def _follow_own_server(self) -> None:
        """A disabled server gives up leadership and stops campaigning until enabled."""
        if self.stopping:
            return
        enabled = self.server_enabled(self.identity.ip)
        if not enabled and (self._election.is_leader or self._election_participating()):
            self._election.pause()
        elif enabled and not self._election_participating():
            self._election.resume()

    def _election_participating(self) -> bool:
        return self._election.participating

    def on_change(self, event: Event) -> None:
        """A change in the cache: its own listener's, or handed over by the owner of a
        service made with ``follow=False`` (ignored until ``start()``)."""
        if self._phase is _Phase.NEW or not is_below(event.path, self.paths.root):
            return
        if event.path == self.paths.leader:
            self._election.on_event(event)  # it follows its node through us (``follow``)
        if self.stopping:
            return  # leaving: nothing but the election reacts any more
        own_node_gone = event.path == self.membership.path and event.kind is EventKind.DELETED
        live = self._reg.state in (SessionState.CONNECTED, SessionState.RECONNECTED)
        if own_node_gone and live:
            # never shut down because our node vanished (ElasticJob does): register again
            self._rejoin_later()
        if event.path == self.paths.assignment:
            for listener in self._assignment_listeners:
                listener()
        if event.kind is EventKind.DELETED and parent(event.path) == self.paths.instances:
            self._resharding.marks_may_be_left()
        if is_below(event.path, self.paths.running) or is_below(event.path, self.paths.guarantee):
            return  # runs and their listeners' progress never change the assignment's basis
        self.schedule_evaluation()

    def on_session(self, state: SessionState) -> None:
        """A session change: its own listener's, or handed over (``follow=False``)."""
        if self._phase is _Phase.NEW:
            return
        if not self.stopping:
            if state is SessionState.LOST:
                self.membership.lost()  # no fire marks (to be refused) until registered again
            if state is SessionState.CONNECTED:
                self._rejoin_later()
        self._election.on_session(state)  # it follows the session through us (``follow``)

    def _rejoin_later(self) -> None:
        try:
            self._rejoin(self._reregister)
        except RuntimeError:  # the pool was shut down: the scheduler is stopping
            pass

    def _on_elected(self) -> None:
        self._resharding.marks_may_be_left()
        self.schedule_evaluation()

    def _reregister(self) -> None:
        if not self.stopping:
            self.membership.register_again()
