"""The leader's side of one job's sharding: judge whether the assignment still fits the
cluster, flag a resharding, fence the old epoch and write the new assignment.

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

A job with no assignment node at all (a new job) skips steps 1 to 3: the missing node
is the flag, and no run can start without it (so there is no mark to wait for or read);
step 4 creates the node. A leader that finds the assignment out of date while it
reshards anyway (a restarted process at ``start()``) skips step 1: its fence is as
durable a sign, and as binding on runs.

That is O(1) registry operations whatever the item and instance counts; a new job's
first resharding is one transaction and no read.

Invariant: every write here carries the election's fence ops (``LeaderElection.fence_ops``),
so a deposed leader's write fails; one resharding at a time per job (``_reshard_lock``).
The reads of the cluster (instances, servers, disabled items) are the service's, from its
cache. The assignment and the flag are read from the registry, except by the first
attempt of a resharding whose cache shows no assignment (a stale view only fails its
transaction); the running marks always are, since caches leave them out.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from registry.errors import RegistryError, TransactionError
from registry.protocol import Check, Create, Delete, Node, RegistryCenter, Set
from registry.recipes.batch import Commit
from registry.recipes.cache import TreeCache
from registry.recipes.election import LeaderElection
from registry.recipes.versioned import update
from sharding.assignment import Assignment, AssignmentState, CorruptNodeError, encode_items
from sharding.errors import ShardingError
from sharding.failover import RunTrace, plan_entries
from sharding.job_state import JobState
from sharding.operations import plan_vacancies
from sharding.settings import ShardingSettings
from sharding.strategy_loader import check_assignment, get_strategy

if TYPE_CHECKING:
    from sharding.service import ShardingService

__all__ = ["JobHooks", "Resharding"]

log = logging.getLogger("sharding")

#: how long a leader waits for its cache to show its own last resharding before it judges
_CACHE_CATCH_UP = 2.0
#: departed instances handled per resharding transaction (the rest in the next round)
_MAX_DEPARTED_PER_RESHARD = 100


class JobHooks(Protocol):
    """What a resharding asks of the job it reshards (a scheduler's runner): one object,
    where a callback per question was a bound method per job."""

    def missed_fires(self, since: float, until: float) -> list[float]:
        """The job's fire times in (since, until]: the fires a departed instance missed,
        owed with failover."""
        ...

    def resharded(self, epoch: int, seconds: float) -> None:
        """A resharding made the assignment of ``epoch`` in ``seconds`` (metrics, history)."""
        ...


class Resharding:
    """One job's resharding on one instance: acts only while ``election`` says this
    instance leads. ``service`` gives the cluster as its cache shows it."""

    # one per job, thousands per process: no attribute dict (a new attribute goes here)
    __slots__ = (
        "_cache",
        "_commit",
        "_election",
        "_fenced",
        "_hooks",
        "_last_race",
        "_marks_unchecked",
        "_ran_at_fence",
        "_reg",
        "_reshard_lock",
        "_service",
        "paths",
    )

    def __init__(
        self,
        service: ShardingService,
        reg: RegistryCenter,
        cache: TreeCache,
        election: LeaderElection,
        *,
        commit: Commit,
        hooks: JobHooks | None = None,
    ) -> None:
        self._service = service
        self.paths = service.paths
        self._reg = reg
        self._cache = cache
        self._election = election
        self._commit = commit
        self._hooks = hooks
        #: the runs the current resharding found going under the fenced epoch, by item
        #: (Assignment.ran); None while it found none (no empty dict kept per job)
        self._ran_at_fence: dict[int, tuple[float, str]] | None = None
        #: (the fenced assignment node's version, Assignment.fenced_at) of the current
        #: resharding; None between reshardings
        self._fenced: tuple[int, float] | None = None
        #: the leader should look for running marks of departed instances (one read):
        #: set when it is elected, an instance leaves, a resharding found some, or on reconcile
        self._marks_unchecked = True
        #: why the last resharding transaction failed, for the warning when they keep failing
        self._last_race: str | None = None
        self._reshard_lock = threading.RLock()

    @property
    def job(self) -> str:
        return self.paths.job

    def marks_may_be_left(self) -> None:
        """An instance left, or this one was elected: look for running marks left behind
        at the next evaluation (one read)."""
        self._marks_unchecked = True

    def reconcile(self) -> None:
        """Flag a resharding if the assignment no longer matches the cluster (e.g. it
        names an instance that is gone). Cheap: the cache and one read of the running
        marks, unless it flags."""
        self._marks_unchecked = True
        if self.evaluate() and not self._cache.exists(self.paths.assignment):
            self._service.schedule_evaluation()  # no flag was written (none is): no event will schedule it
        if self._election.is_leader and not self._service.stopping:
            self._upkeep_servers()

    def _upkeep_servers(self) -> None:
        """Stamp vacant servers, delete long-vacant ones, drop orphaned shutdown requests
        (``operations.plan_vacancies``): one read of the job and, if needed, one write."""
        expiry = self._service.settings.server_expiry_seconds
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
        assignment = self._service.decode_assignment(node)
        if assignment is None:
            return "assignment node corrupt"
        if assignment.state is AssignmentState.RESHARDING:
            return "previous resharding unfinished"
        settings = self._service.settings
        if assignment.total != settings.total:
            return f"total count {assignment.total} -> {settings.total}"
        if not (settings.static and assignment.items):
            available = set(self._service.available_instances())
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
            stale = sorted(set(self._service.running_instances()) - set(self._service.online_instances()))
        except RegistryError:
            self._marks_unchecked = True
            raise
        if not stale:
            return None
        self._marks_unchecked = True  # until a resharding has removed them all
        return f"running marks left by departed instances {stale}"

    def evaluate(self) -> bool:
        """Flag a resharding if one is needed; True if this call flagged it, or found
        no assignment at all (which needs no flag: see ``_flag_if_needed``)."""
        if not self._election.is_leader or self._service.stopping:
            return False
        with self._reshard_lock:  # not while resharding: the cache lags our own writes
            return self._flag_if_needed()

    def _flag_if_needed(self) -> bool:
        reason = self._needs_resharding()
        if reason is not None and self._cache.held(self.paths.necessary) is None:
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
            except TransactionError as exc:
                self._election.fenced_out(exc)  # a leader node gone unheard ends the term
                return False  # flagged meanwhile, or no longer leader
            except RegistryError:
                if not self._service.stopping:
                    log.warning("job %s: could not flag resharding", self.job, exc_info=True)
                return False
            return True
        return False

    def reshard(self) -> bool:
        """Leader: bring the assignment up to date (module docstring). True when the
        assignment is READY and unflagged afterwards; False when not (or no longer) leader."""
        with self._reshard_lock:
            for attempt in range(20):
                if not self._election.is_leader or self._service.stopping:
                    return False
                outcome = self._reshard_once(attempt)
                if outcome is not None:
                    return outcome
            log.warning(
                "job %s: resharding kept racing with changes (last: %s); will retry",
                self.job,
                self._last_race,
            )
            self._service.schedule_evaluation()  # try again rather than wait for the next change
            return False

    def _reshard_once(self, attempt: int) -> bool | None:
        started = time.monotonic()
        leader_version = self._election.leader_version
        if leader_version is None:
            return False
        fence_ops = self._election.fence_ops()
        if attempt == 0 and not self._cache.exists(self.paths.assignment):
            # A new job, as the cache sees it: no round trip. A stale view only fails the
            # transaction below (its Create, or the flag's delete at the version seen) and
            # the next attempt reads the registry; a flag the cache has not shown yet
            # outlives the new assignment and brings the next resharding.
            flag, node = self._cache.held(self.paths.necessary), None
        else:
            flag = self._reg.get_node(self.paths.necessary)
            node = self._reg.get_node(self.paths.assignment)
        previous = None
        if node is not None:
            try:
                previous = Assignment.decode(self.paths.assignment, node.value)
            except CorruptNodeError as exc:
                self._service.report_corrupt(self.paths.assignment, node.version, exc.problem)
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
        settings = self._service.settings
        epoch = max(previous.epoch if previous else 0, self._service.epoch_floor())
        me = self._service.identity.instance_id
        planned = self._compute(settings, previous)  # a faulty strategy fails before any write
        if node is None:
            # No assignment at all (a new job): no run can start without one (every
            # running mark checks its version), so there is nothing to fence; the
            # assignment is created READY by the one transaction below.
            self._ran_at_fence = self._fenced = None
        elif previous is None or previous.state is AssignmentState.READY:
            self._ran_at_fence = None  # a new fence: the runs it waits for are found anew
            fenced_node = self._fence(previous, node, epoch, settings, leader_version, fence_ops)
            if fenced_node is None:
                return None if self._election.is_leader else False
            node = fenced_node
            # read once the fence's transaction returned: a mark it let through was applied
            # before, so that run's fire is no later (clocks in step)
            self._fenced = (node.version, time.time())
        elif self._fenced is None or self._fenced[0] != node.version:
            # a fence found in place (another leader's, or one before a restart): now is
            # later than it, which only hands the fires between to the old owners, who
            # were fenced out of them and queue them (``Assignment.moved_away``)
            self._fenced = (node.version, time.time())
        running: list[str] | None = None  # the marks as last read, when that was just now
        # the marks are read below and departed ones removed with the new assignment, which
        # spares the next evaluation its own read; a departure meanwhile sets it again
        self._marks_unchecked = False
        if node is None:
            running = []  # no assignment, no mark: every mark checks its version
        elif settings.monitor_execution:
            waited = self._wait_runs_finished()
            if waited is None:
                self._marks_unchecked = True
                return False
            running = waited[0]
            if waited[1]:  # kept across attempts of one resharding
                kept = self._ran_at_fence if self._ran_at_fence is not None else {}
                for item, run in waited[1].items():
                    if item not in kept or kept[item][0] < run[0]:
                        kept[item] = run
                self._ran_at_fence = kept
        ran = dict(self._ran_at_fence or {})
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
            None if self._fenced is None else self._fenced[1],
            self._moved(previous, planned, settings.failover),
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
            return None if self._election.is_leader else False
        self._fenced = None
        self._service.saw_epoch(new.epoch)
        self._wait_cache_past(-1 if node is None else node.version)
        log.info(
            "job %s: epoch %d assignment %s",
            self.job,
            new.epoch,
            {k: encode_items(v) for k, v in sorted(new.items.items(), reverse=True)},
        )
        if self._hooks is not None:
            self._hooks.resharded(new.epoch, time.monotonic() - started)
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
        me = self._service.identity.instance_id
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
        return self._assignment_past(-1 if node is None else node.version)

    def _assignment_past(self, before: int) -> Node | None:
        """The assignment as a write of ours left it, or later: from the cache once it shows
        a version past ``before`` (no round trip), else read. Only its version is used, and
        any state past the write does as the read's would: a later one only fails the next
        write, checked against it, and the next attempt reads the registry."""
        if self._wait_cache_past(before, _CACHE_CATCH_UP):
            return self._cache.get_node(self.paths.assignment)
        return self._reg.get_node(self.paths.assignment)

    def _wait_cache_past(self, fenced: int, timeout: float | None = None) -> bool:
        """Our own read path is the cache: let it catch up, or the next check sees the
        fence. "Caught up" is any version past the fence (our write or a later one):
        waiting for our exact value would miss it when the cache applies a later write first.
        ``fenced`` is -1 after the assignment was created: any version will do. False if
        it did not catch up within ``timeout`` (default: the service's wait timeout)."""
        return self._cache.wait_until(
            lambda: (
                (cached := self._cache.get_node(self.paths.assignment)) is not None
                and cached.version > fenced
            ),
            self._service.wait_timeout if timeout is None else timeout,
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
                and self._cache.held(self.paths.necessary) is None
            )

        return self._cache.wait_until(caught_up, _CACHE_CATCH_UP, under=self.paths.root)

    def _departed_ops(
        self, settings: ShardingSettings, previous: Assignment | None, running: list[str] | None = None
    ) -> list[Create | Set | Delete]:
        """Remove the running marks of departed instances and, with failover, queue what
        they left undone — in the same transaction as the new assignment (module
        ``sharding.failover``). Bounded so the transaction stays within every limit."""
        online = set(self._service.online_instances())
        ops: list[Create | Set | Delete] = []
        departed: dict[str, RunTrace | None] = {}
        if running is None:
            running = self._service.running_instances()
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
                self._service.report_corrupt(self.paths.running_of(instance), mark.version, exc.problem)
                departed[instance] = None
        if not settings.failover:
            return ops
        if previous is not None:
            for instance in previous.items:
                if instance not in online and instance not in departed:
                    departed[instance] = None  # died between runs, no trace left
        # Invariant: a departed holder's fires are queued up to the fence and no later.
        # A later fire is its items' new owners' (``Assignment.ran_elsewhere``): they
        # plan it under the new epoch, the fence having held it back; queued too, it
        # ran twice (one after the other, on the owner)
        entries = plan_entries(
            previous,
            departed,
            now=time.time() if self._fenced is None else self._fenced[1],
            session_timeout=self._reg.session_timeout,
            missed_fires=None if self._hooks is None else self._hooks.missed_fires,
            disabled=self._service.disabled_items(),
        )
        if not entries:
            return ops
        queue_node = self._reg.get_node(self.paths.failover_items)
        ops.extend(self._service.marks.queue_additions(queue_node, entries, settings.total))
        log.warning(
            "job %s: failover queues %d (item, fire) pair(s) left by %s",
            self.job,
            len(entries),
            sorted(departed),
        )
        return ops

    def _moved(
        self, previous: Assignment | None, planned: Mapping[str, Sequence[int]], failover: bool
    ) -> dict[int, str]:
        """Item -> its holder in ``previous``, for the items ``planned`` gives to another:
        every fire of theirs up to the fence is the holder's, not the new owner's
        (``Assignment.ran_elsewhere``). A holder still registered ran such a fire or queues
        it itself (``moved_away``); one that left, only with failover: the leader queues
        its fires up to the fence (``_departed_ops``). Without failover a departed
        holder's items are not listed, and a fire of theirs that waited for this epoch is
        the new owner's to run."""
        if previous is None:
            return {}
        owner = {item: instance for instance, items in planned.items() for item in items}
        online = set(self._service.online_instances())
        return {
            item: holder
            for holder, items in previous.items.items()
            if failover or holder in online
            for item in items
            if owner.get(item, holder) != holder
        }

    def _compute(self, settings: ShardingSettings, previous: Assignment | None) -> dict[str, tuple[int, ...]]:
        instances = self._service.available_instances()
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
                self._election.fenced_out(exc)
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
        running = self._service.running_instances()
        if not set(running) & set(self._service.online_instances()):
            return running, {}  # the usual case: one read, no watch to set up
        ran = self._runs_in_progress(running)  # read at once: a run may end any moment now
        marks = TreeCache(self._reg, self.paths.running).start(self._reg.session_timeout)
        try:

            def in_progress() -> list[str]:
                # a departed instance's mark never clears; membership is re-read each second
                running = marks.children(self.paths.running)
                return sorted(set(running) & set(self._service.online_instances())) if running else []

            while True:
                if not self._election.is_leader or self._service.stopping:
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
        online = set(self._service.online_instances())
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
