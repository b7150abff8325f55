"""The user's entry point: ``Scheduler(url)``, jobs added by decorator or ``add_job``,
``start()``, ``trigger()``, ``shutdown()``.

One scheduler is one instance (``{ip}@-@{pid}``, unique within the process) with one
registry session, one cache of the namespace, one timer thread, a small coordinator pool
and one worker pool shared by every job. The thread count at rest is fixed by
configuration, never by the number of jobs; after a new session, threads that live only
for it register the jobs and campaign again, as ``start()`` does, and a leader's burst of
reshardings gets such threads too.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import registry
from registry.errors import RegistryError
from registry.protocol import Characteristic, RegistryCenter, SessionState
from registry.recipes.batch import TransactionBatcher
from registry.recipes.cache import TreeCache
from scheduler.async_loop import AsyncLoop
from scheduler.burst_pool import BurstPool
from scheduler.clock_skew import ClockSkew
from scheduler.coarse_timer import CoarseTimer
from scheduler.config import JobConfig, JobType
from scheduler.config_packing import ConfigPacking
from scheduler.events import Observers
from scheduler.handlers import ErrorHandler, JobListener, resolve_error_handler
from scheduler.heap_release import release_free_heap
from scheduler.kinds import JobTarget, make_item_runner
from scheduler.observe import make_history, serve_http
from scheduler.runner import JobRunner
from scheduler.runtime import Runtime
from scheduler.timer import Timer
from scheduler.workers import WorkerPool
from sharding import InstanceIdentity, ShardingError
from sharding.layout import JobPaths, is_leaf, is_running_marks, validate_job_name
from sharding.layout_version import LayoutUpgrader, check_runnable

if TYPE_CHECKING:
    from scheduler.history import HistoryWriter
    from scheduler.http import HttpEndpoint

__all__ = ["Scheduler"]

log = logging.getLogger("scheduler")

F = TypeVar("F")
T = TypeVar("T")
R = TypeVar("R")

#: jobs registered (or handed over) at once by ``start()`` and ``shutdown()``
_STARTERS = 128
#: threads at most that register jobs and campaign again after a new session, as many as
#: ``start()`` registers at once (their transactions share the group commit's round trips)
_REJOINERS = _STARTERS
#: threads at most that evaluate and reshard jobs at once: when an instance joins or leaves,
#: every job this instance leads reshards together, a few round trips each (shared through
#: the group commit); on the coordinator pool's few threads that burst held every job's
#: fires until it was done
_RESHARDERS = _STARTERS


def _default_workers() -> int:
    """ElasticJob's CPU provider: twice the cores."""
    return max(4, 2 * (os.cpu_count() or 1))


def _each(items: Sequence[T], action: Callable[[T], R]) -> list[R]:
    """``action`` on every item, ``_STARTERS`` at a time, on threads that live only for it."""
    if not items:
        return []
    with ThreadPoolExecutor(min(len(items), _STARTERS), thread_name_prefix="shardjob-start") as pool:
        return list(pool.map(action, items))


@dataclass(frozen=True, slots=True)
class _Registration:
    """A job as added: what ``start()`` (or a later ``add_job``) runs."""

    config: JobConfig
    target: JobTarget | None
    listeners: tuple[JobListener, ...]
    handler: ErrorHandler


