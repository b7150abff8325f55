"""Run every benchmark, one after the other, on one pair of servers started once.

Usage: ``.venv/bin/python -m benchmarks.run_all [--quick] [--out DIR] [--zk H:P] [--etcd H:P]``
(the options pass through to each benchmark). A benchmark that fails is reported and the
others still run; the exit status is 1 if any failed.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from benchmarks import election_failover, registry_latency, scheduler_lateness
from benchmarks.common import base_parser, run_script, servers

__all__ = ["BENCHMARKS", "main"]

BENCHMARKS: dict[str, Callable[[list[str] | None], dict[str, Any]]] = {
    "registry_latency": registry_latency.main,
    "election_failover": election_failover.main,
    "scheduler_lateness": scheduler_lateness.main,
}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = base_parser(__doc__.splitlines()[0] if __doc__ else "run_all").parse_args(list(argv or []))
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
        for name, bench in BENCHMARKS.items():
            print(f"\n==== {name} ====", flush=True)
            started = time.monotonic()
            try:
                bench(passed)
            except Exception:
                traceback.print_exc()
                failed.append(name)
            took[name] = round(time.monotonic() - started, 1)
    print(f"\nseconds per benchmark: {took}")
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        raise SystemExit(1)
    return {"took_s": took}


if __name__ == "__main__":
    run_script(main)
