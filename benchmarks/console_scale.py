"""What the web console's job list costs at 1,000 jobs, on ZooKeeper and etcd (and memory):
``GET /`` (the HTML page) and ``GET /api/jobs`` (``shardjob jobs --json``), served by an
in-process console (uvicorn in a thread) over its watch-fed ``LiveView``; ``Cluster.jobs()``
(one ``read_tree`` of the namespace per call) is the anchor. The claim: under a second per
page at 1,000 jobs, and no registry round trip per page.

The namespace holds N jobs written directly (configuration, one server, one live-looking
instance each: the console decodes them like any job); no scheduler runs, so nothing
changes while measured except where the benchmark changes it: ``after one change`` times
the page right after one job's configuration changed (one job decoded again).

Usage: ``.venv/bin/python -m benchmarks.console_scale [--quick] [--jobs 1000] [--reps 20]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import httpx

import registry
from benchmarks.charts import Charts
from benchmarks.common import base_parser, print_table, run_script, servers, write_results
from registry.protocol import Create, Op, RegistryCenter
from scheduler import Cluster, JobConfig
from scheduler.console.app import Console
from scheduler.console.serve import BackgroundConsole
from sharding.layout import JobPaths

__all__ = ["NAME", "main"]

NAME = "console_scale"
#: ops per transaction while filling the namespace (etcd allows 128 compares; a create
#: checks its parents too)
BATCH = 45


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0] if __doc__ else NAME)
    parser.add_argument("--jobs", type=int, default=1000, help="jobs in the namespace (default 1000)")
    parser.add_argument("--reps", type=int, default=20, help="requests per measurement (default 20)")
    parser.add_argument("--backends", default="zookeeper,etcd,memory", help="comma-separated")
    args = parser.parse_args(argv)
    if args.quick:
        args.jobs, args.reps = min(args.jobs, 100), min(args.reps, 3)
    return args


def fill(reg: RegistryCenter, jobs: int) -> list[str]:
    """Write ``jobs`` jobs (configuration, server, instance) in batches; their names."""
    names = [f"job-{i:04d}" for i in range(jobs)]
    ops: list[Op] = []
    for name in names:
        paths = JobPaths(name)
        config = JobConfig(name=name, cron="0 0 * * * ?", sharding_total_count=4, description=f"bench {name}")
        instance = "10.0.0.1@-@1"
        record = json.dumps({"ip": "10.0.0.1", "pid": 1, "started": time.time()}).encode()
        ops += [
            Create(paths.config, config.to_json()),
            Create(paths.server("10.0.0.1"), b"ENABLED"),
            Create(paths.instance(instance), record),
        ]
        if len(ops) >= BATCH:
            reg.transaction(ops)
            ops = []
    if ops:
        reg.transaction(ops)
    return names


def _timed(call: Any, reps: int) -> dict[str, float]:
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return {"median_ms": round(statistics.median(times), 1), "max_ms": round(max(times), 1)}


def measure(backend: str, url: str, jobs: int, reps: int) -> dict[str, Any]:
    reg = registry.connect(url)
    try:
        started = time.perf_counter()
        names = fill(reg, jobs)
        fill_s = time.perf_counter() - started
        cluster = Cluster(reg)
        started = time.perf_counter()
        console = Console(reg, registry_label=backend, password=None)
        load_ms = (time.perf_counter() - started) * 1000
        server = BackgroundConsole(console.app).start()
        try:
            with httpx.Client(base_url=server.url, timeout=60) as web:

                def page() -> None:
                    response = web.get("/")
                    response.raise_for_status()
                    assert names[-1] in response.text

                def api() -> None:
                    response = web.get("/api/jobs")
                    response.raise_for_status()
                    assert len(response.json()) == jobs

                first = _timed(page, 1)["median_ms"]
                rows = {
                    "console start (initial load)": {"median_ms": round(load_ms, 1), "max_ms": round(load_ms, 1)},
                    "GET / first (every job decoded)": {"median_ms": first, "max_ms": first},
                    "GET /": _timed(page, reps),
                    "GET /api/jobs": _timed(api, reps),
                    "GET /?q=job-0999 (filtered)": _timed(lambda: web.get("/?q=job-0999").raise_for_status(), reps),
                }
                changed = []
                for i in range(reps):
                    cluster.update_config(names[i % len(names)], description=f"changed {i}")
                    version = cluster.config_version(names[i % len(names)])[1]

                    def caught_up(name: str = names[i % len(names)], version: int = version) -> bool:
                        return console.view.config_version(name) == version

                    deadline = time.monotonic() + 10
                    while not caught_up() and time.monotonic() < deadline:
                        time.sleep(0.001)  # the watch delivers the change: the poll of a bounded wait
                    changed.append(_timed(page, 1)["median_ms"])
                rows["GET / after one change"] = {"median_ms": round(statistics.median(changed), 1), "max_ms": max(changed)}
                rows["anchor: Cluster.jobs()"] = _timed(cluster.jobs, max(3, reps // 4))
        finally:
            server.stop()
            console.close()
    finally:
        reg.close()
    return {"backend": backend, "fill_s": round(fill_s, 1), "rows": rows}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(list(argv or []))
    chosen = [b.strip() for b in args.backends.split(",")]
    results = []
    with servers(args, zookeeper="zookeeper" in chosen, etcd="etcd" in chosen) as live:
        for backend in chosen:
            if backend == "memory":
                results.append(measure("memory", f"memory://console-bench-{time.time_ns()}", args.jobs, args.reps))
            elif backend == "zookeeper" and live.zookeeper:
                results.append(measure(backend, f"zk://{live.zookeeper}/console{time.time_ns()}", args.jobs, args.reps))
            elif backend == "etcd" and live.etcd:
                results.append(measure(backend, f"etcd://{live.etcd}/console{time.time_ns()}", args.jobs, args.reps))
    labels = list(results[0]["rows"]) if results else []
    print_table(
        f"Console at {args.jobs} jobs: median ms (max) per request",
        ["request", *[r["backend"] for r in results]],
        [[label, *[f"{r['rows'][label]['median_ms']} ({r['rows'][label]['max_ms']})" for r in results]] for label in labels],
    )
    payload = {"jobs": args.jobs, "reps": args.reps, "results": results}
    write_results(NAME, args, payload)
    return payload


# -- BENCHMARKS.md ----------------------------------------------------------------------------
#: the request the summary's claim is about
LIST_PAGE = "GET /"
ANCHOR = "anchor: Cluster.jobs()"


def render(document: dict[str, Any], charts: Charts) -> str:
    results = document["results"]
    labels = list(results[0]["rows"]) if results else []
    lines = [
        f"### Web console at {document['jobs']:,} jobs",
        "",
        f"`python -m benchmarks.console_scale`: a console served in-process over {document['jobs']:,} jobs "
        f"written to the namespace, {document['reps']} requests each, median ms (max). The anchor is "
        "`Cluster.jobs()`, one `read_tree` of the namespace per call; the console reads its watch-fed "
        "`LiveView` instead, so a page costs no registry round trip.",
        "",
        "| request | " + " | ".join(r["backend"] for r in results) + " |",
        "|---|" + "---|" * len(results),
    ]
    for label in labels:
        cells = [f"{r['rows'][label]['median_ms']} ({r['rows'][label]['max_ms']})" for r in results]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(document: dict[str, Any]) -> list[dict[str, str]]:
    out = []
    for r in document["results"]:
        if r["backend"] == "memory":
            continue
        page, anchor = r["rows"][LIST_PAGE], r["rows"][ANCHOR]
        out.append(
            {
                "figure": f"console job list at {document['jobs']:,} jobs, {r['backend']}",
                "target": "under 1 s",
                "result": f"`GET /` {page['median_ms']} ms median, max {page['max_ms']} ms "
                f"(`Cluster.jobs()` {anchor['median_ms']} ms)",
                "met": "yes" if page["max_ms"] < 1000 else "no",
            }
        )
    return out


if __name__ == "__main__":
    run_script(main)
