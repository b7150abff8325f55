"""The sharding service of one job on one instance: registration, leadership, resharding,
and the fenced running marks — written once on the registry protocol.

How a resharding goes (the leader only; any instance may raise the flag):

1. A change that alters the assignment's basis — instances joining or leaving, a server
   disabled or enabled, the total count, an assignment naming an instance that is gone, a
   corrupt or missing assignment — makes the leader put ``leader/sharding/necessary``.
2. The leader computes the new assignment (so a faulty strategy is rejected before
   anything is written), then FENCES: one transaction that checks its leadership and turns
   the assignment's state to RESHARDING. Every running mark is a transaction that checks
   the assignment's version, so from here no instance can start a run under the old epoch.
3. When execution is monitored it waits for the running marks to clear (runs finish; a
   dead instance's mark goes with its session).
4. It writes the new assignment, epoch + 1, in ONE transaction that checks leadership (a
   stale leader's write fails), replaces the assignment node, and deletes the flag at the
   version it read (a change that raised the flag again meanwhile makes it start over).

A job with no assignment node at all (a new job) skips steps 1 and 2: the missing node
is the flag, and no run can start without it; step 4 creates the node. A leader that
finds the assignment out of date while it reshards anyway (a restarted process at
``start()``) skips step 1: its fence is as durable a sign, and as binding on runs.

That is O(1) registry operations whatever the item and instance counts. Instances read
everything from one local cache of the job's subtree, so steady state costs no reads; a
run costs two writes: the fenced mark and its removal.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from registry.errors import NoNodeError, RegistryError, TransactionError
from registry.paths import is_below, parent
from registry.protocol import Check, Create, Delete, Event, EventKind, Node, RegistryCenter, SessionState, Set
from registry.recipes.batch import Commit
from registry.recipes.cache import TreeCache
from registry.recipes.election import LeaderElection
from registry.recipes.versioned import update
from sharding.assignment import Assignment, AssignmentState, CorruptNodeError, encode_items
from sharding.errors import ShardingError, ShardingTimeout
from sharding.failover import FailoverEntry, FailoverQueue, MissedFires, RunTrace, plan_entries
from sharding.instance import InstanceIdentity
from sharding.job_state import JobState, disabled_items, instance_record, server_status
from sharding.layout import JobPaths, is_leaf, is_running_marks
from sharding.membership import Membership
from sharding.operations import plan_items, plan_servers, plan_vacancies
from sharding.run_marks import CurrentAssignment, RunMark, RunMarks
from sharding.strategy_loader import check_assignment, get_strategy

__all__ = ["ShardingService", "ShardingSettings"]


class Submits(Protocol):
    """Where evaluations and reshardings run: a ``concurrent.futures.Executor`` or any
    pool whose ``submit`` raises ``RuntimeError`` once it is shut down."""

    def submit(self, fn: Callable[[], object], /) -> object: ...


log = logging.getLogger("sharding")

#: how long a leader waits for its cache to show its own last resharding before it judges
_CACHE_CATCH_UP = 2.0
#: departed instances handled per resharding transaction (the rest in the next round)
_MAX_DEPARTED_PER_RESHARD = 100


@dataclass(frozen=True)
class ShardingSettings:
    total: int
    strategy: str = "AVG_ALLOCATION"
    monitor_execution: bool = True
    static: bool = False
    #: keep running marks persistent and queue a departed instance's undone work
    failover: bool = False
    #: the leader's reconcile deletes ``servers/{ip}`` vacant this long (<= 0: never)
    server_expiry_seconds: float = 86_400.0

    def __post_init__(self) -> None:
        if isinstance(self.total, bool) or not isinstance(self.total, int) or self.total < 1:
            raise ValueError(f"sharding_total_count must be an int >= 1, got {self.total!r}")
        get_strategy(self.strategy)  # unknown names fail here, before anything is written


class _Phase(enum.Enum):
    NEW = "new"
    #: registering and joining the election: changes are not reacted to yet
    JOINING = "joining"
    JOINED = "joined"
    #: leaving: no reaction, no resharding, no registration again
    STOPPING = "stopping"


class ShardingService:
    """Sharding of ``job`` as seen from ``identity``; see the module docstring."""

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
        missed_fires: MissedFires | None = None,
        on_resharded: Callable[[int, float], None] | None = None,
        commit: Commit | None = None,
        on_leading: Callable[[Sequence[Check]], object] | None = None,
        paths: JobPaths | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> None:
        self._reg = reg
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
        self._missed_fires = missed_fires
        self.membership = Membership(
            reg, self.paths, identity, self._cache, commit=self._commit, cancelled=self._leaving
        )
        #: the runs the current resharding found going under the fenced epoch (Assignment.ran)
        self._ran_at_fence: dict[int, tuple[float, str]] = {}
        self._on_resharded = on_resharded  # (new epoch, seconds taken): metrics, history
        #: the leader should look for running marks of departed instances (one read):
        #: set when it is elected, an instance leaves, a resharding found some, or on reconcile
        self._marks_unchecked = True
        #: why the last resharding transaction failed, for the warning when they keep failing
        self._last_race: str | None = None
        self._reshard_lock = threading.RLock()
        self._state_lock = threading.Lock()
        self._max_epoch = 0
        self._decoded: tuple[int, Assignment] | None = None
        self._last_ready: CurrentAssignment | None = None
        self._evaluation_pending = False
        self._phase = _Phase.NEW
        self._reported_corrupt: set[tuple[str, int]] | None = None  # made on first use
        self._assignment_listeners: list[Callable[[], None]] = []
        #: this instance's running mark: the fencing point of every run
        self.marks = RunMarks(
            reg,
            self.paths,
            identity.instance_id,
            self._cache,
            registration_version=lambda: self.membership.version,
            persistent=lambda: self._settings.failover,
            report_corrupt=self._report_corrupt,
        )
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
        )

    @property
    def stopping(self) -> bool:
        """The service is leaving (``stop()``): it reacts to nothing more."""
        return self._phase is _Phase.STOPPING

    def _leaving(self) -> bool:
        """Stopped, or its owner is shutting down: no registration is wanted any more."""
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
        self._cache.add_listener(self._on_change, under=self.paths.root)
        self._reg.add_listener(self._on_session)
        enabled = self.membership.join(server_enabled=server_enabled)
        self._election.start(participate=enabled)
        with self._state_lock:
            if self._phase is _Phase.JOINING:
                self._phase = _Phase.JOINED
        self._schedule_evaluation()

    def stop(self) -> None:
        """Leave at once: hand leadership over and remove this instance's nodes, so the
        others reshard without waiting for any timeout."""
        if self._phase in (_Phase.NEW, _Phase.STOPPING):
            return
        self._phase = _Phase.STOPPING
        self._cache.remove_listener(self._on_change, under=self.paths.root)
        self._reg.remove_listener(self._on_session)
        try:
            # leave membership first, so the next leader computes without this instance;
            # with failover, leave the last fire behind so the fires until the hand-over
            # are covered (the leader removes the trace when it reshards)
            self._election.withdraw()
            running, last_fire = self.marks.path, self.marks.last_fire
            if self._settings.failover and last_fire is not None:
                self._reg.put(running, RunTrace("left", (), last_fire).encode())
            else:
                self._delete(running)
            self.membership.leave()
            self._election.stop()
        except RegistryError:
            log.warning("job %s: leaving the registry cleanly failed; the session's end will", self.job)
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
        self._schedule_evaluation()

    def add_assignment_listener(self, listener: Callable[[], None]) -> None:
        """Called (on the registry's event thread) whenever the job's assignment node changes."""
        self._assignment_listeners.append(listener)

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
            self._report_corrupt(path, node.version, exc.problem)
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
        node = self._cache.get_node(path)
        if node is None:
            return set()
        try:
            return set(disabled_items(path, node.value))
        except CorruptNodeError as exc:
            self._report_corrupt(path, node.version, exc.problem)
            return set()

    def resharding_pending(self) -> bool:
        """A resharding is flagged or under way (dataflow streaming stops for it)."""
        return self._ready() is None

    def current(self) -> Assignment | None:
        """The assignment as cached (READY or not); None when absent or corrupt."""
        node = self._cache.get_node(self.paths.assignment)
        return None if node is None else self._decode(node)

    def leader(self) -> str | None:
        raw = self._cache.get(self.paths.leader)
        return None if raw is None else raw.decode(errors="replace")

    def _decode(self, node: Node) -> Assignment | None:
        memo = self._decoded
        if memo is not None and memo[0] == node.version:
            return memo[1]
        try:
            assignment = Assignment.decode(self.paths.assignment, node.value)
        except CorruptNodeError as exc:
            self._report_corrupt(self.paths.assignment, node.version, exc.problem)
            return None
        self._decoded = (node.version, assignment)
        with self._state_lock:
            self._max_epoch = max(self._max_epoch, assignment.epoch)
        return assignment

    def _report_corrupt(self, path: str, version: int, problem: str) -> None:
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
        if version is None or self._cache.exists(self.paths.necessary):
            return None
        last = self._last_ready
        if last is not None and last.version == version:
            return last  # asked on every fire: the same answer until the node changes
        node = self._cache.get_node(self.paths.assignment)
        if node is None:
            return None
        assignment = self._decode(node)
        if assignment is None or assignment.state is not AssignmentState.READY:
            return None
        self._last_ready = CurrentAssignment(assignment, node.version)
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
                self._evaluate()
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

    # -- leader work ----------------------------------------------------------------------
    def reconcile(self) -> None:
        """Flag a resharding if the assignment no longer matches the cluster (e.g. it
        names an instance that is gone). Cheap: the cache and one read of the running
        marks, unless it flags."""
        self._marks_unchecked = True
        if self._evaluate() and not self._cache.exists(self.paths.assignment):
            self._schedule_evaluation()  # no flag was written (none is): no event will schedule it
        if self.is_leader and not self.stopping:
            self._upkeep_servers()

    def _upkeep_servers(self) -> None:
        """Stamp vacant servers, delete long-vacant ones, drop orphaned shutdown requests
        (``operations.plan_vacancies``): one read of the job and, if needed, one write."""
        expiry = self._settings.server_expiry_seconds
        try:
            update(
                self._reg,
                lambda: JobState.read(self._reg, self.job),
                lambda state: plan_vacancies(state, time.time(), expiry),
                what=f"job {self.job}: server upkeep",
            )
        except RegistryError:
            log.warning(
                "job %s: server upkeep failed; retrying at the next reconcile", self.job, exc_info=True
            )

    def _needs_resharding(self) -> str | None:
        node = self._cache.get_node(self.paths.assignment)
        if node is None:
            return "no assignment yet"
        assignment = self._decode(node)
        if assignment is None:
            return "assignment node corrupt"
        if assignment.state is AssignmentState.RESHARDING:
            return "previous resharding unfinished"
        settings = self._settings
        if assignment.total != settings.total:
            return f"total count {assignment.total} -> {settings.total}"
        if not (settings.static and assignment.items):
            available = set(self.available_instances())
            assigned = set(assignment.items)
            if assigned != available:
                joined, left = sorted(available - assigned), sorted(assigned - available)
                return f"instances joined {joined} left {left}"
            if assignment.strategy != settings.strategy:
                return f"strategy {assignment.strategy} -> {settings.strategy}"
        return self._stale_marks()

    def _stale_marks(self) -> str | None:
        """Running marks of departed instances — the one check that reads the registry
        (caches leave running marks out), so it runs only when marks may have been left."""
        if not self._marks_unchecked:
            return None
        self._marks_unchecked = False  # before the read: a departure during it sets it again
        try:
            stale = sorted(set(self.running_instances()) - set(self.online_instances()))
        except RegistryError:
            self._marks_unchecked = True
            raise
        if not stale:
            return None
        self._marks_unchecked = True  # until a resharding has removed them all
        return f"running marks left by departed instances {stale}"

    def _evaluate(self) -> bool:
        """Flag a resharding if one is needed; True if this call flagged it, or found
        no assignment at all (which needs no flag: see ``_flag_if_needed``)."""
        if not self.is_leader or self.stopping:
            return False
        with self._reshard_lock:  # not while resharding: the cache lags our own writes
            return self._flag_if_needed()

    def _flag_if_needed(self) -> bool:
        reason = self._needs_resharding()
        if reason is not None and not self._cache.exists(self.paths.necessary):
            log.info("job %s: resharding needed: %s", self.job, reason)
            if not self._cache.exists(self.paths.assignment):
                # A missing assignment is its own flag: every leader reshards on it (after
                # this one's crash too), and nothing can run meanwhile; writing the flag
                # would cost a transaction and its events for every new job.
                return True
            # fenced: a flag from a leader that was deposed, or whose job an operator
            # removed, while it evaluated must not land (it would re-create the job)
            try:
                self._commit([*self._election.fence_ops(), Create(self.paths.necessary, reason.encode())])
            except TransactionError:
                return False  # flagged meanwhile, or no longer leader
            except RegistryError:
                if not self.stopping:
                    log.warning("job %s: could not flag resharding", self.job, exc_info=True)
                return False
            return True
        return False

    def reshard(self) -> bool:
        """Leader: bring the assignment up to date (module docstring). True when the
        assignment is READY and unflagged afterwards; False when not (or no longer) leader."""
        with self._reshard_lock:
            for _ in range(20):
                if not self.is_leader or self.stopping:
                    return False
                outcome = self._reshard_once()
                if outcome is not None:
                    return outcome
            log.warning(
                "job %s: resharding kept racing with changes (last: %s); will retry",
                self.job,
                self._last_race,
            )
            self._schedule_evaluation()  # try again rather than wait for the next change
            return False

    def _reshard_once(self) -> bool | None:
        started = time.monotonic()
        leader_version = self._election.leader_version
        if leader_version is None:
            return False
        fence_ops = self._election.fence_ops()
        flag = self._reg.get_node(self.paths.necessary)
        node = self._reg.get_node(self.paths.assignment)
        previous = None
        if node is not None:
            try:
                previous = Assignment.decode(self.paths.assignment, node.value)
            except CorruptNodeError as exc:
                self._report_corrupt(self.paths.assignment, node.version, exc.problem)
        if flag is None and previous is not None and previous.state is AssignmentState.READY:
            assert node is not None
            if not self._cache_caught_up(node):
                # The judgement below reads the cache. Hazard: a cache that has not yet
                # applied our own last write still shows the reason that write removed,
                # and the leader would reshard again and again on it; so it waits for the
                # cache to catch up first, bounded.
                log.info("job %s: the cache lags the assignment; resharding waits for it", self.job)
                return False
            reason = self._needs_resharding()
            if reason is None:
                return True
            # No flag is written for a resharding done here and now: the fence below stops
            # every run under the old epoch as a flag would, and outlives this leader (the
            # next one reshards a RESHARDING assignment); a flag raised meanwhile is left
            # for the next evaluation. That spares a transaction and two reads per job when
            # a restarted process reshards every job it leads (``JobRunner.settle``).
            log.info("job %s: resharding needed: %s", self.job, reason)
        with self._state_lock:
            epoch = max(previous.epoch if previous else 0, self._max_epoch)
            settings = self._settings
        me = self.identity.instance_id
        planned = self._compute(settings, previous)  # a faulty strategy fails before any write
        if node is None:
            # No assignment at all (a new job): no run can start without one (every
            # running mark checks its version), so there is nothing to fence; the
            # assignment is created READY by the one transaction below.
            self._ran_at_fence = {}
        elif previous is None or previous.state is AssignmentState.READY:
            self._ran_at_fence = {}  # a new fence: the runs it waits for are found anew
            fenced_node = self._fence(previous, node, epoch, settings, leader_version, fence_ops)
            if fenced_node is None:
                return None if self.is_leader else False
            node = fenced_node
        running: list[str] | None = None  # the marks as last read, when that was just now
        # the marks are read below and departed ones removed with the new assignment, which
        # spares the next evaluation its own read; a departure meanwhile sets it again
        self._marks_unchecked = False
        if settings.monitor_execution:
            waited = self._wait_runs_finished()
            if waited is None:
                self._marks_unchecked = True
                return False
            running = waited[0]
            for item, run in waited[1].items():  # kept across attempts of one resharding
                if item not in self._ran_at_fence or self._ran_at_fence[item][0] < run[0]:
                    self._ran_at_fence[item] = run
        ran = dict(self._ran_at_fence)
        planned = self._compute(settings, previous)
        new = Assignment(
            epoch + 1,
            AssignmentState.READY,
            settings.total,
            planned,
            settings.strategy,
            me,
            leader_version,
            ran,
        )
        ops: list[Check | Create | Set | Delete] = [
            *fence_ops,
            (
                Create(self.paths.assignment, new.encode())
                if node is None
                else Set(self.paths.assignment, new.encode(), node.version)
            ),
        ]
        if flag is not None:
            ops.append(Delete(self.paths.necessary, flag.version))
        ops.extend(self._departed_ops(settings, previous, running))
        if not self._transact(ops, fence_ops):
            self._marks_unchecked = True
            return None if self.is_leader else False
        with self._state_lock:
            self._max_epoch = max(self._max_epoch, new.epoch)
        self._wait_cache_past(-1 if node is None else node.version)
        log.info(
            "job %s: epoch %d assignment %s",
            self.job,
            new.epoch,
            {k: encode_items(v) for k, v in sorted(new.items.items(), reverse=True)},
        )
        if self._on_resharded is not None:
            self._on_resharded(new.epoch, time.monotonic() - started)
        return True

    def _fence(
        self,
        previous: Assignment | None,
        node: Node | None,
        epoch: int,
        settings: ShardingSettings,
        leader_version: int,
        fence_ops: Sequence[Check],
    ) -> Node | None:
        """Turn the assignment to RESHARDING in one transaction checked by ``fence_ops``
        (from here no run can start under the old epoch); the node as written, or None
        if the transaction failed or the node vanished."""
        me = self.identity.instance_id
        fence = Assignment(epoch, AssignmentState.RESHARDING, 0, {}, settings.strategy, me, leader_version)
        if previous is not None:
            fence = previous.with_state(AssignmentState.RESHARDING, me, leader_version)
        write: Create | Set = (
            Create(self.paths.assignment, fence.encode())
            if node is None
            else Set(self.paths.assignment, fence.encode(), node.version)
        )
        if not self._transact([*fence_ops, write], fence_ops):
            return None
        return self._reg.get_node(self.paths.assignment)

    def _wait_cache_past(self, fenced: int) -> None:
        """Our own read path is the cache: let it catch up, or the next check sees the
        fence. "Caught up" is any version past the fence (our write or a later one):
        waiting for our exact value would miss it when the cache applies a later write first.
        ``fenced`` is -1 after the assignment was created: any version will do."""
        self._cache.wait_until(
            lambda: (
                (cached := self._cache.get_node(self.paths.assignment)) is not None
                and cached.version > fenced
            ),
            self.wait_timeout,
            under=self.paths.root,
        )

    def _cache_caught_up(self, node: Node) -> bool:
        """Wait (bounded) until the cache holds the assignment as read directly (or later) and no
        resharding flag the registry no longer has; False if it does not catch up soon —
        then the events still on their way schedule the next evaluation."""

        def caught_up() -> bool:
            cached = self._cache.get_node(self.paths.assignment)
            return (
                cached is not None
                and cached.version >= node.version
                and not self._cache.exists(self.paths.necessary)
            )

        return self._cache.wait_until(caught_up, _CACHE_CATCH_UP, under=self.paths.root)

    def _departed_ops(
        self, settings: ShardingSettings, previous: Assignment | None, running: list[str] | None = None
    ) -> list[Create | Set | Delete]:
        """Remove the running marks of departed instances and, with failover, queue what
        they left undone — in the same transaction as the new assignment (module
        ``sharding.failover``). Bounded so the transaction stays within every limit."""
        online = set(self.online_instances())
        ops: list[Create | Set | Delete] = []
        departed: dict[str, RunTrace | None] = {}
        if running is None:
            running = self.running_instances()
        stale = sorted(set(running) - online)
        if len(stale) > _MAX_DEPARTED_PER_RESHARD:
            self._marks_unchecked = True  # the rest go in the next round
        for instance in stale[:_MAX_DEPARTED_PER_RESHARD]:
            mark = self._reg.get_node(self.paths.running_of(instance))
            if mark is None:
                continue
            ops.append(Delete(self.paths.running_of(instance), mark.version))
            try:
                departed[instance] = RunTrace.decode(self.paths.running_of(instance), mark.value)
            except CorruptNodeError as exc:
                self._report_corrupt(self.paths.running_of(instance), mark.version, exc.problem)
                departed[instance] = None
        if not settings.failover:
            return ops
        if previous is not None:
            for instance in previous.items:
                if instance not in online and instance not in departed:
                    departed[instance] = None  # died between runs, no trace left
        entries = plan_entries(
            previous,
            departed,
            now=time.time(),
            session_timeout=self._reg.session_timeout,
            missed_fires=self._missed_fires,
            disabled=self.disabled_items(),
        )
        if not entries:
            return ops
        queue_node = self._reg.get_node(self.paths.failover_items)
        queue = FailoverQueue() if queue_node is None else self.marks.queue(queue_node)
        merged = queue.merged(entries, settings.total).encode()
        log.warning(
            "job %s: failover queues %d (item, fire) pair(s) left by %s",
            self.job,
            len(entries),
            sorted(departed),
        )
        if queue_node is None:
            ops.append(Create(self.paths.failover_items, merged))
        else:
            ops.append(Set(self.paths.failover_items, merged, queue_node.version))
        return ops

    def _compute(self, settings: ShardingSettings, previous: Assignment | None) -> dict[str, tuple[int, ...]]:
        instances = self.available_instances()
        strategy = get_strategy(settings.strategy)
        try:
            last = None if previous is None else previous.as_lists()
            raw = strategy(instances, self.job, settings.total, previous=last)
            checked = check_assignment(raw, instances, settings.total, settings.strategy)
        except ValueError as exc:
            raise ShardingError(f"job {self.job}: {exc}") from None
        return {instance: tuple(items) for instance, items in checked.items()}

    def _transact(self, ops: Sequence[Check | Set | Create | Delete], fence: Sequence[Check]) -> bool:
        """Apply a resharding transaction guarded by the election's ``fence`` ops."""
        try:
            self._commit(list(ops))
            return True
        except TransactionError as exc:
            if any(exc.op is check for check in fence):  # the leader node or its term moved
                log.info("job %s: leadership lost while resharding; the new leader takes over", self.job)
            else:
                log.debug("job %s: resharding raced a change (%s); retrying", self.job, exc)
            self._last_race = str(exc)
            return False

    def _wait_runs_finished(self) -> tuple[list[str], dict[int, tuple[float, str]]] | None:
        """Wait (by watch) until no online instance holds a running mark; the marks then
        there (those of departed instances, for ``_departed_ops``: one read less) and the
        runs waited for (item -> (fire time, instance), for ``Assignment.ran``), or None
        if leadership ends.

        The marks are followed only for the wait, by a cache of their own: the shared
        cache leaves them out (``layout.is_running_marks``)."""
        running = self.running_instances()
        if not set(running) & set(self.online_instances()):
            return running, {}  # the usual case: one read, no watch to set up
        ran = self._runs_in_progress(running)  # read at once: a run may end any moment now
        marks = TreeCache(self._reg, self.paths.running).start(self._reg.session_timeout)
        try:

            def in_progress() -> list[str]:
                # a departed instance's mark never clears; membership is re-read each second
                running = marks.children(self.paths.running)
                return sorted(set(running) & set(self.online_instances())) if running else []

            while True:
                if not self.is_leader or self.stopping:
                    return None
                if marks.wait_until(lambda: not in_progress(), 1.0):
                    return marks.children(self.paths.running), ran
                log.info("job %s: resharding waits for running items on %s", self.job, in_progress())
        finally:
            marks.close()

    def _runs_in_progress(self, running: list[str]) -> dict[int, tuple[float, str]]:
        """The fires online instances are running under the fenced epoch, per item (one
        read per instance with a mark). Hazard: a run that ends between the fence and this
        read is not seen, and a fire that waited for the new epoch may then run its items
        again; the window is the fence's round trip."""
        ran: dict[int, tuple[float, str]] = {}
        online = set(self.online_instances())
        for instance in running:
            path = self.paths.running_of(instance)
            node = self._reg.get_node(path) if instance in online else None
            if node is None:
                continue
            try:
                trace = RunTrace.decode(path, node.value)
            except CorruptNodeError:
                continue  # reported by the resharding's own read of the marks
            if trace.state != "running" or trace.fire_time is None or trace.failover:
                continue  # a failover run is re-run by failover anyway, never skipped
            for item in trace.items:
                if item not in ran or ran[item][0] < trace.fire_time:
                    ran[item] = (trace.fire_time, instance)
        return ran

    # -- reactions ------------------------------------------------------------------------
    def _schedule_evaluation(self) -> None:
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
                flagged = self._evaluate()
                if flagged or self._cache.exists(self.paths.necessary):
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

    def _on_change(self, event: Event) -> None:
        if not is_below(event.path, self.paths.root):
            return
        own_node_gone = event.path == self.membership.path and event.kind is EventKind.DELETED
        live = self._reg.state in (SessionState.CONNECTED, SessionState.RECONNECTED)
        if own_node_gone and live and not self.stopping:
            # never shut down because our node vanished (ElasticJob does): register again
            self._rejoin_later()
        if event.path == self.paths.assignment:
            for listener in list(self._assignment_listeners):
                listener()
        if event.kind is EventKind.DELETED and parent(event.path) == self.paths.instances:
            self._marks_unchecked = True  # it may have left a running mark behind
        if is_below(event.path, self.paths.running) or is_below(event.path, self.paths.guarantee):
            return  # runs and their listeners' progress never change the assignment's basis
        self._schedule_evaluation()

    def _on_session(self, state: SessionState) -> None:
        if state is SessionState.LOST:
            self.membership.lost()  # no fire marks (to be refused) until registered again
        if state is SessionState.CONNECTED and not self.stopping:
            self._rejoin_later()

    def _rejoin_later(self) -> None:
        try:
            self._rejoin(self._reregister)
        except RuntimeError:  # the pool was shut down: the scheduler is stopping
            pass

    def _on_elected(self) -> None:
        self._marks_unchecked = True
        self._schedule_evaluation()

    def _reregister(self) -> None:
        if not self.stopping:
            self.membership.register_again()
