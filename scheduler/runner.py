"""One job on one instance: its fires, its runs, its configuration in the registry.

A fire, on a coordinator thread: skip (remembering it as a misfire) while the session is
down or a run is still going; check the clock skew when configured; wait for a READY
assignment (the leader reshards here when flagged); take the local items minus the
disabled ones; mark them running in ONE fenced transaction (assignment version + this
instance's registration + its session) — if that fails nothing runs; run the items on the
shared worker pool; when the last one ends, clear the mark and run a remembered misfire.

Invariants: at most one run of a job per instance at a time; nothing starts without the
fenced mark; no thread waits for a run to finish (completion is a callback), so the
thread count does not grow with the number of jobs.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import random
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from registry.errors import NodeExistsError, RegistryError, TransactionError
from registry.paths import basename, parent
from registry.protocol import Create, Event, EventKind, SessionState
from registry.recipes.batch import BatcherClosed
from scheduler.config import JobConfig, OwedFires
from scheduler.context import ShardingContext
from scheduler.cron import CronSchedule
from scheduler.distribute_once import bind_once_per_cluster
from scheduler.errors import ClockSkewError, JobTimeout, PoolShutDown
from scheduler.events import FAILOVER, MISFIRE, NORMAL, OWED, TRIGGER
from scheduler.handlers import ErrorHandler, JobListener, JobRun
from scheduler.kinds import ItemRunner, close_item_runner
from scheduler.launched_run import LaunchedRun
from scheduler.runtime import Runtime, sharding_settings
from scheduler.timeouts import Deadline, arm, disarm
from sharding import (
    CorruptNodeError,
    CurrentAssignment,
    FencedOut,
    FenceReason,
    RunMark,
    ShardingError,
    ShardingService,
)
from sharding.failover import FailoverEntry
from sharding.layout import JobPaths
from sharding.run_marks import MarkRequest

__all__ = ["JobRunner"]

log = logging.getLogger("scheduler")

#: seconds before a fire the registry failed (session alive) is tried again
_RETRY_DELAY = 1.0
#: what a fire that cannot run becomes, as the run history and metrics name it
_DEFERRED = {OwedFires.EVERY: "owed", OwedFires.ONE: "misfire", OwedFires.NONE: "skipped"}
#: plans of one fire at most: a resharding or a stale mark between planning and marking
#: costs a new plan, and a fire never loops on a cluster that keeps changing
_MARK_ATTEMPTS = 3


#: fires of one departed instance queued at most (an every-second job cut off for minutes)
MAX_MISSED_FIRES = 1000


class JobRunner:
    # one per job, thousands per process: no attribute dict (a new attribute goes here)
    __slots__ = (
        "_config",
        "_delay",
        "_error_handler",
        "_fire_callback",
        "_halted",
        "_idle",
        "_idle_fire",
        "_item_runner",
        "_jittered",
        "_listeners",
        "_lock",
        "_on_shutdown_request",
        "_owed",
        "_parameters",
        "_reconcile_at",
        "_registered_at",
        "_reported",
        "_rt",
        "_running",
        "_schedule",
        "_sharding",
        "local_config",
        "paths",
    )

    def __init__(
        self,
        runtime: Runtime,
        config: JobConfig,
        item_runner: ItemRunner,
        listeners: Sequence[JobListener],
        error_handler: ErrorHandler,
        on_shutdown_request: Callable[[JobRunner], None] | None = None,
    ) -> None:
        self._rt = runtime
        #: called (on a thread of its own: it waits for running items, which may need the
        #: coordinator) when an operator asks this instance to stop the job
        self._on_shutdown_request = on_shutdown_request
        self.local_config = config
        self._config = config
        self._schedule: CronSchedule | None = config.schedule()
        self._item_runner = item_runner
        # a tuple: none (most jobs) is the one empty tuple, where a list is 56 bytes a job
        self._listeners = tuple(listeners)
        self._error_handler = error_handler
        self.paths = JobPaths(config.name)
        # Per-job state is what 10,000 jobs in one process multiply: what most jobs never
        # use (a waiter on the run's end, jitter, a corrupt configuration) is made on first
        # use (the owed fires too: a list, made by the first fire owed; a deque took 760
        # bytes, an empty list 56).
        self._lock = threading.Lock()
        self._idle: threading.Condition | None = None  # made by wait_idle, under _lock
        self._running = False
        # fires owed, oldest first: a misfire (coalesced to one, as ElasticJob) and, with
        # failover, every fire missed while the session was down (each one, the newest
        # MAX_MISSED_FIRES); None until one is, under _lock
        self._owed: list[float] | None = None
        self._sharding: ShardingService | None = None
        self._reported: set[bytes] | None = None
        #: the second the next reconcile is due at (``on_due``); None: none is
        self._reconcile_at: int | None = None
        # the timer entry of every fire: its callback made once, not a bound method per
        # fire that lived a second each (long enough to burden the oldest GC generation);
        # its key is the runner itself (``_fire_key``)
        self._fire_callback = self._on_timer
        self._parameters: tuple[JobConfig, dict[int, str]] | None = None
        #: the jitter chosen for the fire holding the run slot (lateness leaves it out)
        self._delay = 0.0
        #: timer keys of jittered fires not yet started
        self._jittered: set[tuple[str, str, float]] | None = None
        #: set by stop_firing: retries stop, their backoffs end
        self._halted = False
        #: taken in ``start()`` just before registering: ``begin_firing`` runs a fire that
        #: fell due since, once
        self._registered_at = 0.0
        #: (fire time, epoch) of the last fire planned with no item of this instance's,
        #: with failover (``_hand_over``; under _lock)
        self._idle_fire: tuple[float, int] | None = None

    # -- lifecycle ----------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.local_config.name

    @property
    def _fire_key(self) -> Hashable:
        """The timer key of the job's fires: the runner itself (hashed by identity), where
        a tuple of its name was 56 bytes a job."""
        return self

    @property
    def runtime(self) -> Runtime:
        """What every job of this scheduler shares."""
        return self._rt

    @property
    def config(self) -> JobConfig:
        """The configuration in force (the registry's unless ``overwrite``)."""
        return self._config

    @property
    def sharding(self) -> ShardingService:
        if self._sharding is None:
            raise RuntimeError(f"job {self.name} is not started")
        return self._sharding

    def start(self) -> None:
        self._config = self._sync_config()
        self._schedule = self._config.schedule()
        self._sharding = ShardingService(
            self._rt.reg,
            self.name,
            self._rt.identity,
            sharding_settings(self._config),
            executor=self._rt.resharding,
            rejoin=self._rt.rejoin_submit,
            cache=self._rt.cache,
            wait_timeout=self._rt.wait_timeout,
            hooks=self,  # ``missed_fires`` and ``resharded``
            commit=self._rt.commit,
            on_leading=self._rt.upgrade_layout,
            paths=self.paths,
            cancelled=self._rt.cancelled,
            follow=False,  # through ``on_event`` and ``on_session``
        )
        self._rt.job_events.follow(self)
        # a request asked of an earlier process with this id. Looked for only when the job
        # has a shutdown folder: a read of an absent path is remembered (``TreeCache``),
        # and this one, read once, would be held for every job
        own_request = self.paths.shutdown(self._rt.identity.instance_id)
        folders = self._rt.cache.children(self.paths.root)
        if basename(self.paths.shutdowns) in folders and self._rt.cache.exists(own_request):
            self._rt.reg.delete(own_request)
        if self._config.failover:
            self._follow_assignment()
        self._listeners = bind_once_per_cluster(
            self._listeners, self._rt.reg, self._rt.cache, self._sharding, self._rt.workers.submit
        )
        # taken before the registration is written, so that its value's "started" is no
        # earlier: an instance that plans a fire due before it, and finds an item of its
        # own moved here, queues the pair for failover (``hand_over_unfired``); one due
        # after it is fired here
        self._registered_at = time.time()
        self._sharding.start(server_enabled=not self._config.disabled)
        self._schedule_reconcile()

    def begin_firing(self) -> None:
        """Arm the cron; ``start()`` leaves it unarmed. ``Scheduler.start()`` arms every job
        once all are registered: the fires of the jobs already up would otherwise share the
        process with the registration of the rest and make a start-up of thousands of jobs
        twice as long. A fire that fell due since this job's ``start()`` runs once, at once;
        later ones in that window are neither run nor owed, as none before ``start()`` is:
        the job had not begun firing.

        Hazard: ``stop_firing`` may run meanwhile. It sets ``_halted`` before it cancels, so
        the check after arming sees it whenever its cancel came first."""
        schedule = self._schedule
        if schedule is None or self._halted or self._rt.stopping.is_set():
            return
        due = schedule.next_fire(self._registered_at)
        if due is None:
            return
        first_passed = due <= time.time()
        self._rt.timer.schedule(
            self._fire_key, due, self._on_start_up_fire if first_passed else self._fire_callback, fire=True
        )
        if self._halted:
            self._rt.timer.cancel(self._fire_key)

    def settle(self) -> None:
        """As this job's leader and its only instance, make its assignment now, on the
        caller's thread. ``Scheduler.start()`` calls it on its start-up pool, so N jobs'
        first reshardings overlap (their transactions share the group commit) instead of
        waiting for the coordinator's few threads or, worse, for each job's first fire,
        whose timer drain a resharding would hold up.

        An assignment left READY by the instance this process replaces (a restart) names
        that instance: it is resharded here too, not only a missing one.

        Hazard: a leader waits for the runs of other instances before it reshards
        (``monitor_execution``), which may take as long as their items run; start-up must
        not, so with another instance online the resharding is left to the background."""
        sharding = self.sharding
        me = self._rt.identity.instance_id
        if not sharding.is_leader or any(other != me for other in sharding.online_instances()):
            return
        try:
            sharding.reshard()
        except (RegistryError, ShardingError) as exc:
            log.info("job %s: assignment not made at start (%s); the next fire tries again", self.name, exc)

    def stop_firing(self) -> None:
        self._halted = True
        self._rt.timer.cancel(self._fire_key)
        self._reconcile_at = None
        self._rt.timer.cancel((self.name, "retry"))
        with self._lock:
            jittered, self._jittered = self._jittered or set(), None
        for key in jittered:
            self._rt.timer.cancel(key)
        if self._config.retries:
            self._rt.cache.wake()  # a backoff under way looks at the fence again

    def wait_idle(self, timeout: float | None = None) -> bool:
        with self._lock:
            if self._idle is None:
                self._idle = threading.Condition(self._lock)
            return self._idle.wait_for(lambda: not self._running, timeout)

    def leave(self) -> None:
        if self._sharding is not None:
            self._sharding.stop()
        self._rt.job_events.unfollow(self)
        close_item_runner(self._item_runner)

    # -- configuration ----------------------------------------------------------------
    def _sync_config(self) -> JobConfig:
        """The registry's config wins unless ``overwrite``; a corrupt one is reported and
        left in place (nothing already stored is lost), the local one used meanwhile."""
        local = self.local_config
        reg = self._rt.reg
        if local.overwrite:
            reg.put(self.paths.config, local.to_json())
            return local
        cached = self._rt.cache.get(self.paths.config)
        if cached is not None:  # a job started before: no round trip
            adopted = self._decode_config(cached)
            return local if adopted is None else adopted
        # A new job's running marks get their parent with the config. Every cache leaves
        # that subtree out (``is_running_marks``), and an etcd watch cuts it from its key
        # ranges when it first sees the node. Hazard: made by each job's first mark
        # instead, thousands of jobs beginning to fire together would split the watch
        # thousands of times within a second, each new piece caught up from the server's
        # history, and the server would stay slowed by it (BENCHMARKS.md).
        ops = [Create(self.paths.config, local.to_json()), Create(self.paths.running, b"")]
        while True:
            try:
                self._rt.commit(ops)
                return local
            except TransactionError as exc:
                if not isinstance(exc.cause, NodeExistsError):
                    raise
                if exc.index != 1 or len(ops) == 1:
                    break  # the config exists: adopt it
                ops = ops[:1]  # marks' parent left from before the config: the config alone
        raw = reg.get(self.paths.config)
        if raw is None:
            return local
        adopted = self._decode_config(raw)
        return local if adopted is None else adopted

    def _decode_config(self, raw: bytes) -> JobConfig | None:
        try:
            stored = JobConfig.from_json(self.paths.config, raw)
        except CorruptNodeError as exc:
            if self._reported is None:
                self._reported = set()
            if raw not in self._reported:
                self._reported.add(raw)
                log.error("job %s: %s; keeping the configuration in force", self.name, exc)
            return None
        # the code this process runs decides the kind; the registry decides the rest
        local = self.local_config
        adopted = stored.with_changes(
            name=local.name,
            job_type=local.job_type,
            script_command_line=local.script_command_line,
            streaming_process=local.streaming_process,
            error_handler=local.error_handler,
        )
        # the local object when they agree, as they usually do: a second config (with
        # its cron and strings) per job otherwise lives as long as the job
        return local if adopted == local else adopted

    # -- changes (``scheduler.job_events`` hands them over, from ``start()`` to ``leave()``) --
    def on_event(self, event: Event) -> None:
        """A change under the job's root: to the handler of its node while the job fires,
        then to its sharding service until it has left."""
        if not self._halted:
            self._on_job_event(event)
        sharding = self._sharding
        if sharding is not None:
            sharding.on_change(event)

    def on_session(self, state: SessionState) -> None:
        sharding = self._sharding
        if sharding is not None:
            sharding.on_session(state)

    def _on_job_event(self, event: Event) -> None:
        """Every change under the job's root, handed to the handler of its node."""
        path = event.path
        if path == self.paths.config:
            self._on_config_event(event)
        elif path == self.paths.failover_items:
            self._on_failover_event(event)
        else:
            folder = parent(path)
            if folder == self.paths.triggers:
                self._on_trigger_event(event)
            elif folder == self.paths.shutdowns:
                self._on_shutdown_event(event)

    def _on_config_event(self, event: Event) -> None:
        if event.path != self.paths.config or event.kind is EventKind.DELETED or event.value is None:
            return
        updated = self._decode_config(event.value)
        if updated is None or updated == self._config:
            return
        previous, self._config = self._config, updated
        log.info("job %s: configuration changed in the registry", self.name)
        if (updated.cron, updated.time_zone) != (previous.cron, previous.time_zone):
            self._schedule = updated.schedule()
            self._rt.timer.cancel(self._fire_key)
            self._schedule_next(time.time())
        if self._sharding is not None and sharding_settings(updated) != sharding_settings(previous):
            self._sharding.update_settings(sharding_settings(updated))
        if updated.reconcile_interval_minutes != previous.reconcile_interval_minutes:
            self._schedule_reconcile()
        if updated.failover and self._sharding is not None:
            self._follow_assignment()

    # -- timing -------------------------------------------------------------------------
    def _schedule_next(self, after: float) -> None:
        schedule = self._schedule
        if schedule is None or self._rt.stopping.is_set():
            return
        due = schedule.next_fire(after)
        if due is not None:
            self._rt.timer.schedule(self._fire_key, due, self._fire_callback, fire=True)

    def _on_timer(self, scheduled: float) -> None:
        """A fire is due. When the timer comes so late (a paused or overloaded process)
        that later fires are past too, the schedule goes on from now, never in a burst.
        With failover the fires it passed are owed, each one, as for a busy job: every
        (item, fire) at least once, and with the session alive nobody else would run them.
        Without, they are skipped, as ElasticJob's triggers do (Quartz's misfire
        instruction "do nothing") — which also sheds load from an overloaded process."""
        schedule = self._schedule
        if schedule is not None and not self._rt.stopping.is_set():
            due = schedule.next_fire(scheduled)
            now = time.time()
            if due is not None and due <= now:
                if self._config.owed_fires is OwedFires.EVERY:
                    missed = self.missed_fires(scheduled, now)
                    with self._lock:
                        for fire_time in missed:
                            self._owe(fire_time, session_down=False, why="passed while the timer ran late")
                else:
                    log.debug(
                        "job %s: fires after %.3f passed while the timer ran late: skipped",
                        self.name,
                        scheduled,
                    )
                due = schedule.next_fire(now)
            if due is not None:
                self._rt.timer.schedule(self._fire_key, due, self._fire_callback, fire=True)
        self._fire_or_jitter(scheduled)

    def _on_start_up_fire(self, scheduled: float) -> None:
        """The fire that fell due while ``Scheduler.start()`` was still registering other
        jobs (``begin_firing``): it runs, and the schedule goes on from now."""
        self._schedule_next(time.time())
        self._fire_or_jitter(scheduled)

    def _fire_or_jitter(self, scheduled: float) -> None:
        jitter = self._config.jitter_seconds
        if jitter > 0:
            self._jitter(scheduled, random.uniform(0.0, jitter))
        else:
            self.fire(scheduled)

    def _jitter(self, scheduled: float, delay: float) -> None:
        """Start the fire of ``scheduled`` ``delay`` seconds after it (``jitter_seconds``:
        jobs on one cron spread their starts); the fire time stays ``scheduled``."""
        key = (self.name, "jitter", scheduled)
        with self._lock:
            if self._jittered is None:
                self._jittered = set()
            self._jittered.add(key)
        self._rt.timer.schedule(key, scheduled + delay, functools.partial(self._fire_jittered, key, delay), fire=True)

    def _fire_jittered(self, key: tuple[str, str, float], delay: float, _due: float) -> None:
        with self._lock:
            if self._jittered is None or key not in self._jittered:
                return  # stop_firing came first
            self._jittered.discard(key)
        self.fire(key[2], delay=delay)

    def _schedule_reconcile(self) -> None:
        minutes = self._config.reconcile_interval_minutes
        if minutes <= 0 or self._rt.stopping.is_set() or self._halted:
            self._reconcile_at = None
            return
        self._reconcile_at = self._rt.reconciles.schedule(self, time.time() + minutes * 60)

    def on_due(self, second: int) -> None:
        """The periodic reconcile, due at ``second`` (``CoarseOwner``): ignored when it was
        rescheduled or the job stopped firing since."""
        if second != self._reconcile_at:
            return
        try:
            self.sharding.reconcile()
        except (RegistryError, ShardingError):
            log.warning("job %s: reconcile failed", self.name, exc_info=True)
        self._schedule_reconcile()

    # -- what this job's resharding asks of it (``sharding.resharding.JobHooks``) -----------
    def resharded(self, epoch: int, seconds: float) -> None:
        """This instance, leading, made the assignment of ``epoch``: to the observers."""
        self._rt.observer.resharded(self.name, epoch, seconds)

    def missed_fires(self, since: float, until: float) -> list[float]:
        """The schedule's fire times in (since, until], for failover of a departed instance."""
        schedule = self._schedule
        fires: list[float] = []
        if schedule is None:
            return fires
        due = schedule.next_fire(since)
        while due is not None and due <= until and len(fires) < MAX_MISSED_FIRES:
            fires.append(due)
            due = schedule.next_fire(due)
        return fires

    # -- failover -------------------------------------------------------------------------
    def _follow_assignment(self) -> None:
        """Queued failover work may become ours with a new assignment, not only on a queue
        change: a job with failover follows its assignment (once; the listener stays if
        failover is turned off, and does nothing then). A job without failover (the
        default) holds no listener: a bound method and a tuple, about 110 bytes a job."""
        self.sharding.add_assignment_listener(self._on_assignment_change)

    def _on_assignment_change(self) -> None:
        if self._config.failover and not self._rt.stopping.is_set():
            self._rt.coordinator.submit(self.run_failover)

    def _on_failover_event(self, event: Event) -> None:
        if event.kind is not EventKind.DELETED and self._config.failover:
            self._rt.coordinator.submit(self.run_failover)

    def run_failover(self) -> None:
        """Run queued failover work for items this instance owns, one fire time at a time,
        at once (not at the next fire); the owner runs it, so an item never runs twice at
        the same moment."""
        if not self._config.failover or self._rt.stopping.is_set() or self._sharding is None:
            return
        current = self._sharding.ready()
        if current is None:
            return  # a resharding is under way: the new assignment's owners take it
        if self._idle_fire is not None:
            self._queue_idle_fire(current)
        entries = self._sharding.failover_entries(current)
        if not entries:
            return
        fire_time = entries[0].fire_time
        claimed = [e for e in entries if e.fire_time == fire_time]
        with self._lock:
            if self._running or not self._live():
                return  # retried when the current run ends
            self._running = True
        try:
            self._submit_mark(current, [e.item for e in claimed], fire_time, claimed=claimed)
        except Exception as exc:
            self._not_started(fire_time, exc)

    def _hand_over(self, current: CurrentAssignment, fire_time: float, items: Sequence[int]) -> None:
        """Queue for failover what this fire, planned under ``current`` with ``items``,
        would leave to no one because it raced a resharding.

        Hazard: a moving item runs for a fire F on its old owner if that owner marked F
        before the fence, else on its new owner if the new owner planned F under the new
        epoch; the new owner skips every F up to the fence (``Assignment.ran_elsewhere``),
        so a run is never doubled. Neither runs it when (1) the old owner was fenced out
        of F: it plans F only now, under the new epoch, and queues the items it lost
        (``Assignment.moved_away``); or (2) the new owner planned F after the fence but
        under its still-old view, holding no item then (a newcomer): no mark was there to
        be refused, so it remembers F and, once it holds items, queues F for them. The
        second may queue a pair the old owner ran (clocks apart): a failover re-run,
        allowed (at least once), never beside the item's owner."""
        sharding = self.sharding
        assignment = current.assignment
        me = self._rt.identity.instance_id
        lost = assignment.moved_away(fire_time, me)
        if lost:
            disabled = sharding.disabled_items()
            entries = [FailoverEntry(fire_time, item, me) for item in lost if item not in disabled]
            sharding.queue_failover(entries, "fenced out before its item moved")
        if items:
            if self._idle_fire is not None:
                self._queue_idle_fire(current)
        else:
            with self._lock:
                self._idle_fire = (fire_time, current.epoch)

    def _queue_idle_fire(self, current: CurrentAssignment) -> None:
        """Queue the last fire planned with no item for this instance's items in
        ``current``, if ``current`` is a later epoch (``_hand_over``, case 2)."""
        with self._lock:
            idle = self._idle_fire
            if idle is None or idle[1] == current.epoch:
                return
            self._idle_fire = None
        fire_time = idle[0]
        me = self._rt.identity.instance_id
        assignment = current.assignment
        entries = [
            FailoverEntry(fire_time, item, me)
            for item in self.sharding.local_items(current)
            if not assignment.ran_elsewhere(item, fire_time, me)
        ]
        self.sharding.queue_failover(entries, "planned under an earlier epoch with no item here")

    # -- triggers -----------------------------------------------------------------------
    def _on_trigger_event(self, event: Event) -> None:
        if (
            event.path == self.paths.trigger(self._rt.identity.instance_id)
            and event.kind is not EventKind.DELETED
        ):
            self._rt.coordinator.submit(self._run_triggered, event.value or b"")

    def _run_triggered(self, stamp: bytes) -> None:
        """One run for a trigger; its fire time is the one the trigger carries, so every
        instance's part of the same trigger shares it."""
        try:
            self._rt.reg.delete(self.paths.trigger(self._rt.identity.instance_id))
        except RegistryError:
            log.warning("job %s: could not consume the trigger", self.name, exc_info=True)
            return
        try:
            fire_time = float(stamp.decode())
        except (UnicodeDecodeError, ValueError):
            log.error(
                "job %s: trigger node holds %r, not a fire time; running with now", self.name, stamp[:40]
            )
            fire_time = time.time()
        self.fire(fire_time, TRIGGER)

    # -- an operator's shutdown request -------------------------------------------------
    def _on_shutdown_event(self, event: Event) -> None:
        if (
            event.path == self.paths.shutdown(self._rt.identity.instance_id)
            and event.kind is not EventKind.DELETED
            and self._on_shutdown_request is not None
        ):
            threading.Thread(
                target=self._on_shutdown_request, args=(self,), name=f"shardjob-shutdown-{self.name}", daemon=True
            ).start()

    def consume_shutdown_request(self) -> None:
        """Delete the request once this instance has left (the leader's upkeep deletes
        it if this fails: its instance is gone)."""
        try:
            self._rt.reg.delete(self.paths.shutdown(self._rt.identity.instance_id))
        except RegistryError:
            log.warning("job %s: could not delete the shutdown request", self.name, exc_info=True)

    # -- runs ---------------------------------------------------------------------------
    def fire(self, fire_time: float, source: str = NORMAL, *, delay: float = 0.0) -> None:
        """Run this instance's items for ``fire_time`` (coordinator thread). The fenced
        mark goes to the scheduler's group commit; the items start once it is applied.
        ``delay``: the jitter this fire waited for after ``fire_time``."""
        if self._rt.stopping.is_set():
            return
        self._rt.observer.fire_due(self.name, fire_time, source)
        with self._lock:
            if self._running or not self._live():
                self._owe(fire_time, session_down=not self._running)
                return
            self._running = True
            self._delay = delay
        self._plan_run(fire_time, 0, source)

    def _plan_run(self, fire_time: float, attempt: int, source: str = NORMAL) -> None:
        """Plan the fire's fenced mark and submit it (this job's run slot held)."""
        try:
            self._check_clock()
            sharding = self.sharding
            current = sharding.ensure_ready(cancelled=self._rt.stopping.is_set)
            items = sharding.local_items(current)
            if self._config.failover:
                self._hand_over(current, fire_time, items)
            if current.assignment.ran or current.assignment.moved:
                # a fire no later than this epoch's fence is the previous owner's (it ran
                # it, or queues it for failover): see ``_hand_over``
                me = self._rt.identity.instance_id
                items = [i for i in items if not current.assignment.ran_elsewhere(i, fire_time, me)]
            if not items:
                self._run_ended()
                return
            self._submit_mark(current, items, fire_time, attempt=attempt, source=source)
        except Exception as exc:
            self._not_started(fire_time, exc)

    def _submit_mark(
        self,
        current: CurrentAssignment,
        items: Sequence[int],
        fire_time: float,
        *,
        claimed: Sequence[FailoverEntry] = (),
        attempt: int = _MARK_ATTEMPTS,
        source: str = NORMAL,
    ) -> None:
        marks = self.sharding.marks
        request = marks.plan(current, items, fire_time, claimed)
        self._rt.batcher.submit(
            request.ops,
            functools.partial(self._on_marked, request, attempt, source),
            doomed=functools.partial(marks.doomed, request),
        )

    def _on_marked(self, request: MarkRequest, attempt: int, source: str, error: BaseException | None) -> None:
        """The group commit applied the fenced mark, or refused it (committer thread:
        nothing here waits; planning again goes to the coordinator pool)."""
        marks = self.sharding.marks
        mark = request.mark
        if error is None:
            if time.monotonic() < self._rt.session_deadline():
                self._launch(marks.adopt(request), FAILOVER if request.claimed else source)
                return
            # Hazard: the answer may have been held on its way here past the session's
            # end, and the leader may have handed the items on since: started now, they
            # could run beside their new owner. Not started; the mark, if the session
            # still holds it, is removed as stale before the fire is tried again.
            late = marks.answered_late(request)
            if request.claimed and not self._rt.stopping.is_set():
                self._rt.coordinator.submit(self._requeue_claimed, request, "answered after the session's deadline")
                return
            self._not_started(mark.fire_time, late)
            return
        refused = marks.refusal(request, error)
        if request.claimed and refused.reason is FenceReason.REGISTRY and not self._rt.stopping.is_set():
            # the claim may have been applied, its entries gone from the queue with
            # nothing run: they go back to the queue (owed instead, the fire would be
            # replayed as this job's own, running this instance's items once more)
            self._rt.coordinator.submit(self._requeue_claimed, request, "of unknown outcome")
            return
        if attempt + 1 < _MARK_ATTEMPTS and not self._rt.stopping.is_set():
            # a resharding began between reading the assignment and marking: plan this
            # fire again with the new one rather than dropping it; a mark in place while
            # none is held is stale (see sharding.run_marks) and goes first
            if refused.reason is FenceReason.ASSIGNMENT:
                self._rt.coordinator.submit(self._plan_run, mark.fire_time, attempt + 1, source)
                return
            if refused.reason is FenceReason.RUNNING:
                self._rt.coordinator.submit(
                    self._replan_after_stale_mark, refused, mark.fire_time, attempt + 1, source
                )
                return
        self._not_started(mark.fire_time, refused)

    def _requeue_claimed(self, request: MarkRequest, why: str) -> None:
        """A failover run not started whose claim may have been applied: its entries go
        back to the queue (a no-op for those still there; their items' owners run them),
        the mark it may have left is removed as stale (else the next claim is refused by
        it, and the next, until a fire of the job's own removes it), and this run ends.
        Not owed: replayed, its fire would run this job's own items."""
        log.warning(
            "job %s: failover run of fire %.3f not started: its claim was %s",
            self.name,
            request.mark.fire_time,
            why,
        )
        try:
            self.sharding.queue_failover(request.claimed, f"claimed by a mark {why}")
            self.sharding.marks.remove_stale_mark()
        except RegistryError as exc:
            log.warning("job %s: the mark of a failover run not started stays in doubt: %s", self.name, exc)
        finally:
            self._run_ended()

    def _replan_after_stale_mark(self, refused: FencedOut, fire_time: float, attempt: int, source: str) -> None:
        try:
            removed = self.sharding.marks.remove_if_stale()
        except RegistryError as exc:
            self._not_started(fire_time, exc)
            return
        if removed:
            self._plan_run(fire_time, attempt, source)
        else:
            self._not_started(fire_time, refused)

    def _not_started(self, fire_time: float, exc: BaseException) -> None:
        """A fire (or failover run) did not start: say why, owe it if nobody else will
        run it, and free the job's run slot."""
        retry = False
        if self._rt.stopping.is_set():
            pass  # the scheduler is shutting down: its pools and group commit refuse work
        elif isinstance(exc, FencedOut):
            self._rt.observer.run_fenced(self.name, fire_time, exc.reason)
            if exc.reason is FenceReason.REGISTRY:
                # the outcome is unknown and the session may well be alive, so nobody else
                # covers this fire: owe it and try again shortly (a mark the server applied
                # meanwhile is removed first, see sharding.run_marks)
                log.warning("%s; fire %.3f tried again in %gs", exc, fire_time, _RETRY_DELAY)
                with self._lock:
                    self._owe(fire_time, session_down=True)
                retry = True
            else:
                log.info("%s; resynchronising", exc)
        elif isinstance(exc, (ShardingError, ClockSkewError)):
            log.error("job %s: fire %.3f not run: %s", self.name, fire_time, exc)
        elif isinstance(exc, RegistryError):
            log.warning("job %s: fire %.3f not run: registry error: %s", self.name, fire_time, exc)
        else:
            log.error("job %s: fire %.3f failed to start", self.name, fire_time, exc_info=exc)
        self._run_ended(replay=not retry)
        if retry:
            self._retry_later()

    def _owe(self, fire_time: float, *, session_down: bool, why: str = "") -> None:
        """Remember a fire that cannot run now (lock held), as ``JobConfig.owed_fires`` says."""
        policy = self._config.owed_fires
        if policy is OwedFires.EVERY:
            if self._owed is None:
                self._owed = []
            owed = self._owed
            if fire_time not in owed:
                owed.append(fire_time)
                if len(owed) > 1 and fire_time < owed[-2]:  # a late fire owed after the ones it missed
                    owed.sort()
                del owed[:-MAX_MISSED_FIRES]  # the oldest beyond the bound
            what = "owed until the session is back" if session_down else "owed until the run ends"
        elif policy is OwedFires.ONE:
            if not self._owed:
                self._owed = [fire_time]
            what = "remembered as a misfire"
        else:
            what = "skipped"
        log.info("job %s: fire %.3f %s", self.name, fire_time, f"{what} ({why})" if why else what)
        self._rt.observer.fire_deferred(self.name, fire_time, _DEFERRED[policy])

    def _fire_owed(self, fire_time: float) -> None:
        """A fire owed earlier, run now (through the timer)."""
        self.fire(fire_time, OWED if self._config.owed_fires is OwedFires.EVERY else MISFIRE)

    def forget_owed(self) -> None:
        """The session expired: the fires owed meanwhile are the failover queue's now (the
        leader queues them for the items' new owners); replaying them here would run them
        twice."""
        with self._lock:
            self._owed = None

    def resume(self) -> None:
        """The session is back, or a retry is due: remove a running mark left in doubt,
        then run the fires owed meanwhile.

        Never waits on its coordinator thread for the job to be registered again: after a
        session expired, every job's resume is queued at once, ahead of the jobs'
        re-registrations on the same pool, and resumes waiting their turn held the pool
        (10,000 jobs ran no fire for minutes). Not registered yet, it tries again in
        ``_RETRY_DELAY`` seconds, through the timer."""
        with self._lock:
            if self._running or self._rt.stopping.is_set():
                return  # the running run's end replays what is owed
            live = self._live()
            if live:
                self._running = True  # nothing of this job may mark while the stale mark goes
        if not live:
            self._retry_later()
            return
        swept = False
        try:
            swept = self.sharding.remove_stale_mark()
        except RegistryError as exc:
            log.warning("job %s: a stale running mark could not be removed yet: %s", self.name, exc)
        self._run_ended(replay=swept)
        if not swept:
            self._retry_later()

    def _retry_later(self) -> None:
        """Resume again in ``_RETRY_DELAY`` seconds: a registry that failed a call while
        the session looked alive gets no state change that would resume us."""
        if not self._rt.stopping.is_set():
            self._rt.timer.schedule((self.name, "retry"), time.time() + _RETRY_DELAY, lambda _: self.resume())

    def _live(self) -> bool:
        return self._rt.live() and self._sharding is not None and self._sharding.registered

    def _check_clock(self) -> None:
        limit = self._config.max_time_diff_seconds
        if limit < 0:
            return
        skew = self._rt.clock_skew.skew()
        if abs(skew) > limit:
            raise ClockSkewError(
                f"local clock differs from the registry's by {skew:+.1f}s (max_time_diff_seconds={limit})"
            )

    def _launch(self, mark: RunMark, source: str) -> None:
        """The mark is held: hand the run's items to the worker pool (committer thread;
        listeners, the user's code, run on a worker). ``source``: why it runs (events)."""
        run = JobRun(
            job_name=self.name,
            instance_id=self._rt.identity.instance_id,
            fire_time=mark.fire_time,
            epoch=mark.epoch,
            items=mark.items,
            failover=source == FAILOVER,
            started=time.time(),
            delay=self._delay if source == NORMAL else 0.0,
        )
        launched = LaunchedRun(self, run, mark)
        self._rt.observer.run_started(run, source, launched.task_id)
        try:
            if self._listeners:
                self._rt.workers.submit(launched.begin)
            else:
                launched.hand_out()
        except PoolShutDown:  # the process is exiting
            self.complete(run, mark)

    def _item_parameter(self, config: JobConfig, item: int) -> str | None:
        """``item``'s parameter in ``config``, parsed once per configuration, not per fire;
        a job without item parameters (most jobs) keeps no memo of them."""
        if not config.sharding_item_parameters:
            return None
        memo = self._parameters
        if memo is None or memo[0] is not config:
            memo = self._parameters = (config, config.item_parameters())
        return memo[1].get(item)

    def _context(self, run: JobRun, item: int, task_id: str) -> ShardingContext:
        config = self._config
        return ShardingContext(
            job_name=self.name,
            task_id=task_id,
            sharding_total_count=config.sharding_total_count,
            job_parameter=config.job_parameter,
            sharding_item=item,
            sharding_parameter=self._item_parameter(config, item),
            fire_time=run.fire_time,
            epoch=run.epoch,
            failover=run.failover,
            time_zone=config.time_zone,
            deadline=None if config.timeout_seconds is None else arm(self._rt.timer, config.timeout_seconds),
        )

    def before_job(self, run: JobRun) -> None:
        """The listeners' ``before_job`` (a worker's task, before the run's items)."""
        for listener in self._listeners:
            self._call_listener(listener.before_job, run)

    def _keep_going(self) -> bool:
        return not self._rt.stopping.is_set() and not self.sharding.resharding_pending()

    def run_item(self, run: JobRun, item: int, task_id: str) -> None:
        """Run ``item`` of ``run`` (a worker's task): its attempts, retries and error handler."""
        ctx = self._context(run, item, task_id)
        error = self.run_attempt(run, ctx)
        if error is None:
            return
        config = self._config
        if config.retries:
            from scheduler.retries import retry_item  # tenacity: loaded by the first retry

            ctx, error = retry_item(
                self, run, ctx, error, retries=config.retries, backoff=config.retry_backoff_seconds
            )
            if error is None:
                return
        run.errors[ctx.sharding_item] = error
        try:
            self._error_handler(ctx, error)
        except Exception as thrown:  # THROW, or a handler that fails
            log.error("job %s item %d: %s", self.name, ctx.sharding_item, thrown, exc_info=thrown)

    # -- one attempt of an item, and its retries (scheduler.retries) ------------------------
    def run_attempt(self, run: JobRun, ctx: ShardingContext) -> Exception | None:
        """Run one attempt of an item; the error it failed with, or None. An attempt its
        deadline reached fails with ``JobTimeout`` whatever it did afterwards."""
        self._rt.observer.item_started(run, ctx)
        error: Exception | None = None
        try:
            self._item_runner(ctx, self._keep_going)
        except Exception as exc:
            error = exc
        deadline = ctx.deadline
        if deadline is not None and disarm(self._rt.timer, deadline):
            timed_out = JobTimeout(self.name, ctx.sharding_item, deadline.timeout)
            timed_out.__cause__ = error
            error = timed_out
        self._rt.observer.item_ended(run, ctx, error)
        return error

    def retry_context(self, ctx: ShardingContext, attempt: int) -> ShardingContext:
        timeout = self._config.timeout_seconds
        deadline: Deadline | None = None if timeout is None else arm(self._rt.timer, timeout)
        return dataclasses.replace(ctx, attempt=attempt, deadline=deadline)

    def owns_item(self, run: JobRun, item: int) -> bool:
        """The retry fence: this instance may run ``item`` of ``run`` again now."""
        if self._halted or self._rt.stopping.is_set() or not self._live():
            return False
        current = self.sharding.ready()  # None while a resharding is flagged or under way
        return current is not None and current.epoch == run.epoch and item in self.sharding.local_items(current)

    def retry_backoff(self, run: JobRun, item: int, seconds: float) -> None:
        """Wait ``seconds`` before a retry; woken by any change of the job's nodes (and
        by ``stop_firing``) to end early once the fence fell."""
        self._rt.cache.wait_until(lambda: not self.owns_item(run, item), seconds, under=self.paths.root)

    def complete(self, run: JobRun, mark: RunMark) -> None:
        """Every item ended (worker thread): the mark's removal goes to the group commit;
        the run is over once it is applied."""
        try:
            self._rt.batcher.submit(
                self.sharding.marks.clear_ops(mark), functools.partial(self._on_cleared, run)
            )
        except BatcherClosed:
            self.sharding.clear_running(mark)
            self._on_cleared(run, None, cleared=True)

    def _on_cleared(self, run: JobRun, error: BaseException | None, *, cleared: bool = False) -> None:
        if not cleared:
            self.sharding.marks.cleared(error)
        run.finished = time.time()
        self._rt.observer.run_ended(run)
        if self._listeners:
            try:
                self._rt.workers.submit(functools.partial(self._finish, run))
                return
            except PoolShutDown:
                pass  # the process is exiting: the listeners run here
        self._finish(run)

    def _finish(self, run: JobRun) -> None:
        for listener in self._listeners:
            self._call_listener(listener.after_job, run)
        self._run_ended()
        if self.sharding.mark_in_doubt:
            self._retry_later()

    def _run_ended(self, *, replay: bool = True) -> None:
        """The run (or the attempt) is over; with ``replay``, start what is owed next."""
        with self._lock:
            self._running = False
            if self._idle is not None:
                self._idle.notify_all()
            missed = self._owed.pop(0) if replay and self._owed and self._live() else None
        if self._rt.stopping.is_set() or not replay:
            return
        if missed is not None:
            log.info("job %s: running owed fire %.3f now", self.name, missed)
            # Through the timer, due at once, like any fire, so that its drains take owed
            # fires one at a time where the registry never waits. Hazard: handed to the
            # coordinator pool instead, a backlog of owed fires runs on all its threads at
            # once, and threads taking turns on the GIL for work that never waits only
            # add to what each fire costs.
            self._rt.timer.schedule((self.name, "owed", missed), missed, self._fire_owed, fire=True)
        elif self._config.failover and self._rt.cache.exists(self.paths.failover_items):
            self._rt.coordinator.submit(self.run_failover)

    def _call_listener(self, fn: Callable[[JobRun], Any], run: JobRun) -> None:
        try:
            fn(run)
        except Exception:
            log.exception("job %s: listener %r raised; the run goes on", self.name, fn)
