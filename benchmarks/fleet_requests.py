"""A fleet's load on its registry: 3 processes x 300 every-second jobs (1 item each) on
ZooKeeper and on etcd, and the requests the server itself counts per second
(``benchmarks.server_counters``) against one request per job-fire — what a scheduler that
wrote one node per fire would cost at the least (ElasticJob writes several).

Each process is one ``Scheduler`` running the same 300 jobs; every job's item runs on one
of the three, and all three fire every job every second. After every process has started
and a warm-up, the server's counter is read over the window; every process also reports
the fires it ran in the window, so the figure is per job-fire actually run.

Usage: ``.venv/bin/python -m benchmarks.fleet_requests [--quick] [--processes 3] [--jobs 300]``
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.charts import Charts
from benchmarks.common import (
    ask,
    base_parser,
    print_table,
    run_script,
    servers,
    spawn_ready,
    stop_child,
    write_results,
)
from benchmarks.server_counters import read_count

__all__ = ["NAME", "main", "render", "summary"]

NAME = "fleet_requests"
#: the target: server requests per second at most this share of the job-fires per second
TARGET_SHARE = 0.1


def _child(argv: list[str]) -> int:
    """One process of the fleet: start, say ``ready``, and on a line ``window A B`` on
    stdin answer with the fires run with fire times in [A, B); leave at EOF."""
    parser = argparse.ArgumentParser(prog="fleet_requests _child")
    parser.add_argument("--registry", required=True)
    parser.add_argument("--jobs", type=int, required=True)
    args = parser.parse_args(argv)
    from scheduler import JobConfig, Scheduler, ShardingContext

    lock = threading.Lock()
    fires: list[float] = []

    def job(ctx: ShardingContext) -> None:
        with lock:
            fires.append(ctx.fire_time)

    sched = Scheduler(args.registry)
    for n in range(args.jobs):
        sched.add_job(JobConfig(name=f"job-{n:04d}", cron="* * * * * ?"), job)
    sched.start()
    print("ready", flush=True)
    for line in sys.stdin:
        _, start, end = line.split()
        with lock:
            counted = sum(float(start) <= f < float(end) for f in fires)
        print(f"fired {counted}", flush=True)
    sched.shutdown(wait=True)
    return 0


def _measure(backend: str, address: str, processes: int, jobs: int, warmup: float, window: float) -> dict[str, Any]:
    scheme = "zk" if backend == "zookeeper" else "etcd"
    url = f"{scheme}://{address}/bench-fleet-{time.time_ns()}"
    argv = [sys.executable, "-m", "benchmarks.fleet_requests", "_child", "--registry", url, "--jobs", str(jobs)]
    with tempfile.TemporaryDirectory(prefix="shardjob-bench-fleet-") as tmp:
        children = []
        try:
            for n in range(processes):
                children.append(spawn_ready(argv, Path(tmp) / f"child-{n}.log", timeout=120))
            # settled: in the last whole second the fleet ran (nearly) every job once
            deadline = time.monotonic() + 120
            while True:
                second = float(int(time.time()) - 1)
                if _fired(children, second, second + 1) >= 0.99 * jobs:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{backend}: the fleet never ran every job in one second within 120 s")
                time.sleep(0.5)
            time.sleep(warmup)  # a span of steady running before the window
            start = float(int(time.time()) + 1)
            time.sleep(max(0.0, start - time.time()))
            before = read_count(backend, address)
            time.sleep(window)
            counted = read_count(backend, address) - before
            end = start + window
            time.sleep(2.0)  # the window's last fires finish running
            fired = _fired(children, start, end)
        finally:
            for child in children:
                stop_child(child)
    job_fires = jobs * window
    return {
        "backend": backend,
        "processes": processes,
        "jobs": jobs,
        "window_s": window,
        "fires_run": fired,
        "job_fires_due": int(job_fires),
        "server_requests_per_s": round(counted.requests / window, 1),
        "server_kv_requests_per_s": None if counted.kv is None else round(counted.kv / window, 1),
        "job_fires_per_s": round(fired / window, 1),
        "requests_per_job_fire": round(counted.requests / fired, 4) if fired else None,
    }


def _fired(children: list[subprocess.Popen[bytes]], start: float, end: float) -> int:
    """Fires with fire times in [start, end) that the fleet's processes ran, together."""
    return sum(int(ask(child, f"window {start} {end}").split()[1]) for child in children)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0] if __doc__ else NAME)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=None, help="jobs per process (default 300, quick 50)")
    parser.add_argument("--window", type=float, default=None, help="s counted (default 20, quick 4)")
    args = parser.parse_args(argv)
    args.jobs = args.jobs or (50 if args.quick else 300)
    args.window = args.window or (4.0 if args.quick else 20.0)
    args.warmup = 1.0 if args.quick else 5.0
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    if argv and argv[0] == "_child":
        raise SystemExit(_child(argv[1:]))
    args = parse_args(list(argv or []))
    results = []
    with servers(args) as live:
        for backend, address in (("zookeeper", live.zookeeper), ("etcd", live.etcd)):
            if address:
                results.append(_measure(backend, address, args.processes, args.jobs, args.warmup, args.window))
    print_table(
        f"A fleet's requests at the server, {args.processes} processes x {args.jobs} every-second jobs",
        ["backend", "fires run / due", "job-fires/s", "server req/s", "KV req/s", "req per job-fire"],
        [
            [
                r["backend"],
                f"{r['fires_run']}/{r['job_fires_due']}",
                r["job_fires_per_s"],
                r["server_requests_per_s"],
                r["server_kv_requests_per_s"],
                r["requests_per_job_fire"],
            ]
            for r in results
        ],
    )
    payload = {"processes": args.processes, "jobs": args.jobs, "window_s": args.window, "results": results}
    write_results(NAME, args, payload)
    return payload


# -- BENCHMARKS.md ----------------------------------------------------------------------------
def render(document: dict[str, Any], charts: Charts) -> str:
    rows = [
        f"| {r['backend']} | {r['fires_run']:,} / {r['job_fires_due']:,} | {r['job_fires_per_s']} | "
        f"{r['server_requests_per_s']} | {r['server_kv_requests_per_s']} | {r['requests_per_job_fire']} |"
        for r in document["results"]
    ]
    return "\n".join(
        [
            "### A fleet's requests at the server",
            "",
            f"{document['processes']} processes, each a `Scheduler` running the same {document['jobs']} "
            f"every-second jobs (one item each), {document['window_s']:g} s counted after a warm-up. *server "
            "req/s* is every request the server counted (ZooKeeper `mntr` `zk_packets_received`, etcd "
            "`grpc_server_msg_received_total`), pings and lease keep-alives included; *KV* is etcd's key-value "
            "service alone. A scheduler writing one node per job-fire would cost at least one request each.",
            "",
            "| backend | fires run / due | job-fires/s | server req/s | KV req/s | requests per job-fire |",
            "|---|---|---|---|---|---|",
            *rows,
        ]
    )


def summary(document: dict[str, Any]) -> list[dict[str, str]]:
    return [
        {
            "figure": f"fleet of {document['processes']} x {document['jobs']} every-second jobs, {r['backend']}",
            "target": f"server requests <= {TARGET_SHARE} per job-fire",
            "result": f"{r['requests_per_job_fire']} requests per job-fire ({r['server_requests_per_s']} req/s)",
            "met": "yes" if r["requests_per_job_fire"] is not None and r["requests_per_job_fire"] <= TARGET_SHARE else "no",
        }
        for r in document["results"]
    ]


if __name__ == "__main__":
    run_script(main)
