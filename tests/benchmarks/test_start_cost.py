"""``benchmarks.start_cost`` runs against real servers and separates a start-up from the
fires that compete with it. No timing is asserted (speed targets are benchmarks)."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import start_cost
from scheduler.cron import CronSchedule
from tests.servers.etcd import EtcdServer
from tests.servers.external import ExternalServer
from tests.servers.zookeeper import ZooKeeperServer


def test_the_quiet_cron_fires_no_sooner_than_22_hours_from_now() -> None:
    now = datetime.datetime.now()
    expression = start_cost.quiet_cron(now)
    gap = CronSchedule.parse(expression).next_fire(time.time())
    assert gap is not None
    # 23 hours away, give or take a daylight-saving shift of one hour
    assert 22 * 3600 <= gap - time.time() <= 24 * 3600, expression


def test_a_child_reports_its_own_peak_not_its_large_parents() -> None:
    ballast = b"x" * (400 * 2**20)  # written, so resident: this process is past 400 MiB
    probe = (
        "import resource; from benchmarks.start_cost import peak_rss_mib; "
        "print(peak_rss_mib(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    own, inherited = (float(v) for v in out.stdout.split())
    assert len(ballast) and inherited >= 400  # the hazard: ru_maxrss carries the parent's peak
    assert 0 < own < 200, out.stdout  # a fresh interpreter, not the parent


@pytest.mark.slow
def test_each_registry_and_cron_gets_its_own_start_with_server_counts(
    tmp_path: Path,
    zk_server: ZooKeeperServer | ExternalServer,
    etcd_server: EtcdServer | ExternalServer,
) -> None:
    payload = start_cost.main(
        ["--quick", "--jobs", "20", "--out", str(tmp_path), "--zk", zk_server.address, "--etcd", etcd_server.address]
    )
    written = json.loads((tmp_path / "start_cost.json").read_text())
    assert written["benchmark"] == "start_cost" and written["results"] == payload["results"]
    rows = {(r["backend"], r["crons"]): r for r in payload["results"]}
    assert set(rows) == {(b, c) for b in ("memory", "zookeeper", "etcd") for c in ("quiet", "every-second")}
    for (backend, cron), row in rows.items():
        assert row["jobs"] == 20 and row["failed_jobs"] == 0
        assert row["start_s"] > 0 and row["cpu_s"] > 0
        if cron == "quiet":
            assert row["fires_during_start"] == 0, row  # the start-up's own cost only
        if backend == "memory":
            assert row["server_requests"] is None and row["cpu_x_memory"] == 1.0
        else:
            assert row["server_requests"] > 0, row
            assert row["requests_per_job"] == round(row["server_requests"] / 20, 1)
            # a request per job at least, whatever is batched: each job's campaign reads
            # back the term it won (the tree watch's reads go in multiReads, and a lone
            # one in a single request, so they no longer add one request per node)
            assert row["server_requests"] >= 20, row
