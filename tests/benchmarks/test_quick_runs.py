"""Smoke test of ``benchmarks/``: ``run_all --quick`` runs every benchmark once against
the test session's servers; each writes its JSON with the expected keys, and the report
renders every section and chart from them, marked as quick.

No timing is asserted here (speed targets are benchmarks, never timed assertions); this only
proves the benchmarks and the report still run against the current code.

The quick run is split into ``LANES`` that run at the same time, each a ``run_all --quick
--only`` of its own, the first on the test session's servers and each other on servers it
starts; the report is then written once from every lane's results. This is sound only
because quick figures are smoke: nothing here asserts a time, and a quick report never
leaves its folder. Most quick benchmarks wait on every-second fires, cuts and session
timeouts rather than on the CPU, so the lanes take about as long as the longest one
instead of the sum. Hazard: a count read at the server (ZooKeeper ``mntr``, etcd
``/metrics``) sees every client of that server, so no two lanes share one.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import registry
from benchmarks import (
    observability_overhead,
    placement,
    registry_cost,
    registry_latency,
    restart_recovery,
    run_all,
    scheduler_lateness,
)
from benchmarks.common import REPO_ROOT
from benchmarks.report import BENCHMARK_NAMES, write_report
from scheduler.gc_tuning import WORKER_GC_THRESHOLD
from tests.servers.etcd import EtcdServer
from tests.servers.external import ExternalServer
from tests.servers.zookeeper import ZooKeeperServer

pytestmark = pytest.mark.slow


#: every benchmark in one lane; lanes of about equal length (seconds of a quick run on 2
#: cores, lanes side by side): the run's CPU is about one core of the two, so a lane more
#: shortens the longest one instead of slowing every lane
LANES = (
    # ~55 s, on the session's servers
    ("registry_latency", "registry_cost", "cluster_ops", "console_scale", "start_cost"),
    # ~45 s
    ("election_failover", "resharding_scale"),
    # ~45 s and ~40 s: a dropped connection, a restart, each watched after the fact
    ("reconnect_recovery",),
    ("restart_recovery",),
    # ~50 s and ~40 s: the ones that load the CPU (many schedulers, the history databases)
    ("fleet_requests", "scheduler_lateness"),
    ("observability_overhead",),
)


@pytest.fixture(scope="module")
def quick_run(
    tmp_path_factory: pytest.TempPathFactory,
    zk_server: ZooKeeperServer | ExternalServer,
    etcd_server: EtcdServer | ExternalServer,
) -> Iterator[Path]:
    """``run_all --quick`` of every lane at once, for the whole module: the folder holding
    every lane's results and the report written from all of them."""
    out = tmp_path_factory.mktemp("bench-quick")
    lane_dirs = [out / f"lane-{n}" for n in range(len(LANES))]
    others = []
    for lane, lane_dir in zip(LANES[1:], lane_dirs[1:], strict=True):
        lane_dir.mkdir()
        with (lane_dir / "run_all.log").open("wb") as log:
            argv = ["--quick", "--out", str(lane_dir), "--only", ",".join(lane)]
            command = [sys.executable, "-m", "benchmarks.run_all", *argv]
            others.append(subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT))
    try:
        servers = ["--zk", zk_server.address, "--etcd", etcd_server.address]
        run_all.main(["--quick", "--out", str(lane_dirs[0]), "--only", ",".join(LANES[0]), *servers])
    finally:
        codes = [_ended(child) for child in others]
    for code, lane_dir in zip(codes, lane_dirs[1:], strict=True):
        printed = (lane_dir / "run_all.log").read_text(errors="replace")
        assert code == 0, f"run_all --quick of {lane_dir.name} exited {code}:\n{printed[-4000:]}"
    for lane_dir in lane_dirs:
        for result in lane_dir.glob("*.json"):
            shutil.copy(result, out / result.name)
    write_report(out, out / "BENCHMARKS.md")
    yield out


def _ended(child: subprocess.Popen[bytes]) -> int:
    """The lane's exit status; a lane still running after 240 s more (about four times the
    longest lane) is killed, never left running past the module."""
    try:
        return child.wait(timeout=240)
    except subprocess.TimeoutExpired:
        child.kill()
        return child.wait()


