"""Run every benchmark, one after the other, on one pair of servers started once, then
regenerate ``BENCHMARKS.md`` from the results.

Usage: ``.venv/bin/python -m benchmarks.run_all [--quick] [--only NAME[,NAME]] [--out DIR]
[--zk H:P] [--etcd H:P] [--gc-threshold N]`` (the options pass through to each benchmark;
``--gc-threshold`` to those that run schedulers, ``GC_BENCHMARKS``, and defaults to what
``shardjob worker`` sets, so the report measures what a worker runs). A benchmark that
fails is reported and the others still run; the exit status is 1 if any failed.

Invariant: a ``--quick`` run writes its report into ``--out``, never over the committed
``BENCHMARKS.md`` (quick figures are smoke, not measurements); ``--only`` reruns some
benchmarks and rebuilds the report from every result in the results folder.
"""

from __future__ import annotations

import importlib
import sys
import time
import traceback
from typing import Any

from benchmarks.common import REPO_ROOT, base_parser, run_script, servers
from benchmarks.report import BENCHMARK_NAMES, write_report
from scheduler.gc_tuning import WORKER_GC_THRESHOLD

__all__ = ["BENCHMARKS", "GC_BENCHMARKS", "main"]

#: every benchmark, in the order they run (each is ``benchmarks.<name>``, with ``main``)
BENCHMARKS = (
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
    "observability_overhead",
    "console_scale",
)
#: the benchmarks that take ``--gc-threshold`` (each sets it in every scheduler it runs)
GC_BENCHMARKS = frozenset({"scheduler_lateness", "start_cost", "observability_overhead"})
assert set(BENCHMARKS) == set(BENCHMARK_NAMES), "run_all and the report list different benchmarks"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = base_parser(__doc__.splitlines()[0] if __doc__ else "run_all")
    parser.add_argument("--only", default=None, help="comma-separated subset of " + ", ".join(BENCHMARKS))
    parser.add_argument(
        "--gc-threshold",
        type=int,
        default=WORKER_GC_THRESHOLD,
        metavar="N",
        help=f"the collector's first threshold in {', '.join(sorted(GC_BENCHMARKS))} "
        f"(default {WORKER_GC_THRESHOLD}, as `shardjob worker` sets it; 0: Python's)",
    )
    args = parser.parse_args(list(argv or []))
    if args.gc_threshold < 0:  # each benchmark would refuse it only after the servers started
        parser.error(f"--gc-threshold must be >= 0 (0: Python's), got {args.gc_threshold}")
    chosen = [n.strip() for n in args.only.split(",")] if args.only else list(BENCHMARKS)
    unknown = sorted(set(chosen) - set(BENCHMARKS))
    if unknown:
        raise ValueError(f"unknown benchmarks {unknown}; known: {', '.join(BENCHMARKS)}")
    failed: list[str] = []
    took: dict[str, float] = {}
    with servers(args) as live:
        passed = ["--out", str(args.out)]
        if args.quick:
            passed.append("--quick")
        if live.zookeeper:
            passed += ["--zk", live.zookeeper]
        if live.etcd:
            passed += ["--etcd", live.etcd]
        for name in chosen:
            print(f"\n==== {name} ====", flush=True)
            started = time.monotonic()
            try:
                extra = ["--gc-threshold", str(args.gc_threshold)] if name in GC_BENCHMARKS else []
                importlib.import_module(f"benchmarks.{name}").main(passed + extra)
            except Exception:
                traceback.print_exc()
                failed.append(name)
            took[name] = round(time.monotonic() - started, 1)
    report = write_report(args.out, args.out / "BENCHMARKS.md" if args.quick else REPO_ROOT / "BENCHMARKS.md")
    print(f"\nseconds per benchmark: {took}\nwrote {report}")
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        raise SystemExit(1)
    return {"took_s": took, "report": str(report)}


if __name__ == "__main__":
    run_script(main)
