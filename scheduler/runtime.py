"""What every job of one scheduler shares (``Runtime``), and the sharding settings a job's
configuration gives (``sharding_settings``): made once by ``Scheduler.start()`` and handed to
each ``JobRunner``.

Invariant: what thousands of jobs hold alike is one object here, not one per job: the
callables every job's ``ShardingService`` is given are bound once (``Runtime``'s cached
properties), and jobs with equal settings share one frozen ``ShardingSettings``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

from registry.protocol import Check, RegistryCenter
from registry.recipes.batch import Commit, TransactionBatcher
from registry.recipes.cache import TreeCache
from scheduler.burst_pool import BurstPool
from scheduler.clock_skew import ClockSkew
from scheduler.coarse_timer import CoarseTimer
from scheduler.config import JobConfig
from scheduler.events import RunObserver
from scheduler.job_events import JobEvents
from scheduler.timer import Timer
from scheduler.workers import WorkerPool
from sharding import InstanceIdentity, ShardingSettings
from sharding.layout_version import LayoutUpgrader

__all__ = ["Runtime", "sharding_settings"]


@dataclass
class Runtime:
    """What every job of one scheduler shares: one session, one cache, one timer, its pools."""

    reg: RegistryCenter
    identity: InstanceIdentity
    cache: TreeCache
    timer: Timer
    coordinator: Executor
    #: where jobs register and campaign again after a new session or a deleted node:
    #: threads for the burst (``scheduler.burst_pool``), since fires wait on the
    #: coordinator pool for a registration and a leader
    rejoin: BurstPool
    #: where jobs evaluate and reshard (``ShardingService``'s executor): as bursty, and
    #: as much a matter of waiting on round trips, as rejoining
    resharding: BurstPool
    workers: WorkerPool
    #: the group commit of every job's running marks (``registry.recipes.batch``)
    batcher: TransactionBatcher
    #: start-up, shutdown and resharding transactions: ``batcher.commit`` on a registry
    #: reached over the network (N jobs share round trips), else ``reg.transaction``
    commit: Commit
    #: the worker pool's size: a run hands it at most this many tasks
    worker_count: int
    wait_timeout: float
    stopping: threading.Event
    live: Callable[[], bool]
    #: the registry's clock minus the local one for ``max_time_diff_seconds``, measured at
    #: most once a second for every job (``scheduler/clock_skew.py``)
    clock_skew: ClockSkew
    #: each job's periodic reconcile, due to the second (``scheduler/coarse_timer.py``)
    reconciles: CoarseTimer
    observer: RunObserver = RunObserver()  # noqa: RUF009 (a stateless no-op, shared)
    #: brings the namespace to this release's layout, driven by its job leaders
    layout: LayoutUpgrader | None = None
    #: every job's changes and the session's, heard once and handed to each job's runner
    job_events: JobEvents = dataclasses.field(default_factory=JobEvents)

    # The callables every job's ShardingService holds, bound once here: a method bound
    # in each job's start() is an object of 64 bytes per job (640 KiB at 10,000 jobs).
    @functools.cached_property
    def cancelled(self) -> Callable[[], bool]:
        """``stopping.is_set``."""
        return self.stopping.is_set

    @functools.cached_property
    def rejoin_submit(self) -> Callable[[Callable[[], object]], object]:
        """``rejoin.submit``."""
        return self.rejoin.submit

    @functools.cached_property
    def session_deadline(self) -> Callable[[], float]:
        """``reg.session_deadline`` (``BaseRegistry``); a registry without one vouches for
        its session always, as before it had one."""
        deadline: Callable[[], float] | None = getattr(self.reg, "session_deadline", None)
        return deadline if callable(deadline) else _ALWAYS

    @functools.cached_property
    def upgrade_layout(self) -> Callable[[Sequence[Check]], object] | None:
        """``layout.upgrade``, or None without a layout upgrader."""
        return None if self.layout is None else self.layout.upgrade


def _ALWAYS() -> float:
    return math.inf


def sharding_settings(config: JobConfig) -> ShardingSettings:
    return _settings(
        config.sharding_total_count,
        config.sharding_strategy,
        config.monitor_execution,
        config.static_sharding,
        config.failover,
        60.0 * config.server_expiry_minutes,
    )


@functools.lru_cache(maxsize=256)
def _settings(
    total: int, strategy: str, monitor: bool, static: bool, failover: bool, expiry: float
) -> ShardingSettings:
    """One frozen object for every job with the same settings (most jobs of a process
    share them), where one each was 80 bytes a job."""
    return ShardingSettings(
        total=total,
        strategy=strategy,
        monitor_execution=monitor,
        static=static,
        failover=failover,
        server_expiry_seconds=expiry,
    )
