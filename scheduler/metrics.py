"""Prometheus metrics for one scheduler, fed by the run event sink and read at scrape time
from its cached state.

Invariants: every metric lives in the scheduler's own ``CollectorRegistry`` (never the
process-wide default), so several schedulers in one process, and tests, never collide;
label values are bounded: job names, this instance, and small fixed sets (source,
outcome, reason) — never a fire time or an error message.
"""

from __future__ import annotations

import bisect
import itertools
import math
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from scheduler.context import ShardingContext
from scheduler.events import NORMAL, RunObserver
from scheduler.handlers import JobRun

if TYPE_CHECKING:
    from scheduler.scheduler import Scheduler

__all__ = ["MetricsObserver", "MetricsUnavailable"]

#: upper bounds (s), few and spread where alerts read them
_LATENESS_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
_DURATION_BUCKETS = (0.01, 0.1, 1.0, 10.0, 60.0, 300.0, 1800.0)


class MetricsUnavailable(RuntimeError):
    """Metrics were asked for but prometheus_client is not installed."""


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise MetricsUnavailable("metrics need prometheus_client: pip install 'shardjob[metrics]'") from None
    return prometheus_client


class _Counters:
    """A labelled counter family kept as a dict of ``itertools.count``: recording is a dict
    get and a ``next()`` — each one C call, atomic under the GIL, so the fire path takes no
    lock and builds no child object per label set. Collected at scrape time as one
    ``SeriesFamily``, without ``_created`` series (one per label set: at 1,000 jobs they
    would double the scrape)."""

    def __init__(self, name: str, doc: str, labels: Sequence[str], lock: threading.Lock) -> None:
        self.name, self.doc, self.labels = name, doc, list(labels)
        self._lock = lock
        self._counts: dict[tuple[str, ...], itertools.count[int]] = {}
        #: what ``inc`` added beyond one at a time (rare: the history's losses), under the lock
        self._added: dict[tuple[str, ...], float] = {}
        #: each label set's rendered text, kept across scrapes (``SeriesFamily``)
        self._rendered: dict[tuple[str, ...], str] = {}

    def inc(self, *key: str, amount: float = 1.0) -> None:
        if amount != 1.0:
            with self._lock:
                self._added[key] = self._added.get(key, 0.0) + amount
            self.touch(*key)
            return
        counter = self._counts.get(key)
        if counter is None:
            counter = self._counts.setdefault(key, itertools.count())  # one winner if two race
        next(counter)

    def touch(self, *key: str) -> None:
        """Expose ``key`` at 0 before anything happened (an alert can then use ``rate``)."""
        self._counts.setdefault(key, itertools.count())

    def family(self) -> Any:
        from scheduler.metrics_text import SeriesFamily

        with self._lock:
            added = dict(self._added)
        # list() of a dict's items is one C call: whole even while a fire adds a label set
        counts = sorted(list(self._counts.items()))
        series = [(key, _count_of(counter) + added.get(key, 0.0)) for key, counter in counts]
        return SeriesFamily(self.name, self.doc, "counter", self.labels, series, self._rendered)


def _count_of(counter: itertools.count[int]) -> int:
    """How many times ``next`` was called on ``counter`` (made as ``itertools.count()``):
    its repr, ``count(N)``, is the one public way to read it without taking a value."""
    return int(repr(counter)[6:-1])


