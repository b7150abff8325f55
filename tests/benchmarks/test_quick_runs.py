"""Smoke test of ``benchmarks/``: each benchmark runs in ``--quick`` mode against the test
session's servers and writes its JSON with the expected keys.

No timing is asserted here (DESIGN.md 6: speed targets are benchmarks, never timed
assertions); this only proves the benchmarks still run against the current code. Without
APScheduler installed the lateness benchmark runs its shardjob half and says so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import election_failover, registry_latency, run_all, scheduler_lateness
from tests.servers.etcd import EtcdServer
from tests.servers.external import ExternalServer
from tests.servers.zookeeper import ZooKeeperServer

pytestmark = pytest.mark.slow


def _servers(zk: ZooKeeperServer | ExternalServer, etcd: EtcdServer | ExternalServer) -> list[str]:
    return ["--zk", zk.address, "--etcd", etcd.address]


def _load(out: Path, name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((out / f"{name}.json").read_text())
    assert document["benchmark"] == name
    assert document["quick"] is True
    assert {"cpus", "python"} <= set(document["machine"])
    return document


def test_run_all_lists_every_benchmark() -> None:
    assert set(run_all.BENCHMARKS) == {"registry_latency", "election_failover", "scheduler_lateness"}


def test_registry_latency_quick(
    tmp_path: Path, zk_server: ZooKeeperServer | ExternalServer, etcd_server: EtcdServer | ExternalServer
) -> None:
    registry_latency.main(["--quick", "--out", str(tmp_path), *_servers(zk_server, etcd_server)])
    document = _load(tmp_path, "registry_latency")
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


def test_election_failover_quick(
    tmp_path: Path, zk_server: ZooKeeperServer | ExternalServer, etcd_server: EtcdServer | ExternalServer
) -> None:
    election_failover.main(["--quick", "--out", str(tmp_path), *_servers(zk_server, etcd_server)])
    document = _load(tmp_path, "election_failover")
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


def test_scheduler_lateness_quick(tmp_path: Path) -> None:
    scheduler_lateness.main(["--quick", "--out", str(tmp_path)])
    document = _load(tmp_path, "scheduler_lateness")
    expected = {"shardjob", "apscheduler"} if scheduler_lateness.apscheduler_available() else {"shardjob"}
    assert (document["anchor_skipped"] is None) == ("apscheduler" in expected)
    assert list(document["results"]) == [str(n) for n in document["job_counts"]]
    for per_count in document["results"].values():
        assert set(per_count) == expected
        for figures in per_count.values():
            assert figures["completed"] is True
            assert figures["fires"] > 0
            assert {"p50", "p99", "max"} <= set(figures["lateness_ms"])
            assert {"expected_fires", "threads", "rss_mib", "cpu_s"} <= set(figures)
