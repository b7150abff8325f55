"""What ``Scheduler.start()`` of N jobs costs on each registry, with the start-up measured
apart from the fires that compete with it: the same N jobs once on a cron that does not
fire during the run (``quiet``: the start-up's own cost) and once every second (``every
second``: each job fires from the moment it is registered, as in ``scheduler_lateness``).

Each start runs in a child process of its own: wall time and process CPU of ``start()``,
the server's own request count over it (ZooKeeper's ``mntr``, etcd's ``/metrics``), the
fires run during it and the RSS after it; its namespace is deleted once it ends. The
memory registry, in the same run, is the anchor: the ``x memory`` column compares a start
with memory's start on the same cron. Each child is pinned to every CPU but one (``--placement
apart``, the default; ``benchmarks/placement.py``), as ``scheduler_lateness``'s are: left to
share the servers' core, one start's CPU swung by 30 % between identical runs.

Usage: ``.venv/bin/python -m benchmarks.start_cost [--quick] [--jobs 1000,10000]
[--backends memory,zookeeper,etcd] [--crons quiet,every-second] [--gc-threshold N]
[--placement apart|shared]``
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.charts import Charts
from benchmarks.common import (
    add_gc_threshold,
    base_parser,
    delete_namespace,
    print_table,
    run_child,
    run_script,
    servers,
    status_mib,
    write_results,
)
from benchmarks.placement import add_placement, measured_cpus, pin, placement_fields, placement_sentence

__all__ = ["CRONS", "NAME", "main", "peak_rss_mib", "render", "start_bound", "summary"]

NAME = "start_cost"
BACKENDS = ("memory", "zookeeper", "etcd")
#: label -> whether the jobs fire every second during the start
CRONS = {"quiet": False, "every-second": True}


def peak_rss_mib() -> float | None:
    """This process's peak RSS in MiB (``VmHWM``), which a start reaches at its end; not
    ``ru_maxrss``, which would report a large parent's size (``status_mib``)."""
    return status_mib("VmHWM")


def start_bound(jobs: int) -> float:
    """The target on ``start()`` of ``jobs`` every-second jobs on a real registry, in s
    (issue #14: under 5 s at 1,000 jobs, under 60 s at 10,000)."""
    return 5.0 if jobs <= 1000 else 60.0


def quiet_cron(now: datetime.datetime) -> str:
    """A daily cron whose fire lies an hour behind ``now`` (local time): the next one is
    23 hours away, so none falls in a start however long it takes."""
    hour_ago = now - datetime.timedelta(hours=1)
    return f"0 {hour_ago.minute} {hour_ago.hour} * * ?"


def _child(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="start_cost _child")
    parser.add_argument("--registry", required=True)
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--cron", required=True)
    parser.add_argument("--counter", default="", help="BACKEND=HOST:PORT whose server requests to count")
    parser.add_argument("--gc-threshold", type=int, default=0)
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--cpus", default="", help="comma-separated CPUs to pin this process to (none: not pinned)")
    args = parser.parse_args(argv)
    pin([int(c) for c in args.cpus.split(",") if c])  # before any thread starts: they inherit it
    from benchmarks.server_counters import read_count
    from scheduler import JobConfig, Scheduler, ShardingContext
    from scheduler.gc_tuning import tune_gc

    tune_gc(args.gc_threshold)
    fires = 0
    lock = threading.Lock()

    def job(ctx: ShardingContext) -> None:
        nonlocal fires
        with lock:
            fires += 1

    sched = Scheduler(args.registry)
    for i in range(args.jobs):
        sched.add_job(JobConfig(name=f"job-{i:05d}", cron=args.cron), job)
    counter = args.counter.split("=", 1) if args.counter else None
    requests0 = read_count(counter[0], counter[1]).requests if counter else None
    cpu0, began = time.process_time(), time.monotonic()
    sched.start()
    start_s, cpu_s = time.monotonic() - began, time.process_time() - cpu0
    requests = None if counter is None or requests0 is None else read_count(counter[0], counter[1]).requests - requests0
    with lock:
        fired = fires
    result = {
        "jobs": args.jobs,
        "cron": args.cron,
        "start_s": round(start_s, 2),
        "cpu_s": round(cpu_s, 2),
        "cpu_ms_per_job": round(1000 * cpu_s / args.jobs, 3),
        "server_requests": requests,
        "requests_per_job": None if requests is None else round(requests / args.jobs, 1),
        "fires_during_start": fired,
        "failed_jobs": len(sched.failed_jobs),
        "rss_mib": peak_rss_mib(),
        "cpus": sorted(os.sched_getaffinity(0)),  # what the placement asked for, seen by the child
    }
    args.result.write_text(json.dumps(result))
    sched.shutdown(wait=False)
    return 0


