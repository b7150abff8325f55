"""Prometheus metrics for one scheduler, fed by the run event sink and read at scrape time
from its cached state.

Invariants: every metric lives in the scheduler's own ``CollectorRegistry`` (never the
process-wide default), so several schedulers in one process, and tests, never collide;
label values are bounded: job names, this instance, and small fixed sets (source,
outcome, reason) — never a fire time or an error message.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from scheduler.context import ShardingContext
from scheduler.events import NORMAL, RunObserver
from scheduler.handlers import JobRun

if TYPE_CHECKING:
    from scheduler.scheduler import Scheduler

__all__ = ["MetricsObserver", "MetricsUnavailable"]

_LATENESS_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)


class MetricsUnavailable(RuntimeError):
    """Metrics were asked for but prometheus_client is not installed."""


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise MetricsUnavailable("metrics need prometheus_client: pip install 'shardjob[metrics]'") from None
    return prometheus_client


class MetricsObserver(RunObserver):
    """Counts and times what the runner reports; ``registry`` is what /metrics exposes."""

    def __init__(self, scheduler: Scheduler) -> None:
        pc = _prometheus()
        self.registry = pc.CollectorRegistry(auto_describe=True)
        self._instance = scheduler.instance_id
        labels = ["job", "instance"]
        r = self.registry
        self.fires_due = pc.Counter(
            "shardjob_fires_due", "Fires that reached the runner, by source", [*labels, "source"], registry=r
        )
        self.fires_deferred = pc.Counter(
            "shardjob_fires_deferred",
            "Fires that could not run at once: owed (failover on), misfire (remembered) or skipped",
            [*labels, "what"],
            registry=r,
        )
        self.runs = pc.Counter(
            "shardjob_runs", "Runs started (marked and handed to workers), by source", [*labels, "source"], registry=r
        )
        self.fenced = pc.Counter(
            "shardjob_runs_fenced",
            "Fires whose fenced running mark was refused (nothing ran), by reason",
            [*labels, "reason"],
            registry=r,
        )
        self.items = pc.Counter(
            "shardjob_item_runs", "Item runs ended, by outcome", [*labels, "outcome"], registry=r
        )
        self.duration = pc.Histogram(
            "shardjob_item_duration_seconds", "Time one item ran", labels, buckets=_DURATION_BUCKETS, registry=r
        )
        self.lateness = pc.Histogram(
            "shardjob_fire_lateness_seconds",
            "Seconds from a scheduled fire time to its run's start (NORMAL runs)",
            labels,
            buckets=_LATENESS_BUCKETS,
            registry=r,
        )
        self.reshardings = pc.Counter(
            "shardjob_reshardings", "Assignments this instance wrote as the job's leader", labels, registry=r
        )
        self.resharding_duration = pc.Histogram(
            "shardjob_resharding_duration_seconds",
            "Time a resharding took on the leader (fence to new assignment cached)",
            labels,
            buckets=_LATENESS_BUCKETS,
            registry=r,
        )
        self.history_dropped = pc.Counter(
            "shardjob_history_rows_dropped",
            "History rows dropped because the buffer was full (database down or slow)",
            ["instance"],
            registry=r,
        )
        self.history_dropped.labels(self._instance)
        r.register(_StateCollector(scheduler, pc))
        history = scheduler.history
        if history is not None:
            dropped = self.history_dropped.labels(self._instance)
            history.on_drop = dropped.inc
        self._starts: dict[tuple[int, int], float] = {}

    def fire_due(self, job: str, fire_time: float, source: str) -> None:
        self.fires_due.labels(job, self._instance, source).inc()

    def fire_deferred(self, job: str, fire_time: float, what: str) -> None:
        self.fires_deferred.labels(job, self._instance, what).inc()

    def run_fenced(self, job: str, fire_time: float, reason: str) -> None:
        self.fenced.labels(job, self._instance, reason).inc()

    def run_started(self, run: JobRun, source: str, task_id: str) -> None:
        self.runs.labels(run.job_name, self._instance, source).inc()
        if source == NORMAL:
            self.lateness.labels(run.job_name, self._instance).observe(max(0.0, run.started - run.fire_time))

    def resharded(self, job: str, epoch: int, seconds: float) -> None:
        self.reshardings.labels(job, self._instance).inc()
        self.resharding_duration.labels(job, self._instance).observe(seconds)

    def item_started(self, run: JobRun, ctx: ShardingContext) -> None:
        self._starts[(id(run), ctx.sharding_item)] = time.perf_counter()

    def item_ended(self, run: JobRun, ctx: ShardingContext, error: BaseException | None) -> None:
        start = self._starts.pop((id(run), ctx.sharding_item), None)
        if start is not None:
            self.duration.labels(run.job_name, self._instance).observe(time.perf_counter() - start)
        self.items.labels(run.job_name, self._instance, "success" if error is None else "failure").inc()


class _StateCollector:
    """Gauges read from the scheduler's cached state at scrape time: session, leadership,
    failover entries queued, history buffer."""

    def __init__(self, scheduler: Scheduler, pc: Any) -> None:
        self._sched = scheduler
        self._pc = pc

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        from scheduler.observe import snapshot

        sched, instance = self._sched, self._sched.instance_id
        session = GaugeMetricFamily(
            "shardjob_session_connected", "1 while the registry session is connected", labels=["instance"]
        )
        leader = GaugeMetricFamily("shardjob_leader", "1 where this instance leads the job", labels=["job", "instance"])
        registered = GaugeMetricFamily(
            "shardjob_job_registered", "1 where the job is registered on this instance", labels=["job", "instance"]
        )
        failover = GaugeMetricFamily(
            "shardjob_failover_entries_queued", "Failover entries waiting for an owner", labels=["job", "instance"]
        )
        epoch = GaugeMetricFamily(
            "shardjob_assignment_epoch",
            "The job's assignment epoch as cached here; each resharding adds one",
            labels=["job", "instance"],
        )
        state = snapshot(sched)
        session.add_metric([instance], 1.0 if state.connected else 0.0)
        for job in state.jobs:
            leader.add_metric([job.name, instance], 1.0 if job.leader else 0.0)
            registered.add_metric([job.name, instance], 1.0 if job.registered else 0.0)
            failover.add_metric([job.name, instance], float(job.failover_queued))
            epoch.add_metric([job.name, instance], float(job.epoch))
        yield session
        yield epoch
        yield leader
        yield registered
        yield failover
        history = sched.history
        if history is not None:
            buffered = GaugeMetricFamily(
                "shardjob_history_rows_buffered", "History rows waiting for the writer", labels=["instance"]
            )
            buffered.add_metric([instance], float(history.buffered))
            yield buffered
        yield from _registry_calls(sched, instance)


def _registry_calls(sched: Scheduler, instance: str) -> Iterator[Any]:
    """Round trips and errors by operation, as the backend counted them (always on)."""
    from prometheus_client.core import CounterMetricFamily

    from registry.backends.base import BaseRegistry
    from registry.counting import CountingRegistry

    try:
        reg = sched.registry
    except RuntimeError:
        return
    while isinstance(reg, CountingRegistry):  # a wrapper a user measures with
        reg = reg.inner
    if not isinstance(reg, BaseRegistry):
        return
    stats = reg.call_stats
    calls = CounterMetricFamily(
        "shardjob_registry_calls", "Registry round trips by operation", labels=["instance", "operation"]
    )
    for operation, count in sorted(stats.calls().items()):
        calls.add_metric([instance, operation], float(count))
    errors = CounterMetricFamily(
        "shardjob_registry_errors",
        "Registry round trips that failed, by operation and error",
        labels=["instance", "operation", "error"],
    )
    for (operation, error), count in sorted(stats.errors().items()):
        errors.add_metric([instance, operation, error], float(count))
    yield calls
    yield errors