class _Histograms:
    """A labelled histogram family kept as per-key bucket counts and a sum, updated under
    the observer's lock (a float sum has no atomic add); collected as ``_Counters`` are,
    without ``_created``."""

    def __init__(self, name: str, doc: str, labels: Sequence[str], buckets: Sequence[float], lock: threading.Lock) -> None:
        self.name, self.doc, self.labels = name, doc, list(labels)
        self._bounds = tuple(buckets)
        self._lock = lock
        #: key -> [count per bucket ..., count above the last bound, sum]
        self._values: dict[tuple[str, ...], list[float]] = {}

    def observe(self, value: float, *key: str) -> None:
        index = bisect.bisect_left(self._bounds, value)  # the first bound >= value: Prometheus' le
        with self._lock:
            entry = self._values.get(key)
            if entry is None:
                entry = self._values[key] = [0.0] * (len(self._bounds) + 2)
            entry[index] += 1.0
            entry[-1] += value

    def family(self) -> Any:
        from prometheus_client.core import HistogramMetricFamily

        family = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        with self._lock:
            values = [(key, list(entry)) for key, entry in sorted(self._values.items())]
        for key, entry in values:
            cumulative, buckets = 0.0, []
            for bound, count in zip((*self._bounds, math.inf), entry[:-1], strict=True):
                cumulative += count
                buckets.append(("+Inf" if bound == math.inf else repr(bound), cumulative))
            family.add_metric(list(key), buckets, sum_value=entry[-1])
        return family


class MetricsObserver(RunObserver):
    """Counts and times what the runner reports; ``registry`` is what /metrics exposes."""

    def __init__(self, scheduler: Scheduler) -> None:
        pc = _prometheus()
        self.registry = pc.CollectorRegistry(auto_describe=True)
        self._instance = scheduler.instance_id
        lock = threading.Lock()
        labels = ["job", "instance"]
        self.fires_due = _Counters("shardjob_fires_due", "Fires that reached the runner, by source", [*labels, "source"], lock)
        self.fires_deferred = _Counters(
            "shardjob_fires_deferred",
            "Fires that could not run at once: owed (failover on), misfire (remembered) or skipped",
            [*labels, "what"],
            lock,
        )
        self.runs = _Counters(
            "shardjob_runs", "Runs started (marked and handed to workers), by source", [*labels, "source"], lock
        )
        self.fenced = _Counters(
            "shardjob_runs_fenced", "Fires whose fenced running mark was refused (nothing ran), by reason", [*labels, "reason"], lock
        )
        self.items = _Counters(
            "shardjob_item_runs", "Item runs (each attempt) ended, by outcome", [*labels, "outcome"], lock
        )
        self.retries = _Counters(
            "shardjob_item_retries", "Item attempts after the first (retries), started", labels, lock
        )
        # Histograms are per instance, not per job: a histogram is a dozen series, and at
        # 1,000 jobs per-job histograms made a scrape 20,000 lines longer and took ~30 us
        # of CPU per fire at a 10 s scrape. What falls behind is the process, which these
        # show; per job, the counters and the run history tell the rest.
        self.duration = _Histograms(
            "shardjob_item_duration_seconds", "Time one item ran, any job", ["instance"], _DURATION_BUCKETS, lock
        )
        self.lateness = _Histograms(
            "shardjob_fire_lateness_seconds",
            "Seconds from a scheduled fire time (plus the jitter chosen for it) to its run's start (NORMAL runs), any job",
            ["instance"],
            _LATENESS_BUCKETS,
            lock,
        )
        self.reshardings = _Counters(
            "shardjob_reshardings", "Assignments this instance wrote as the job's leader", labels, lock
        )
        self.resharding_duration = _Histograms(
            "shardjob_resharding_duration_seconds",
            "Time a resharding took on the leader (fence to new assignment cached), any job",
            ["instance"],
            _LATENESS_BUCKETS,
            lock,
        )
        self.history_dropped = _Counters(
            "shardjob_history_rows_dropped",
            "History rows dropped because the buffer was full (database down or slow)",
            ["instance"],
            lock,
        )
        self.history_dropped.touch(self._instance)
        self.history_rejected = _Counters(
            "shardjob_history_rows_rejected",
            "History rows the database refused (a constraint, a value it cannot store), dropped alone",
            ["instance"],
            lock,
        )
        self.history_rejected.touch(self._instance)
        r = self.registry
        r.register(
            _FamiliesCollector(
                [
                    self.fires_due,
                    self.fires_deferred,
                    self.runs,
                    self.fenced,
                    self.items,
                    self.retries,
                    self.duration,
                    self.lateness,
                    self.reshardings,
                    self.resharding_duration,
                    self.history_dropped,
                    self.history_rejected,
                ],
            )
        )
        r.register(_StateCollector(scheduler, pc))
        history = scheduler.history
        if history is not None:
            instance, dropped, rejected = self._instance, self.history_dropped, self.history_rejected
            history.on_drop = lambda count: dropped.inc(instance, amount=float(count))
            history.on_reject = lambda count: rejected.inc(instance, amount=float(count))
        #: id(ctx) -> its attempt's start, from item_started to item_ended (as the history's)
        self._starts: dict[int, float] = {}

    def fire_due(self, job: str, fire_time: float, source: str) -> None:
        self.fires_due.inc(job, self._instance, source)

    def fire_deferred(self, job: str, fire_time: float, what: str) -> None:
        self.fires_deferred.inc(job, self._instance, what)

    def run_fenced(self, job: str, fire_time: float, reason: str) -> None:
        self.fenced.inc(job, self._instance, reason)

    def run_started(self, run: JobRun, source: str, task_id: str) -> None:
        self.runs.inc(run.job_name, self._instance, source)
        if source == NORMAL:
            # from the jittered due time: the jitter chosen is not lateness
            self.lateness.observe(max(0.0, run.started - run.fire_time - run.delay), self._instance)

    def resharded(self, job: str, epoch: int, seconds: float) -> None:
        self.reshardings.inc(job, self._instance)
        self.resharding_duration.observe(seconds, self._instance)

    def item_started(self, run: JobRun, ctx: ShardingContext) -> None:
        self._starts[id(ctx)] = time.perf_counter()
        if ctx.attempt > 1:
            self.retries.inc(run.job_name, self._instance)

    def item_ended(self, run: JobRun, ctx: ShardingContext, error: BaseException | None) -> None:
        start = self._starts.pop(id(ctx), None)
        if start is not None:
            self.duration.observe(time.perf_counter() - start, self._instance)
        self.items.inc(run.job_name, self._instance, "success" if error is None else "failure")