def _run_child(
    url: str, jobs: int, cron: str, counter: str, gc_threshold: int, cpus: list[int], workdir: Path, stem: str
) -> dict[str, Any]:
    argv = [
        sys.executable, "-m", "benchmarks.start_cost", "_child", "--registry", url, "--jobs", str(jobs),
        "--cron", cron, "--counter", counter, "--gc-threshold", str(gc_threshold),
        "--cpus", ",".join(str(c) for c in cpus),
    ]  # fmt: skip
    bound = 300 + jobs / 10  # 10,000 every-second jobs took 109 s on ZooKeeper
    return run_child(argv, workdir, stem, bound, f"start of {jobs} jobs on {url}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0] if __doc__ else NAME)
    parser.add_argument("--jobs", default=None, help="comma-separated job counts (default 1000,10000; quick 50)")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated registries")
    parser.add_argument("--crons", default=",".join(CRONS), help="comma-separated: quiet, every-second")
    add_gc_threshold(parser, "every child")
    add_placement(parser)
    args = parser.parse_args(argv)
    args.jobs = [int(n) for n in (args.jobs or ("50" if args.quick else "1000,10000")).split(",")]
    args.backends = args.backends.split(",")
    args.crons = args.crons.split(",")
    for given, known, what in ((args.backends, BACKENDS, "backend"), (args.crons, tuple(CRONS), "cron")):
        unknown = sorted(set(given) - set(known))
        if unknown:
            parser.error(f"unknown {what}(s) {unknown}; known: {', '.join(known)}")
    if "memory" not in args.backends:
        args.backends.insert(0, "memory")  # the anchor
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    cpus = measured_cpus(args.placement)
    results: list[dict[str, Any]] = []
    with (
        servers(args, zookeeper="zookeeper" in args.backends, etcd="etcd" in args.backends) as found,
        tempfile.TemporaryDirectory(prefix="shardjob-start-") as tmp,
    ):
        addresses = {"zookeeper": found.zookeeper, "etcd": found.etcd}
        for jobs in args.jobs:
            for label in args.crons:
                cron = "* * * * * ?" if CRONS[label] else quiet_cron(datetime.datetime.now())
                for backend in args.backends:
                    tag = f"sc{time.time_ns()}"
                    address = addresses.get(backend)
                    url = f"memory://{tag}" if backend == "memory" else f"{backend}://{address}/{tag}"
                    counter = "" if address is None else f"{backend}={address}"
                    figures = _run_child(
                        url, jobs, cron, counter, args.gc_threshold, cpus, Path(tmp), f"{backend}-{label}-{jobs}"
                    )
                    if address is not None:  # the next child finds the server holding its own jobs only
                        delete_namespace(f"{backend}://{address}", f"/{tag}")
                    results.append({"backend": backend, "crons": label, **figures})
    anchor = {(r["jobs"], r["crons"]): r["cpu_s"] for r in results if r["backend"] == "memory"}
    rows = []
    for r in results:
        base = anchor.get((r["jobs"], r["crons"]))
        r["cpu_x_memory"] = round(r["cpu_s"] / base, 2) if base else None
        rows.append([
            r["jobs"], r["backend"], r["crons"], r["start_s"], r["cpu_s"], r["cpu_ms_per_job"], r["cpu_x_memory"],
            r["server_requests"], r["requests_per_job"], r["fires_during_start"], r["rss_mib"],
        ])  # fmt: skip
    print_table(
        f"Scheduler.start() of N jobs, each in a child of its own (collector threshold {args.gc_threshold or 700})",
        ["jobs", "registry", "cron", "start s", "CPU s", "CPU ms/job", "CPU x memory", "server requests",
         "per job", "fires during start", "RSS MiB"],
        rows,
        left={1, 2},
    )  # fmt: skip
    payload = {"gc_threshold": args.gc_threshold, **placement_fields(args.placement, cpus), "results": results}
    write_results(NAME, args, payload)
    return payload


# -- BENCHMARKS.md ----------------------------------------------------------------------------
def _cell(value: object) -> str:
    return "" if value is None else f"{value:,}" if isinstance(value, int) else str(value)


def render(document: dict[str, Any], charts: Charts) -> str:
    """This benchmark's section of BENCHMARKS.md."""
    threshold = document.get("gc_threshold") or 0
    collector = (
        f"the garbage collector's first threshold at {threshold:,}, as `shardjob worker` sets it"
        if threshold
        else "Python's default collector thresholds"
    )
    rows = [
        "| " + " | ".join(_cell(r.get(key)) for key in (
            "jobs", "backend", "crons", "start_s", "cpu_s", "cpu_ms_per_job", "cpu_x_memory", "server_requests",
            "requests_per_job", "fires_during_start", "rss_mib",
        )) + " |"
        for r in document["results"]
    ]  # fmt: skip
    return "\n".join(
        [
            "### Start-up apart from the fires",
            "",
            "`Scheduler.start()` of N jobs (one item each), each start in a child process of its own, with "
            f"{collector}: the same jobs once on a cron that does not fire during the run (*quiet*: the "
            "start-up's own cost) and once every second (*every-second*: each job fires from the moment it is "
            "registered, so the start competes with the fires of the jobs already up). *server requests* are "
            "counted by the server (ZooKeeper `mntr`, etcd `/metrics`) over the start; the memory registry is "
            "the anchor (*CPU x memory*: against memory's start of the same jobs and cron); RSS is the peak, "
            "reached at the start's end." + placement_sentence(document),
            "",
            "| jobs | registry | cron | start s | CPU s | CPU ms/job | CPU x memory | server requests | per job "
            "| fires during start | RSS MiB |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
            *rows,
        ]
    )


def summary(document: dict[str, Any]) -> list[dict[str, str]]:
    """One row per real registry and job count: the every-second start against its bound,
    the quiet start beside it."""
    found = {(r["backend"], r["jobs"], r["crons"]): r for r in document["results"]}
    rows = []
    for (backend, jobs, cron), r in found.items():
        if backend == "memory" or cron != "every-second":
            continue
        bound = start_bound(jobs)
        quiet = found.get((backend, jobs, "quiet"))
        result = f"{r['start_s']} s, {r['requests_per_job']} server requests per job"
        if quiet is not None:
            result += f" (quiet cron: {quiet['start_s']} s)"
        rows.append(
            {
                "figure": f"`start()` of {jobs:,} every-second jobs, {backend}",
                "target": f"under {bound:g} s",
                "result": result,
                "met": "yes" if r["start_s"] < bound and not r.get("failed_jobs") else "no",
            }
        )
    return rows


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        sys.exit(_child(sys.argv[2:]))
    run_script(main)
