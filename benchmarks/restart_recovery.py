"""How soon a restarted scheduler of many every-second jobs fires every job again, on
ZooKeeper and on etcd: its process leaves cleanly (a rolling deploy) or is killed, and a
new process with the same jobs starts at once.

One child process (``reconnect_recovery``'s) runs ``--jobs`` every-second jobs (1 item
each) until every job runs each second, the fires of a steady window are counted (the
anchor, same run), then it leaves (``shutdown(wait=True)`` at the end of its input) or is
killed (SIGKILL: its session lives on until the timeout, 10 s), and a second child with
the same jobs and namespace starts. Every job's assignment names the old instance: the new
one registers, is elected leader of every job and reshards each. Reported from the moment
the old process was gone: the new child's ``start()`` seconds, the seconds until every
later second of the window watched ran at least 99 % of its jobs, the share of that
window's fires that ran, and the server's requests (``benchmarks.server_counters``) per
second over the window against the steady window.

Both children are pinned as ``scheduler_lateness``'s are (``--placement``, default
``apart``: every CPU but one, left to the registry servers; ``benchmarks/placement.py``).

Usage: ``.venv/bin/python -m benchmarks.restart_recovery [--quick] [--jobs N] [--ended
left,killed] [--placement apart|shared] [--zk H:P] [--etcd H:P]``
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.charts import Charts
from benchmarks.common import (
    base_parser,
    print_table,
    run_script,
    servers,
    spawn_ready,
    stop_child,
    write_results,
)
from benchmarks.placement import add_placement, measured_cpus, placement_fields, placement_sentence
from benchmarks.reconnect_recovery import (
    ON_TIME,
    SESSION_TIMEOUT,
    child_argv,
    child_cpus,
    fire_counts,
    recovery_seconds,
    steady_window,
)
from benchmarks.server_counters import read_count

__all__ = ["NAME", "first_on_time", "main", "render", "summary"]

NAME = "restart_recovery"
#: how the old process ends -> seconds watched from its end
SCENARIOS = {"left": 60.0, "killed": 60.0}
#: the window watched in a quick run, s: long enough that the new process starts and fires
#: within it on a loaded CI machine (its start took 1-7 s there)
QUICK_WINDOW_S = 15.0


def _spawn(url: str, jobs: int, cpus: Sequence[int], log: Path) -> subprocess.Popen[bytes]:
    return spawn_ready(child_argv(url, jobs, cpus), log, timeout=600)


def _end(child: subprocess.Popen[bytes], how: str) -> None:
    """The old process leaves cleanly (EOF on its input: ``shutdown(wait=True)``) or dies."""
    if how == "killed":
        child.kill()
    elif child.stdin is not None:
        child.stdin.close()
    child.wait(600)
    stop_child(child)  # its pipes


def _measure(backend: str, address: str, args: argparse.Namespace, how: str, after: float) -> dict[str, Any]:
    jobs, counted = args.jobs, args.counted
    scheme = "zk" if backend == "zookeeper" else "etcd"
    url = f"{scheme}://{address}/bench-restart-{time.time_ns()}"
    with tempfile.TemporaryDirectory(prefix="shardjob-bench-restart-") as tmp:
        old = _spawn(url, jobs, args.cpus, Path(tmp) / "old.log")
        try:
            steady, steady_requests = steady_window(old, backend, address, jobs, args.warmup, counted)
        finally:
            _end(old, how)
        gone = time.time()
        before = read_count(backend, address)
        spawned = time.monotonic()
        new = _spawn(url, jobs, args.cpus, Path(tmp) / "new.log")
        try:
            start_s = time.monotonic() - spawned
            cpus = child_cpus(new)
            first = int(gone)
            time.sleep(max(0.0, first + after + 2.0 - time.time()))  # the window's last fires finish
            window_requests = read_count(backend, address) - before
            window_s = time.time() - gone
            counts = fire_counts(new, first, first + int(after))
        finally:
            stop_child(new, timeout=120)
    return {
        "backend": backend,
        "jobs": jobs,
        "ended": how,
        "after_s": after,
        "counted_s": counted,
        "steady_fires_per_s": round(sum(steady) / len(steady), 1),
        "start_s": round(start_s, 1),
        "recovery_s": recovery_seconds(counts, jobs, gone - first),
        "fires_run_after": sum(counts),
        "fires_due_after": jobs * len(counts),
        "fires_per_second_after": counts,
        "server_requests_per_s_steady": round(steady_requests.requests / counted, 1),
        "server_requests_per_s_after": round(window_requests.requests / window_s, 1),
        "cpus": cpus,
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0] if __doc__ else NAME)
    parser.add_argument("--jobs", type=int, default=None, help="every-second jobs (default 10,000, quick 200)")
    parser.add_argument(
        "--ended", default=None, help=f"how the old process ends, comma-separated subset of {', '.join(SCENARIOS)}"
    )
    add_placement(parser)
    args = parser.parse_args(argv)
    args.cpus = measured_cpus(args.placement)
    args.jobs = args.jobs or (200 if args.quick else 10_000)
    ended = list(SCENARIOS) if args.ended is None else [how.strip() for how in args.ended.split(",")]
    unknown = sorted(set(ended) - set(SCENARIOS))
    if unknown:
        parser.error(f"--ended: unknown {', '.join(unknown)} (choose from {', '.join(SCENARIOS)})")
    args.scenarios = [("left", QUICK_WINDOW_S)] if args.quick else [(how, SCENARIOS[how]) for how in ended]
    args.warmup = 1.0 if args.quick else 3.0
    args.counted = 2.0 if args.quick else 10.0  # s of the steady window
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(list(argv or []))
    results = []
    with servers(args) as live:
        for how, after in args.scenarios:
            for backend, address in (("zookeeper", live.zookeeper), ("etcd", live.etcd)):
                if address:
                    results.append(_measure(backend, address, args, how, after))
    print_table(
        f"Back on time after a restart, {args.jobs} every-second jobs",
        ["backend", "old process", "steady fires/s", "start s", "recovery s", "fires run after / due", "server req/s steady", "after"],
        [
            [
                r["backend"],
                r["ended"],
                r["steady_fires_per_s"],
                r["start_s"],
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
def _recovery(r: dict[str, Any]) -> str:
    return "not within the window" if r["recovery_s"] is None else f"{r['recovery_s']}"


def first_on_time(counts: list[int], jobs: int) -> int | None:
    """The first whole second of the window (from its start) that ran ``ON_TIME`` of
    ``jobs``, or None: when every job fired again, whatever the seconds after it did."""
    return next((n for n, count in enumerate(counts) if count >= ON_TIME * jobs), None)


def _first(r: dict[str, Any]) -> str:
    first = first_on_time(r["fires_per_second_after"], r["jobs"])
    return "-" if first is None else str(first)


def render(document: dict[str, Any], charts: Charts) -> str:
    rows = [
        f"| {r['backend']} | {r['ended']} | {r['after_s']:g} s | {r['steady_fires_per_s']:,} | {r['start_s']} | "
        f"{_first(r)} | {_recovery(r)} | {r['fires_run_after']:,} / {r['fires_due_after']:,} | "
        f"{r['server_requests_per_s_steady']:,} | {r['server_requests_per_s_after']:,} |"
        for r in document["results"]
    ]
    return "\n".join(
        [
            "### Back on time after a restart",
            "",
            f"One process of {document['jobs']:,} every-second jobs (one item each) runs every job each second, "
            "then leaves cleanly (*left*: `shutdown()`, as a rolling deploy stops it) or is killed (*killed*: its "
            f"session lives on for the timeout, {SESSION_TIMEOUT:g} s), and a new process with the same jobs starts "
            "at once: it is elected leader of every job and reshards each. From the moment the old process was "
            f"gone: the new one's `start()`, the first whole second of the window (from the one it ended in) that "
            f"ran at least {ON_TIME:.0%} of its fires (*all firing*), *recovery* (the seconds until every later second "
            "did) and the fires run in that window; *steady* is the old process "
            "before it ended (the anchor). Server requests as the server counts them "
            "(`benchmarks.server_counters`), per second of the steady window and of the window watched."
            + placement_sentence(document),
            "",
            "| backend | old process | watched | steady fires/s | start s | all firing, second | recovery s "
            "| fires run after / due | server req/s steady | after |",
            "|---|---|---|---|---|---|---|---|---|---|",
            *rows,
        ]
    )


def summary(document: dict[str, Any]) -> list[dict[str, str]]:
    return [
        {
            "figure": f"{document['jobs']:,} every-second jobs back on time after a restart "
            f"(old process {r['ended']}), {r['backend']}",
            "target": "none set (robustness)",
            "result": f"all firing in second {_first(r)}, every later second "
            f"{'not within the window' if r['recovery_s'] is None else 'from ' + str(r['recovery_s']) + ' s'}, "
            f"{r['fires_run_after']:,} / {r['fires_due_after']:,} fires run",
            "met": "-",
        }
        for r in document["results"]
    ]


if __name__ == "__main__":
    run_script(main)