def test_every_benchmark_runs_in_exactly_one_lane() -> None:
    in_lanes = [name for lane in LANES for name in lane]
    assert sorted(in_lanes) == sorted(run_all.BENCHMARKS)


def _load(out: Path, name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((out / f"{name}.json").read_text())
    assert document["benchmark"] == name
    assert document["quick"] is True
    assert {"cpus", "python"} <= set(document["machine"])
    return document


def test_run_all_and_the_report_list_every_benchmark() -> None:
    expected = {
        "registry_latency",
        "registry_cost",
        "election_failover",
        "resharding_scale",
        "scheduler_lateness",
        "start_cost",
        "fleet_requests",
        "reconnect_recovery",
        "restart_recovery",
        "cluster_ops",
        "console_scale",
        "observability_overhead",
    }
    assert set(run_all.BENCHMARKS) == set(BENCHMARK_NAMES) == expected


def test_console_scale_quick(quick_run: Path) -> None:
    document = _load(quick_run, "console_scale")
    assert document["jobs"] == 100
    assert {r["backend"] for r in document["results"]} == {"memory", "zookeeper", "etcd"}
    for result in document["results"]:
        assert {"GET /", "GET /api/jobs", "GET / after one change", "anchor: Cluster.jobs()"} <= set(result["rows"])
        assert all(row["median_ms"] > 0 for row in result["rows"].values()), result


def test_registry_latency_quick(quick_run: Path) -> None:
    document = _load(quick_run, "registry_latency")
    ops = document["ops"]
    assert set(document["results"]) == {"memory", "zookeeper", "etcd"}
    for backend, per_op in document["results"].items():
        assert set(per_op) == set(registry_latency.OPS)
        for figures in per_op.values():
            assert figures["shardjob_ms"]["n"] == ops
            assert {"p50", "p90"} <= set(figures["shardjob_ms"])
            if backend == "memory":
                assert figures["raw_ms"] is None
            else:
                assert figures["raw_ms"]["n"] == ops
                assert figures["raw_client"]
                assert figures["ratio_p50"] is not None


def test_election_failover_quick(quick_run: Path) -> None:
    document = _load(quick_run, "election_failover")
    runs = document["runs"]
    assert set(document["results"]) == {"zookeeper", "etcd"}
    for figures in document["results"].values():
        for key in (
            "shardjob_kill_leader",
            "shardjob_kill_ready",
            "shardjob_stop_leader",
            "shardjob_stop_ready",
            "anchor",
        ):
            assert len(figures[key]["runs_s"]) == runs, key
            assert {"median_s", "max_s", "median_ratio", "max_ratio"} <= set(figures[key])
        assert figures["anchor_name"]
    # tooz's election is the third anchor, on ZooKeeper
    assert len(document["results"]["zookeeper"]["anchor_tooz"]["runs_s"]) == runs


def test_scheduler_lateness_quick(quick_run: Path) -> None:
    document = _load(quick_run, "scheduler_lateness")
    expected = {"shardjob", "apscheduler"} if scheduler_lateness.apscheduler_available() else {"shardjob"}
    assert (document["anchor_skipped"] is None) == ("apscheduler" in expected)
    assert document["placement"] == placement.APART  # the default
    assert document["measured_cpus"] == placement.measured_cpus(placement.APART)
    assert list(document["results"]) == [str(n) for n in document["job_counts"]]
    for per_count in document["results"].values():
        assert set(per_count) == expected
        for figures in per_count.values():
            assert figures["completed"] is True
            assert figures["fires"] > 0
            assert {"p50", "p99", "max"} <= set(figures["lateness_ms"])
            assert {"expected_fires", "threads", "rss_mib", "cpu_s", "cpu_us_per_fire"} <= set(figures)
            assert len(figures["rounds"]) == document["rounds"]
            assert sum(r["fires"] for r in figures["rounds"]) == figures["fires"]
            assert 0 < len(figures["lateness_sample_ms"]) <= 2000
            # each child ran where the placement put it, APScheduler's too
            for run in figures["rounds"]:
                # the forced collection's aftermath falls in the warm-up, not the window
                assert run["settled_s"] >= document["warmup_s"]
                assert sum(run["fires_by_second"]) == run["fires"]
                if document["measured_cpus"]:
                    assert run["cpus"] == document["measured_cpus"]
                else:
                    assert len(run["cpus"]) == document["machine_cpus"]


def test_registry_cost_quick(quick_run: Path) -> None:
    document = _load(quick_run, "registry_cost")
    backends = {r["backend"] for r in document["results"]}
    assert backends == {"memory", "zookeeper", "etcd"}
    for figures in document["results"]:
        ran = [p for p in figures["per_instance"] if p["fires"]]
        assert len(ran) == min(figures["items"], registry_cost.INSTANCES)
        assert figures["round_trips_per_fire"] > 0
        assert figures["elasticjob"] == registry_cost.elasticjob_round_trips(figures["items_per_instance"])


def test_registry_cost_counts_requests_at_the_server(quick_run: Path) -> None:
    document = _load(quick_run, "registry_cost")
    for figures in document["results"]:
        counted = figures["server_requests_per_fire"]
        if figures["backend"] == "memory":
            assert counted is None  # no server to ask
        else:
            assert counted >= 1  # at least the fire's own writes reached the server


def test_start_cost_quick_runs_with_the_threshold_run_all_passes(
    quick_run: Path,
    zk_server: ZooKeeperServer | ExternalServer,
    etcd_server: EtcdServer | ExternalServer,
) -> None:
    document = _load(quick_run, "start_cost")
    assert document["gc_threshold"] == WORKER_GC_THRESHOLD  # run_all's default, passed through
    _assert_pinned_apart(document)
    assert {(r["backend"], r["crons"]) for r in document["results"]} == {
        (b, c) for b in ("memory", "zookeeper", "etcd") for c in ("quiet", "every-second")
    }
    # it ran on the session's servers (the first lane), and deleted each child's jobs there
    for server in (f"zk://{zk_server.address}", f"etcd://{etcd_server.address}"):
        with registry.connect(server) as root:
            left = [name for name in root.children("/") if re.fullmatch(r"sc\d+", name)]
        assert left == [], (server, left)


def test_fleet_requests_quick(quick_run: Path) -> None:
    document = _load(quick_run, "fleet_requests")
    assert {r["backend"] for r in document["results"]} == {"zookeeper", "etcd"}
    for figures in document["results"]:
        assert figures["fires_run"] == figures["job_fires_due"] > 0  # the fleet ran every job each second
        assert figures["server_requests_per_s"] > 0 and figures["requests_per_job_fire"] > 0


def _assert_pinned_apart(document: dict[str, Any]) -> None:
    """A benchmark's children ran where the default placement puts them."""
    assert document["placement"] == placement.APART
    assert document["measured_cpus"] == placement.measured_cpus(placement.APART)
    for figures in document["results"]:
        if document["measured_cpus"]:
            assert figures["cpus"] == document["measured_cpus"]
        else:  # one CPU: nothing pinned
            assert len(figures["cpus"]) == document["machine_cpus"]


def test_reconnect_recovery_quick(quick_run: Path) -> None:
    document = _load(quick_run, "reconnect_recovery")
    assert {r["backend"] for r in document["results"]} == {"zookeeper", "etcd"}
    _assert_pinned_apart(document)
    for figures in document["results"]:
        assert figures["steady_fires_per_s"] == document["jobs"]  # every job each second before the cut
        assert len(figures["fires_per_second_after"]) == 5
        assert figures["fires_due_after"] == 5 * document["jobs"]
        assert figures["server_requests_per_s_steady"] > 0


def test_restart_recovery_quick(quick_run: Path) -> None:
    document = _load(quick_run, "restart_recovery")
    assert {r["backend"] for r in document["results"]} == {"zookeeper", "etcd"}
    _assert_pinned_apart(document)  # the restarted child's CPUs
    for figures in document["results"]:
        assert figures["ended"] == "left"
        assert figures["steady_fires_per_s"] == document["jobs"]  # every job each second before the restart
        window = int(restart_recovery.QUICK_WINDOW_S)
        assert figures["after_s"] == window
        assert len(figures["fires_per_second_after"]) == window
        assert figures["fires_due_after"] == window * document["jobs"]
        assert figures["fires_run_after"] > 0  # the new process fired within the window
        assert figures["start_s"] > 0 and figures["server_requests_per_s_after"] > 0


def test_cluster_ops_quick(quick_run: Path) -> None:
    document = _load(quick_run, "cluster_ops")
    assert [r["backend"] for r in document["results"]] == ["memory", "zookeeper", "etcd"]
    for figures in document["results"]:
        rows = {row["operation"]: row for row in figures["rows"]}
        for read in ("jobs", "status JOB", "servers", "config get JOB", "dump JOB"):
            assert rows[read]["calls_per_call"] == 1  # one read_tree, whatever the job's size
        # the anchor reads the same nodes one call at a time: it must cost more calls
        assert rows["anchor: one job node by node"]["calls_per_call"] > 10
        if figures["backend"] == "etcd":
            # one range request; the schedulers' own keep-alives are subtracted only on average
            assert 0.5 <= rows["status JOB"]["server_requests_per_call"] <= 2


def test_observability_overhead_quick(quick_run: Path) -> None:
    document = _load(quick_run, "observability_overhead")
    variants = {r["variant"]: r for r in document["results"]}
    assert set(variants) == {label for label, *_ in observability_overhead.VARIANTS}
    assert variants["bare"]["p99_ratio"] == 1.0  # the anchor, measured in the same run
    for figures in variants.values():
        assert figures["fires"] > 0
        if figures["history"]:
            # the database is up throughout: every row written, none dropped or left behind
            assert figures["history_written"] > 0
            assert figures["history_dropped"] == figures["history_buffered"] == 0
    parts = document["parts"]
    assert set(parts["producers"]) == {"none", "metrics", "history", "metrics + history"}
    assert parts["producers"]["metrics + history"] > parts["producers"]["none"] > 0
    assert parts["rows_per_fire"] == 3.0  # an item run: its execution, RUNNING and FINISHED
    assert "SQLite" in parts["drain"]
    for database, drain in parts["drain"].items():
        assert set(drain) == {"first_30s", "last_30s"} and all(us > 0 for us in drain.values()), database
        assert all(ratio > 1.0 for ratio in parts["floor_ratio"][database].values()), database


def test_elasticjob_count_is_derived_per_item() -> None:
    # 2 writes per item (running node created and deleted), 3 checks per item, 2 reads
    assert registry_cost.elasticjob_round_trips(1) == {"writes": 2, "reads": 5, "total": 7}
    assert registry_cost.elasticjob_round_trips(3334) == {"writes": 6668, "reads": 10004, "total": 16672}


def test_resharding_scale_quick(quick_run: Path) -> None:
    document = _load(quick_run, "resharding_scale")
    assert set(document["results"]) == {"zookeeper", "etcd"}
    for backend, figures in document["results"].items():
        assert figures["completed"], f"{backend}: {figures.get('error')}\n{figures.get('diagnosis')}"
        for change in (*figures["joins"], *figures["leaves"]):
            # every instance ran the new epoch, after it was written
            assert change["epoch"] > 0
            assert change["all_running_s"] >= 0 and change["written_s"] >= 0


def test_the_report_renders_every_section_from_quick_results(quick_run: Path) -> None:
    report = (quick_run / "BENCHMARKS.md").read_text()
    for heading in (
        "### Failover",
        "### Registry cost per fire",
        "### Resharding at scale",
        "### Fire lateness and footprint",
        "### Start-up apart from the fires",
        "### A fleet's requests at the server",
        "### Operator calls on a live cluster",
        "### Web console at",
        "### Observability overhead",
        "### Registry call latency",
    ):
        assert heading in report
    assert report.count("come from a `--quick` run") == len(BENCHMARK_NAMES)
    charts = sorted(p.name for p in (quick_run / "docs" / "benchmarks").glob("*.png"))
    assert charts == sorted(
        ["failover.png", "lateness.png", "registry_cost.png", "registry_latency.png", "resharding.png"]
    )
    for link in ("docs/benchmarks/failover.png", "docs/benchmarks/resharding.png"):
        assert f"({link})" in report
    # quick figures never reach the summary table
    summary = report.split("## Summary", 1)[1].split("## Details", 1)[0]
    assert summary.count("\n|") == 2  # its header and separator rows only