class _FamiliesCollector:
    """Yields the observer's counter and histogram families at scrape time."""

    def __init__(self, families: Sequence[_Counters | _Histograms]) -> None:
        self._families = list(families)

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        for family in self._families:
            yield family.family()


class _StateCollector:
    """Gauges read from the scheduler's cached state at scrape time: session, leadership,
    failover entries queued, history buffer."""

    def __init__(self, scheduler: Scheduler, pc: Any) -> None:
        self._sched = scheduler
        self._pc = pc
        #: (job, instance) -> its rendered labels, shared by the per-job gauges (``SeriesFamily``)
        self._rendered: dict[tuple[str, ...], str] = {}

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        from scheduler.metrics_text import SeriesFamily
        from scheduler.observe import snapshot

        sched, instance = self._sched, self._sched.instance_id
        session = GaugeMetricFamily(
            "shardjob_session_connected", "1 while the registry session is connected", labels=["instance"]
        )
        state = snapshot(sched)
        session.add_metric([instance], 1.0 if state.connected else 0.0)
        rendered = self._rendered
        if len(rendered) > 2 * len(state.jobs) + 64:  # jobs removed since: forget their labels
            rendered.clear()
        keys = [(job.name, instance) for job in state.jobs]

        def gauge(name: str, doc: str, values: list[float]) -> Any:
            return SeriesFamily(name, doc, "gauge", ("job", "instance"), list(zip(keys, values, strict=True)), rendered)

        yield session
        yield gauge(
            "shardjob_assignment_epoch",
            "The job's assignment epoch as cached here; each resharding adds one",
            [float(job.epoch) for job in state.jobs],
        )
        yield gauge(
            "shardjob_leader", "1 where this instance leads the job", [1.0 if job.leader else 0.0 for job in state.jobs]
        )
        yield gauge(
            "shardjob_job_registered",
            "1 where the job is registered on this instance",
            [1.0 if job.registered else 0.0 for job in state.jobs],
        )
        yield gauge(
            "shardjob_failover_entries_queued",
            "Failover entries waiting for an owner",
            [float(job.failover_queued) for job in state.jobs],
        )
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
