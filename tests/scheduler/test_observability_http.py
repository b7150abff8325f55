"""Metrics and health endpoints over real sockets, on every backend: /metrics parsed with
prometheus_client's own parser after a known sequence of fires, /healthz while the timer
ticks, /readyz false while the registry is cut and true after, /dump the cached view."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from registry.counting import CountingRegistry
from registry.errors import NodeExistsError
from scheduler import JobConfig, Scheduler, ShardingContext
from scheduler.http import HttpEndpoint, parse_address
from sharding.failover import FailoverEntry, FailoverQueue
from sharding.layout import JobPaths
from tests.harness import Harness
from tests.waiting import wait_for

EVERY_SECOND = "* * * * * ?"


@pytest.fixture
def cleanup() -> Iterator[list[Scheduler | HttpEndpoint]]:
    made: list[Scheduler | HttpEndpoint] = []
    yield made
    for thing in reversed(made):
        if isinstance(thing, HttpEndpoint):
            thing.close()
        else:
            thing.shutdown(wait=True)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def samples(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, text = get(base + "/metrics")
    assert status == 200
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def value(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in found.items() if n == name and all((k, lv) in ls for k, lv in labels.items()))


def test_metrics_after_a_known_sequence_of_fires(harness: Harness, cleanup: list[Scheduler | HttpEndpoint]) -> None:
    counting = CountingRegistry(harness.connect(harness.fresh_namespace()))
    sched = Scheduler(counting, max_workers=2)
    cleanup.append(sched)
    lock = threading.Lock()
    outcomes = {"success": 0, "failure": 0}
    def job(ctx: ShardingContext) -> None:
        with lock:
            outcomes["success" if ctx.sharding_item == 0 else "failure"] += 1
        if ctx.sharding_item == 1:
            raise ValueError("item 1 fails")

    sched.add_job(JobConfig(name="m", cron=EVERY_SECOND, sharding_total_count=2), job)
    endpoint = sched.serve_http("127.0.0.1:0")
    cleanup.append(endpoint)
    sched.start()
    wait_for(lambda: outcomes["success"] >= 3, 20, message="three fires ran")
    runner = sched.runner("m")
    runner.stop_firing()
    assert runner.wait_idle(10)
    with lock:
        expected = dict(outcomes)
    found = samples(endpoint.url)
    instance = sched.instance_id
    assert value(found, "shardjob_item_runs_total", job="m", outcome="success", instance=instance) == expected["success"]
    assert value(found, "shardjob_item_runs_total", job="m", outcome="failure") == expected["failure"]
    runs = value(found, "shardjob_runs_total", job="m", source="NORMAL")
    assert runs == expected["success"]  # one run per fire, both items in it
    assert value(found, "shardjob_fires_due_total", job="m", source="NORMAL") >= runs
    # histograms are per instance (this one runs only "m")
    assert value(found, "shardjob_item_duration_seconds_count", instance=instance) == (
        expected["success"] + expected["failure"]
    )
    assert value(found, "shardjob_fire_lateness_seconds_count", instance=instance) == runs
    assert value(found, "shardjob_session_connected", instance=instance) == 1
    assert value(found, "shardjob_leader", job="m") == 1
    assert value(found, "shardjob_job_registered", job="m") == 1
    assert value(found, "shardjob_history_rows_dropped_total") == 0
    assert value(found, "shardjob_history_rows_rejected_total") == 0
    epoch = value(found, "shardjob_assignment_epoch", job="m")
    assert epoch >= 1
    # the only instance leads: it wrote every assignment there is
    assert value(found, "shardjob_reshardings_total", job="m") == epoch
    assert value(found, "shardjob_resharding_duration_seconds_count", instance=instance) == epoch
    assert value(found, "shardjob_registry_calls_total", instance=instance) == pytest.approx(
        counting.round_trips, abs=5
    )  # the background (leader checks, a reconcile) may make a call between the two reads
    assert value(found, "shardjob_registry_calls_total", operation="transaction") >= runs  # a fenced mark per run
    # errors by operation and error class: one refused create, counted as the caller saw it
    refused = value(found, "shardjob_registry_errors_total", operation="create", error="NodeExistsError")
    with pytest.raises(NodeExistsError):
        counting.create(JobPaths("m").config, b"taken")
    after = samples(endpoint.url)
    assert value(after, "shardjob_registry_errors_total", operation="create", error="NodeExistsError") == refused + 1
    assert value(after, "shardjob_registry_calls_total", operation="create") >= 1
    # label values stay bounded: no fire times, no messages
    for name, labels in found:
        if name.startswith("shardjob_"):
            assert {k for k, _ in labels} <= {"job", "instance", "source", "outcome", "what", "reason", "operation", "error", "le"}, name


def test_two_schedulers_in_one_process_keep_separate_metrics(
    harness: Harness, cleanup: list[Scheduler | HttpEndpoint]
) -> None:
    namespace = harness.fresh_namespace()
    endpoints = []
    for name in ("a", "b"):
        sched = Scheduler(harness.url(namespace), max_workers=2)
        cleanup.append(sched)
        sched.add_job(JobConfig(name=name, cron=EVERY_SECOND), lambda ctx: None)
        endpoints.append(sched.serve_http("127.0.0.1:0"))
        cleanup.append(endpoints[-1])
        sched.start()
    wait_for(
        lambda: all(value(samples(e.url), "shardjob_item_runs_total") >= 1 for e in endpoints), 20, message="both ran"
    )
    a, b = (samples(e.url) for e in endpoints)
    assert value(a, "shardjob_item_runs_total", job="b") == 0
    assert value(b, "shardjob_item_runs_total", job="a") == 0


def test_health_readiness_and_dump(harness: Harness, cleanup: list[Scheduler | HttpEndpoint]) -> None:
    namespace = harness.fresh_namespace()
    link = harness.link()
    # a session that outlives the cut: the instance is disconnected, not gone
    sched = Scheduler(link.url(namespace, session_timeout=max(10.0, harness.min_session_timeout)), max_workers=2)
    cleanup.append(sched)
    sched.add_job(JobConfig(name="h", cron=EVERY_SECOND, sharding_total_count=2), lambda ctx: None)
    endpoint = sched.serve_http("127.0.0.1:0")
    cleanup.append(endpoint)
    base = endpoint.url
    assert get(base + "/readyz")[0] == 503  # not started
    assert get(base + "/healthz")[0] == 503
    sched.start()
    wait_for(lambda: get(base + "/readyz")[0] == 200, 20, message="ready once registered")
    wait_for(lambda: get(base + "/healthz")[0] == 200, 10, message="healthy while the timer ticks")

    status, body = get(base + "/dump")
    assert status == 200
    dump = json.loads(body)
    assert dump["instance_id"] == sched.instance_id and dump["connected"] is True
    (job,) = dump["jobs"]
    assert job["name"] == "h" and job["registered"] and job["leader"]
    assert any(path.endswith("/h/config") for path in job["cached"])
    assert json.loads(job["cached"][next(p for p in job["cached"] if p.endswith("/h/config"))])

    try:
        link.cut()
        wait_for(lambda: get(base + "/readyz")[0] == 503, 30, message="not ready while the registry is cut")
        assert "not connected" in get(base + "/readyz")[1]
        assert get(base + "/healthz")[0] == 200  # alive all the same: no restart wanted
    finally:
        link.restore()
    wait_for(lambda: get(base + "/readyz")[0] == 200, 30, message="ready again after the cut")
    assert get(base + "/nope")[0] == 404
    sched.shutdown(wait=True)
    assert get(base + "/healthz")[0] == 503  # shut down: not alive any more
    assert get(base + "/readyz")[0] == 503


def test_parse_address() -> None:
    assert parse_address("127.0.0.1:9100") == ("127.0.0.1", 9100)
    assert parse_address(":9100") == ("127.0.0.1", 9100)
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_address("localhost")


def test_dump_and_metrics_count_the_failover_queue_entries(
    harness: Harness, cleanup: list[Scheduler | HttpEndpoint]
) -> None:
    """The failover queue is one node holding every entry: both views count the entries."""
    namespace = harness.fresh_namespace()
    sched = Scheduler(harness.url(namespace), instance_id="10.0.0.9@-@q")
    cleanup.append(sched)
    sched.add_job(JobConfig(name="queued", sharding_total_count=1, failover=True), lambda ctx: None)
    sched.start()
    endpoint = sched.serve_http("127.0.0.1:0")
    cleanup.append(endpoint)
    # entries for items this job does not have (total 1): queued, never run here
    queue = FailoverQueue((FailoverEntry(1.0, 5, "gone@-@1"), FailoverEntry(2.0, 6, "gone@-@1")))
    harness.connect(namespace).put(JobPaths("queued").failover_items, queue.encode())

    def dumped() -> int:
        _, body = get(f"{endpoint.url}/dump")
        return int(next(j for j in json.loads(body)["jobs"] if j["name"] == "queued")["failover_queued"])

    wait_for(lambda: dumped() == 2, 10, message=lambda: f"dump shows {dumped()} queued")
    assert value(samples(endpoint.url), "shardjob_failover_entries_queued", job="queued", instance=sched.instance_id) == 2
