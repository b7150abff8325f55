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
from scheduler.metrics_text import SeriesFamily, exposition
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


def test_series_families_are_written_as_their_samples_and_keep_labels_across_scrapes() -> None:
    """A ``SeriesFamily`` writes its lines itself, from label texts it keeps between
    scrapes: each scrape still equals ``generate_latest`` of the same samples, with
    escaping, large, negative and non-finite values, and a label set added later."""
    rendered: dict[tuple[str, ...], str] = {}
    series: list[tuple[tuple[str, ...], float]] = [
        (("a", 'quote " and \\ back\nslash'), 3.0),
        (("b", "x"), 1234567.0),
        (("c", "y"), -2.5),
        (("d", "z"), float("inf")),
        (("e", "w"), float("nan")),
    ]

    class Collector:
        def collect(self) -> Iterator[Any]:
            yield SeriesFamily("things", "things counted", "counter", ["job", "instance"], list(series), rendered)
            yield SeriesFamily("level", "a level", "gauge", ["job", "instance"], list(series), rendered)

    registry = CollectorRegistry()
    registry.register(Collector())
    first = metrics_text._write(registry)
    assert first == generate_latest(registry)
    assert b'things_total{instance="quote \\" and \\\\ back\\nslash",job="a"} 3.0' in first
    assert len(rendered) == 5  # one text per label set, shared by both families
    series[0] = (("a", 'quote " and \\ back\nslash'), 4.0)
    series.append((("f", "v"), 0.0))
    second = metrics_text._write(registry)
    assert second == generate_latest(registry) != first
    assert registry.get_sample_value("things_total", {"job": "f", "instance": "v"}) == 0.0
    assert len(rendered) == 6


def test_a_series_family_is_a_counter_or_a_gauge() -> None:
    with pytest.raises(ValueError, match="counter or a gauge, not 'histogram'"):
        SeriesFamily("h", "h", "histogram", ["job"], [], {})
