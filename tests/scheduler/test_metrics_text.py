"""``scheduler.metrics_text.exposition`` writes what ``prometheus_client.generate_latest``
writes, byte for byte: for a running scheduler's registry, for label values that need
escaping, and (by handing over) for the families it does not write itself."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, Summary, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from scheduler import JobConfig, Scheduler, ShardingContext, metrics_text
from scheduler.metrics_text import exposition
from scheduler.observe import enable_metrics
from tests.waiting import wait_for


class _Families:
    """A collector yielding fixed families (what the scheduler's own collectors do)."""

    def __init__(self, *families: Any) -> None:
        self._families = families

    def collect(self) -> Iterator[Any]:
        yield from self._families


def _failing(ctx: ShardingContext) -> None:
    if ctx.sharding_item == 1:
        raise RuntimeError("item 1 fails")


def test_a_schedulers_metrics_are_written_as_generate_latest_writes_them() -> None:
    sched = Scheduler("memory://")
    for n in range(3):
        sched.add_job(JobConfig(name=f"job-{n}", cron="* * * * * ?", sharding_total_count=2), _failing)
    metrics = enable_metrics(sched)
    sched.start()
    try:
        wait_for(
            lambda: (metrics.registry.get_sample_value("shardjob_fire_lateness_seconds_count", {"instance": sched.instance_id}) or 0)
            >= 6,
            15,
            message="two fires of each job",
        )
    finally:
        sched.shutdown(wait=True)  # nothing changes between the two writes below
    ours = exposition(metrics.registry)
    assert ours == generate_latest(metrics.registry)
    assert metrics_text._write(metrics.registry) == ours  # written here, not handed over
    text = ours.decode()
    assert 'shardjob_item_runs_total{' in text and 'outcome="failure"' in text, text[:2000]


def test_label_values_are_escaped_and_numbers_written_as_go_does() -> None:
    registry = CollectorRegistry()
    gauge = GaugeMetricFamily("odd_values", "doc with \\ and\nnewline", labels=["b", "a"])
    gauge.add_metric(['back\\slash "quoted"\nnewline', "ünïcode"], 1e22)
    gauge.add_metric(["plain", "x"], float("nan"))
    gauge.add_metric(["inf", "y"], float("inf"))
    gauge.add_metric(["small", "z"], 1.5e-7)
    counter = CounterMetricFamily("things", "things counted", labels=["job"])
    counter.add_metric(["j"], 1234567.0)
    histogram = HistogramMetricFamily("waits_seconds", "waits", labels=["job"])
    histogram.add_metric(["j"], [("0.1", 1.0), ("1.0", 3.0), ("+Inf", 4.0)], sum_value=2.5)
    unlabelled = GaugeMetricFamily("alone", "no labels")
    unlabelled.add_metric([], -3.0)
    registry.register(_Families(gauge, counter, histogram, unlabelled))
    assert exposition(registry) == generate_latest(registry)


@pytest.mark.parametrize("kind", ["info", "created", "summary"])
def test_families_it_does_not_write_itself_go_to_generate_latest(kind: str) -> None:
    registry = CollectorRegistry()
    if kind == "info":
        Info("build", "build facts", registry=registry).info({"version": "1"})
    elif kind == "created":  # prometheus_client's own Counter adds a _created sample
        Counter("requests", "requests", ["path"], registry=registry).labels("/").inc()
    else:
        Summary("latency_seconds", "latency", registry=registry).observe(0.2)
        Histogram("sizes", "sizes", registry=registry).observe(3)
        Gauge("temperature", "temperature", registry=registry).set(21.5)
    assert exposition(registry) == generate_latest(registry)