class Scheduler:
    """Distributed, sharded cron jobs over one registry (see the package docstring)."""

    def __init__(
        self,
        registry_center: str | RegistryCenter,
        *,
        instance_id: str | None = None,
        max_workers: int | None = None,
        coordinator_threads: int = 4,
        wait_timeout: float = 30.0,
        clock: Callable[[], float] = time.time,
        history: str | HistoryWriter | None = None,
    ) -> None:
        """``clock``: the local wall clock that ``max_time_diff_seconds`` compares with the
        registry's (``time.time``; another source, e.g. one with an offset, only for that
        check — the timer always runs on ``time.time``)."""
        if isinstance(registry_center, str):
            registry.parse_url(registry_center)  # a bad URL fails here, not at start()
        elif not isinstance(registry_center, RegistryCenter):
            raise ValueError("Scheduler needs a registry URL or a RegistryCenter")
        if max_workers is not None and (not isinstance(max_workers, int) or max_workers < 1):
            raise ValueError(f"max_workers must be an int >= 1, got {max_workers!r}")
        if not isinstance(coordinator_threads, int) or coordinator_threads < 1:
            raise ValueError(f"coordinator_threads must be an int >= 1, got {coordinator_threads!r}")
        self._registry_source = registry_center
        self.identity = InstanceIdentity.create(instance_id)
        self._max_workers = max_workers or _default_workers()
        self._coordinator_threads = coordinator_threads
        self._wait_timeout = wait_timeout
        self._clock = clock
        self._jobs: dict[str, _Registration] = {}
        self._runners: dict[str, JobRunner] = {}
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._runtime: Runtime | None = None
        self._owns_registry = isinstance(registry_center, str)
        self._started = False
        self._failed: dict[str, Exception] = {}
        self._shut_down: dict[str, float] = {}
        #: every job's runner holds it: bound once, not once per job (64 bytes each)
        self._on_shutdown_request = self._shutdown_requested
        #: where async jobs run: one loop thread, started by the first coroutine
        self.async_loop = AsyncLoop(f"shardjob-async-{self.identity.instance_id}")
        self.observers = Observers()  # run history and metrics subscribe here
        self.history: HistoryWriter | None = make_history(history, self.identity, self.observers)

    # -- identity -----------------------------------------------------------------------
    @property
    def instance_id(self) -> str:
        return self.identity.instance_id

    @property
    def running(self) -> bool:
        return self._started and not self._stopping.is_set()

    @property
    def runtime(self) -> Runtime | None:
        """What every job of this scheduler shares (session, cache, timer, pools), for its
        own probes and metrics; None before ``start()``."""
        return self._runtime

    @property
    def registry(self) -> RegistryCenter:
        if self._runtime is None:
            raise RuntimeError("the scheduler is not started")
        return self._runtime.reg

    def runner(self, name: str) -> JobRunner:
        with self._lock:
            if name not in self._runners:
                raise KeyError(f"job {name!r} is not running in this scheduler")
            return self._runners[name]

    @property
    def failed_jobs(self) -> dict[str, Exception]:
        """Jobs that could not start, with the reason (the others run)."""
        with self._lock:
            return dict(self._failed)

    @property
    def shut_down_jobs(self) -> dict[str, float]:
        """Jobs an operator shut down on this instance (``Cluster.shutdown``), with when;
        they stay down until this process restarts."""
        with self._lock:
            return dict(self._shut_down)

    @property
    def jobs(self) -> list[str]:
        with self._lock:
            return sorted(self._jobs)

    # -- jobs -----------------------------------------------------------------------------
    def job(
        self,
        name: str | None = None,
        *,
        listeners: Iterable[JobListener] = (),
        error_handler: str | ErrorHandler | None = None,
        **fields: Any,
    ) -> Callable[[F], F]:
        """Decorator: ``@sched.job(name=..., cron=..., sharding_total_count=...)``.

        The decorated object is the job: a function of one ``ShardingContext`` (simple),
        or a class/object with ``fetch_data``/``process_data`` (dataflow)."""

        def register(target: F) -> F:
            job_name = name or getattr(target, "__name__", None)
            if not job_name:
                raise ValueError("job name missing and the target has no __name__")
            job_target: Any = target
            if isinstance(target, type):
                job_target = target()
            self._add(job_name, fields, job_target, listeners, error_handler)
            return target

        return register

    def add_job(
        self,
        config: JobConfig,
        func: JobTarget | None = None,
        *,
        listeners: Iterable[JobListener] = (),
        error_handler: str | ErrorHandler | None = None,
    ) -> None:
        """Add a job; a bad config or target raises ``ValueError`` before anything is
        written. Added after ``start()``, it starts at once."""
        if not isinstance(config, JobConfig):
            raise ValueError(f"add_job needs a JobConfig, got {type(config).__name__}")
        handler = resolve_error_handler(error_handler if error_handler is not None else config.error_handler)
        make_item_runner(config, func, loop=self.async_loop)  # checks the target against the kind
        with self._lock:
            if config.name in self._jobs:
                raise ValueError(f"job {config.name!r} is already added to this scheduler")
            self._jobs[config.name] = _Registration(config, func, tuple(listeners), handler)
            start_now = self.running
        if start_now:
            runner = self._start_job(config.name)
            if runner is not None:
                runner.begin_firing()

    def _add(
        self,
        name: str,
        fields: Mapping[str, Any],
        target: Any,
        listeners: Iterable[JobListener],
        error_handler: str | ErrorHandler | None,
    ) -> None:
        config = JobConfig(name=name, **fields)
        self.add_job(
            config,
            None if config.job_type is JobType.SCRIPT else target,
            listeners=listeners,
            error_handler=error_handler,
        )

    def remove_job(self, name: str, *, wait: bool = True) -> None:
        """Stop a job on this instance (its items move to the others at once)."""
        with self._lock:
            self._jobs.pop(name, None)
            runner = self._runners.pop(name, None)
        if runner is not None:
            runner.stop_firing()
            if wait:
                runner.wait_idle()
            runner.leave()

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        """Connect, register every job, and return; jobs fire in the background. Every job
        begins firing once all are registered, so the first jobs' fires do not slow the
        start-up of the rest; a fire that fell due meanwhile runs once, at once."""
        with self._lock:
            if self._started:
                return
            if self._stopping.is_set():
                raise RuntimeError("a scheduler cannot be started again after shutdown")
            reg = (
                registry.connect(self._registry_source)
                if isinstance(self._registry_source, str)
                else self._registry_source
            )
            network = Characteristic.NETWORK in reg.characteristics
            # jobs' configs kept packed (scheduler/config_packing.py) where the cache holds
            # them as read off the wire; on memory it holds the store's own objects, and a
            # packed copy beside each would add bytes
            packing = ConfigPacking() if network else None
            cache = TreeCache(reg, "/", exclude=is_running_marks, leaves=is_leaf, packing=packing)
            try:
                check_runnable(reg)  # before anything is written: a layout we cannot run on
                cache.start()
            except BaseException:
                if self._owns_registry:
                    reg.close()
                raise
            coordinator = ThreadPoolExecutor(self._coordinator_threads, thread_name_prefix="shardjob-coord")
            rejoin = BurstPool(_REJOINERS, "shardjob-rejoin")
            # a memory registry never waits on a round trip: its reshardings only compute, so
            # no more of them at once than the coordinator ran before
            resharding = BurstPool(_RESHARDERS if network else self._coordinator_threads, "shardjob-reshard")
            workers = WorkerPool(self._max_workers, "shardjob-worker")
            # a memory registry never waits: one committer, not threads taking turns on the GIL
            batcher = TransactionBatcher(reg, committers=4 if network else 1).start()
            # one drain at a time on every registry: a fire hands its writes to the group
            # commit and never waits for them, so more drains would only take turns on the
            # GIL with the committers; a fire that does wait (a leader resharding) gets
            # another drain started after the timer's stall. Fires wait in the timer while
            # the group commit is behind (its backlog)
            timer = Timer(coordinator, max_drains=self._coordinator_threads, backlog=batcher.backlog)
            commit = batcher.commit if network else reg.transaction
            self._runtime = Runtime(
                reg=reg,
                identity=self.identity,
                cache=cache,
                timer=timer,
                coordinator=coordinator,
                rejoin=rejoin,
                resharding=resharding,
                workers=workers,
                batcher=batcher,
                commit=commit,
                worker_count=self._max_workers,
                wait_timeout=self._wait_timeout,
                stopping=self._stopping,
                live=lambda: reg.state in (SessionState.CONNECTED, SessionState.RECONNECTED),
                clock_skew=ClockSkew(reg, self._clock),
                reconciles=CoarseTimer(timer, coordinator),
                observer=self.observers,
                layout=LayoutUpgrader(reg, cache, commit),
            )
            if self.history is not None:
                self.history.start()
            reg.add_listener(self._on_session)
            # then each job's side of the same change (its runner's ``on_session``)
            job_events = self._runtime.job_events
            reg.add_listener(job_events.on_session)
            cache.add_listener(job_events.on_event)
            timer.start()
            self._started = True
            names = list(self._jobs)
        # jobs start side by side: each start waits on round trips and on its own writes
        # coming back through the cache, so N jobs one after the other cost N times that;
        # they begin firing once all are up (``JobRunner.begin_firing``)
        for runner in _each(names, self._start_job):
            if runner is not None:
                runner.begin_firing()
        release_free_heap()  # the tables the start-up outgrew (scheduler/heap_release.py)
        log.info("scheduler %s started with %d job(s)", self.instance_id, len(names))

    def _start_job(self, name: str) -> JobRunner | None:
        """Register ``name`` and make its first assignment; its cron is not armed yet.
        None when it could not start (kept in ``failed_jobs``)."""
        assert self._runtime is not None
        job = self._jobs[name]
        runner = JobRunner(
            self._runtime,
            job.config,
            make_item_runner(job.config, job.target, loop=self.async_loop),
            job.listeners,
            job.handler,
            on_shutdown_request=self._on_shutdown_request,
        )
        with self._lock:
            self._runners[name] = runner
        try:
            runner.start()
            runner.settle()
        except (RegistryError, ShardingError, ValueError) as exc:
            with self._lock:
                self._failed[name] = exc
            log.error("job %s could not start (%s); the other jobs go on", name, exc)
            return None
        return runner

    def _shutdown_requested(self, runner: JobRunner) -> None:
        """An operator asked this instance to stop ``runner``'s job: stop firing, let its
        running items finish, leave (its items move at once), then consume the request.
        Never a self-shutdown: only an operator's request leads here."""
        with self._lock:
            if self._runners.get(runner.name) is not runner or self._stopping.is_set():
                return
            del self._runners[runner.name]
            self._shut_down[runner.name] = time.time()
        log.warning("job %s: shut down on this instance at an operator's request", runner.name)
        runner.stop_firing()
        runner.wait_idle()
        runner.leave()
        runner.consume_shutdown_request()

    def _on_session(self, state: SessionState) -> None:
        runtime = self._runtime
        if runtime is None or self._stopping.is_set():
            return
        if state is SessionState.LOST:
            with self._lock:
                lost = list(self._runners.values())
            for runner in lost:
                if runner.config.failover:
                    runner.forget_owed()
        if state in (SessionState.CONNECTED, SessionState.RECONNECTED):
            with self._lock:
                runners = list(self._runners.values())
            for runner in runners:
                runtime.coordinator.submit(runner.resume)
        else:
            log.warning(
                "scheduler %s: session %s; no new run starts until it is back", self.instance_id, state.value
            )

    def trigger(self, name: str) -> None:
        """Run ``name`` once now on every instance that runs it (each its own items)."""
        validate_job_name(name)
        runtime = self._runtime
        if runtime is None:
            raise RuntimeError("start() the scheduler before trigger()")
        paths = JobPaths(name)
        instances = runtime.cache.children(paths.instances)
        if not instances:
            raise ValueError(f"job {name!r} has no running instance to trigger")
        stamp = repr(time.time()).encode()
        for instance_id in instances:
            runtime.reg.put(paths.trigger(instance_id), stamp)

    def shutdown(self, wait: bool = True) -> None:
        """Stop firing, let running items finish (``wait``), remove this instance's nodes
        and hand leadership over at once, then close the session."""
        with self._lock:
            if self._stopping.is_set():
                return
            self._stopping.set()
            runtime = self._runtime
            runners = list(self._runners.values())
        if runtime is None:
            return
        runtime.timer.stop()
        for runner in runners:
            runner.stop_firing()
        if wait:
            for runner in runners:
                runner.wait_idle()
        runtime.batcher.flush()  # what is queued (the last marks' removals) is committed first
        # No rejoin once leaving: the queued ones are dropped and the running ones end
        # first (a campaign holds its election's lock, which the job's withdrawal takes),
        # so none writes after its job left nor outlives the session. A registration
        # waiting out a stale node of its id sees ``stopping`` once woken, and gives up
        runtime.cache.wake()
        runtime.rejoin.shutdown(wait=True, drop_queued=True)
        # The cache stops following before the jobs leave: nothing in leaving waits for a
        # change, and what the jobs delete would otherwise be read again for a cache about
        # to close (ZooKeeper re-reads a node when its one-shot watch fires: about five
        # reads a job). A closed cache still answers reads from what it holds.
        runtime.cache.close()
        # jobs leave side by side, as they start, their hand-overs sharing transactions
        _each(runners, JobRunner.leave)
        runtime.batcher.close()
        runtime.reg.remove_listener(self._on_session)
        runtime.reg.remove_listener(runtime.job_events.on_session)
        runtime.cache.remove_listener(runtime.job_events.on_event)
        # after the jobs left: a resharding still running sees its job stopping and ends
        runtime.resharding.shutdown(wait=wait, drop_queued=True)
        runtime.coordinator.shutdown(wait=wait, cancel_futures=True)
        runtime.workers.shutdown(wait=wait, drop_queued=not wait)
        self.async_loop.stop()  # after the items: with wait, none is left on it
        if self._owns_registry:
            runtime.reg.close()
        if self.history is not None:
            self.history.close()
        log.info("scheduler %s shut down", self.instance_id)

    def serve_http(self, address: str = "127.0.0.1:9100") -> HttpEndpoint:
        """Serve /metrics, /healthz, /readyz and /dump for this scheduler at HOST:PORT."""
        return serve_http(self, address)

    def __enter__(self) -> Scheduler:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown(wait=True)
