"""How fast a scheduler of many every-second jobs keeps time again after its connection to
the registry drops, on ZooKeeper and on etcd: for a few seconds (the session survives),
and for longer than the session timeout (the session expires: every job registers and
campaigns again).

One child process per scenario runs ``--jobs`` every-second jobs (1 item each) through a
TCP proxy that this process holds, with the default session timeout (10 s). After the
child runs every job each second and a warm-up, the fires of a steady window are counted
(the anchor, same run), then the proxy cuts every connection for the scenario's seconds
and restores it. Reported: the seconds from the restore until every later second of the
scenario's window ran at least 99 % of its jobs, the share of that window's fires that
ran, and the requests the server counted (``benchmarks.server_counters``) in the 10 s after
the restore against as long a steady window before the cut.

Scenarios: a 4 s cut watched for 20 s, a 15 s cut watched for 60 s (quick: one 2 s cut
watched for 5 s); ``--cut S --after S`` runs that one alone.

Each child is pinned as ``scheduler_lateness``'s are (``--placement``, default ``apart``:
every CPU but one, left to the registry servers; ``benchmarks/placement.py``).

Usage: ``.venv/bin/python -m benchmarks.reconnect_recovery [--quick] [--jobs N] [--cut S
--after S] [--placement apart|shared] [--zk H:P] [--etcd H:P]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
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
from benchmarks.placement import add_placement, measured_cpus, pin, placement_fields, placement_sentence
from benchmarks.server_counters import ServerCount, read_count

__all__ = [
    "NAME",
    "child_argv",
    "child_cpus",
    "fire_counts",
    "main",
    "recovery_seconds",
    "render",
    "steady_window",
    "summary",
]

NAME = "reconnect_recovery"
#: a second counts as on time when at least this share of its jobs' fires ran
ON_TIME = 0.99
#: the registry URL's default session timeout (s): a longer cut expires the session
SESSION_TIMEOUT = 10.0


def _child(argv: list[str]) -> int:
    """The scheduler: start, say ``ready``, and answer each ``counts A B`` on stdin with
    the fires run per whole fire-time second in [A, B) as a JSON list, and ``cpus`` with
    the CPUs it runs on; leave at EOF."""
    parser = argparse.ArgumentParser(prog="reconnect_recovery _child")
    parser.add_argument("--registry", required=True)
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--cpus", default="", help="comma-separated CPUs to pin this process to (none: not pinned)")
    args = parser.parse_args(argv)
    pin([int(c) for c in args.cpus.split(",") if c])  # before any thread starts: they inherit it
    from scheduler import JobConfig, Scheduler, ShardingContext
    from scheduler.gc_tuning import WORKER_GC_THRESHOLD, tune_gc

    tune_gc(WORKER_GC_THRESHOLD)  # as a worker runs
    lock = threading.Lock()
    fires: Counter[int] = Counter()

    def job(ctx: ShardingContext) -> None:
        with lock:
            fires[round(ctx.fire_time)] += 1

    sched = Scheduler(args.registry)
    for n in range(args.jobs):
        sched.add_job(JobConfig(name=f"job-{n:05d}", cron="* * * * * ?"), job)
    sched.start()
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "cpus":
            print(json.dumps(sorted(os.sched_getaffinity(0))), flush=True)
            continue
        _, start, end = line.split()
        with lock:
            counts = [fires[second] for second in range(int(start), int(end))]
        print(json.dumps(counts), flush=True)
    sched.shutdown(wait=True)
    return 0


def child_argv(url: str, jobs: int, cpus: Sequence[int] = ()) -> list[str]:
    """The command line of a child scheduler (``_child``) of ``jobs`` every-second jobs,
    pinned to ``cpus`` (none: not pinned)."""
    return [
        sys.executable, "-m", "benchmarks.reconnect_recovery", "_child",
        "--registry", url, "--jobs", str(jobs), "--cpus", ",".join(str(c) for c in cpus),
    ]  # fmt: skip


def child_cpus(child: subprocess.Popen[bytes]) -> list[int]:
    """The CPUs a child runs on, as it sees them."""
    cpus: list[int] = json.loads(ask(child, "cpus"))
    return cpus


def fire_counts(child: subprocess.Popen[bytes], start: int, end: int) -> list[int]:
    """The fires a child ran per whole fire-time second in [start, end)."""
    counts: list[int] = json.loads(ask(child, f"counts {start} {end}"))
    return counts


def steady_window(
    child: subprocess.Popen[bytes], backend: str, address: str, jobs: int, warmup: float, counted: float
) -> tuple[list[int], ServerCount]:
    """Wait (up to 120 s) until the child runs every job in one second, then ``warmup``
    seconds; then count ``counted`` whole seconds: the child's fires in each (the anchor)
    and the requests the server had over them."""
    deadline = time.monotonic() + 120
    while fire_counts(child, int(time.time()) - 2, int(time.time()) - 1)[0] < ON_TIME * jobs:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{backend}: the scheduler never ran every job in one second within 120 s")
        time.sleep(0.5)
    time.sleep(warmup)
    start = int(time.time()) + 1
    time.sleep(max(0.0, start - time.time()))
    before = read_count(backend, address)
    time.sleep(counted)
    requests = read_count(backend, address) - before
    return fire_counts(child, start, start + int(counted)), requests


def recovery_seconds(counts: list[int], jobs: int, offset: float) -> float | None:
    """Seconds from the restore to the start of the first second from which every second
    in ``counts`` ran ``ON_TIME`` of ``jobs``; ``offset``: the restore's time within the
    first second. None when the window ends late."""
    late = [n for n, count in enumerate(counts) if count < ON_TIME * jobs]
    if not late:
        return 0.0
    if late[-1] == len(counts) - 1:
        return None
    return round(late[-1] + 1 - offset, 1)


def _measure(backend: str, address: str, args: argparse.Namespace, cut: float, after: float) -> dict[str, Any]:
    from tests.servers.proxy import TCPProxy

    jobs, counted = args.jobs, args.counted
    host, _, port = address.split(",")[0].strip().rpartition(":")
    scheme = "zk" if backend == "zookeeper" else "etcd"
    with TCPProxy(host, int(port)) as proxy, tempfile.TemporaryDirectory(prefix="shardjob-bench-reconnect-") as tmp:
        # the default session timeout (10 s) outlives the cut
        url = f"{scheme}://{proxy.address}/bench-reconnect-{time.time_ns()}"
        started = time.monotonic()
        child = spawn_ready(child_argv(url, jobs, args.cpus), Path(tmp) / "child.log", timeout=600)
        try:
            start_s = time.monotonic() - started
            cpus = child_cpus(child)
            steady, steady_requests = steady_window(child, backend, address, jobs, args.warmup, counted)
            proxy.cut()
            time.sleep(cut)
            proxy.restore()
            restored = time.time()
            before = read_count(backend, address)
            time.sleep(counted)
            after_requests = read_count(backend, address) - before
            first = int(restored)
            time.sleep(max(0.0, first + after + 2.0 - time.time()))  # the window's last fires finish
            counts = fire_counts(child, first, first + int(after))
        finally:
            stop_child(child)
    return {
        "backend": backend,
        "jobs": jobs,
        "start_s": round(start_s, 1),
        "cut_s": cut,
        "after_s": after,
        "session": "expired" if cut > SESSION_TIMEOUT else "kept",
        "counted_s": counted,
        "steady_fires_per_s": round(sum(steady) / len(steady), 1),
        "recovery_s": recovery_seconds(counts, jobs, restored - first),
        "fires_run_after": sum(counts),
        "fires_due_after": jobs * len(counts),
        "fires_per_second_after": counts,
        "server_requests_per_s_steady": round(steady_requests.requests / counted, 1),
        "server_requests_per_s_after": round(after_requests.requests / counted, 1),
        "cpus": cpus,
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0] if __doc__ else NAME)
    parser.add_argument("--jobs", type=int, default=None, help="every-second jobs (default 10,000, quick 200)")
    parser.add_argument("--cut", type=float, default=None, help="seconds the connection is down (one scenario)")
    parser.add_argument("--after", type=float, default=None, help="seconds watched after the restore (with --cut)")
    add_placement(parser)
    args = parser.parse_args(argv)
    args.cpus = measured_cpus(args.placement)
    args.jobs = args.jobs or (200 if args.quick else 10_000)
    if (args.cut is None) != (args.after is None):
        parser.error("--cut and --after go together")
    if args.cut is not None:
        args.scenarios = [(args.cut, args.after)]
    else:
        args.scenarios = [(2.0, 5.0)] if args.quick else [(4.0, 20.0), (15.0, 60.0)]
    args.warmup = 1.0 if args.quick else 3.0
    args.counted = 3.0 if args.quick else 10.0  # s of server requests counted, before and after
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    if argv and argv[0] == "_child":
        raise SystemExit(_child(argv[1:]))
    args = parse_args(list(argv or []))
    results = []
    with servers(args) as live:
        for cut, after in args.scenarios:
            for backend, address in (("zookeeper", live.zookeeper), ("etcd", live.etcd)):
                if address:
                    results.append(_measure(backend, address, args, cut, after))
    print_table(
        f"Back on time after a dropped connection, {args.jobs} every-second jobs",
        ["backend", "cut s", "session", "steady fires/s", "recovery s", "fires run after / due", "server req/s steady", "after"],
        [
            [
                r["backend"],
                r["cut_s"],
                r["session"],
                r["steady_fires_per_s"],
                r["recovery_s"],
                f"{r['fires_run_after']}/{r['fires_due_after']}",
                r["server_requests_per_s_steady"],
                r["server_requests_per_s_after"],
            ]
            for r in results
        ],
    )
    payload = {"jobs": args.jobs, "results": results, **placement_fields(args.placement, args.cpus)}
    write_results(NAME, args, payload)
    return payload


# -- BENCHMARKS.md ----------------------------------------------------------------------------
def render(document: dict[str, Any], charts: Charts) -> str:
    rows = [
        f"| {r['backend']} | {r['cut_s']:g} s, session {r['session']} | {r['after_s']:g} s | {r['steady_fires_per_s']:,} | "
        f"{'not within the window' if r['recovery_s'] is None else r['recovery_s']} | "
        f"{r['fires_run_after']:,} / {r['fires_due_after']:,} | {r['server_requests_per_s_steady']:,} | "
        f"{r['server_requests_per_s_after']:,} |"
        for r in document["results"]
    ]
    return "\n".join(
        [
            "### Back on time after a dropped connection",
            "",
            f"One process of {document['jobs']:,} every-second jobs (one item each) reaches its registry "
            "through a TCP proxy, which cuts every connection and restores it: within the session timeout "
            f"({SESSION_TIMEOUT:g} s: the session is kept) and past it (it expires: every job registers and "
            "campaigns again). *recovery* is the seconds from the restore until every later second of "
            f"the window watched after it ran at least {ON_TIME:.0%} of its fires; *steady* is the "
            "same process before the cut (the anchor). Server requests as the server counts them "
            f"(`benchmarks.server_counters`), {document['results'][0]['counted_s']:g} s before the cut and as long "
            "after the restore." + placement_sentence(document),
            "",
            "| backend | cut | watched | steady fires/s | recovery s | fires run after / due | server req/s steady | after restore |",
            "|---|---|---|---|---|---|---|---|",
            *rows,
        ]
    )


def summary(document: dict[str, Any]) -> list[dict[str, str]]:
    return [
        {
            "figure": f"{document['jobs']:,} every-second jobs back on time after a {r['cut_s']:g} s cut "
            f"(session {r['session']}), {r['backend']}",
            "target": "none set (robustness)",
            "result": f"{'not within the window' if r['recovery_s'] is None else str(r['recovery_s']) + ' s'}, "
            f"{r['fires_run_after']:,} / {r['fires_due_after']:,} fires run",
            "met": "-",
        }
        for r in document["results"]
    ]


if __name__ == "__main__":
    run_script(main)
