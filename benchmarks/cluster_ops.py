"""What the operator's calls cost on a 100-job cluster: ``Cluster`` reads and changes on
memory, ZooKeeper and etcd, timed, with the requests the server itself counted per call
(``benchmarks.server_counters``) — the claim is that a read costs O(1) round trips per
job, whatever its instances and items.

Two ``Scheduler`` instances in this process run the same N jobs (4 items each, cron once
an hour, so the cluster is idle while it is measured); a separate ``Cluster`` client makes
each call ``--reps`` times. The server's counters are read around each batch; the idle
rate of the schedulers' own sessions (pings, lease keep-alives) over the same time is
measured first and subtracted.

Usage: ``.venv/bin/python -m benchmarks.cluster_ops [--quick] [--jobs 100] [--reps 20]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import registry
from benchmarks.charts import Charts
from benchmarks.common import base_parser, print_table, run_script, servers, write_results
from benchmarks.server_counters import read_count
from registry.counting import CountingRegistry
from registry.protocol import RegistryCenter
from scheduler import Cluster, JobConfig, Scheduler, ShardingContext

__all__ = ["NAME", "main", "render", "summary"]

NAME = "cluster_ops"
#: the anchors, read in the same run by the same client: what `status JOB` and `jobs` cost
#: when read node by node
ANCHOR_JOB = "anchor: one job node by node"
ANCHOR_ALL = "anchor: every job node by node"
ITEMS = 4
HOURLY = "0 0 * * * ?"


def _noop(ctx: ShardingContext) -> None:
    """The jobs never fire while measured (hourly cron)."""


def _operations(cluster: Cluster, jobs: list[str]) -> list[tuple[str, Callable[[int], object]]]:
    first = jobs[0]
    return [
        ("jobs", lambda i: cluster.jobs()),
        ("status JOB", lambda i: cluster.job(jobs[i % len(jobs)])),
        ("servers", lambda i: cluster.servers()),
        ("config get JOB", lambda i: cluster.config(jobs[i % len(jobs)])),
        ("dump JOB", lambda i: cluster.dump(jobs[i % len(jobs)])),
        ("config set JOB", lambda i: cluster.update_config(first, description=f"d{i}")),
        ("disable JOB --item 1", lambda i: cluster.disable(jobs[i % len(jobs)], items=[1])),
        ("enable JOB --item 1", lambda i: cluster.enable(jobs[i % len(jobs)], items=[1])),
        ("trigger JOB", lambda i: cluster.trigger(jobs[i % len(jobs)])),
        (ANCHOR_JOB, lambda i: _walk(cluster.registry, f"/{jobs[i % len(jobs)]}")),
        (ANCHOR_ALL, lambda i: _walk(cluster.registry, "/")),
    ]


def _walk(reg: RegistryCenter, path: str) -> dict[str, bytes]:
    """The anchor: a subtree read node by node, children then value, one call after the
    other, as ElasticJob's console reads the registry."""
    found: dict[str, bytes] = {}
    for child in reg.children(path):
        child_path = f"{path.rstrip('/')}/{child}"
        node = reg.get_node(child_path)
        if node is not None:
            found[child_path] = node.value
        found.update(_walk(reg, child_path))
    return found


def _measure(backend: str, url: str, address: str | None, jobs: int, reps: int) -> dict[str, Any]:
    names = [f"job{i:04d}" for i in range(jobs)]
    schedulers = [
        Scheduler(url, instance_id=f"10.0.0.{n}@-@{n}", max_workers=4) for n in (1, 2)
    ]
    for sched in schedulers:
        for name in names:
            sched.add_job(JobConfig(name=name, cron=HOURLY, sharding_total_count=ITEMS), _noop)
    started = time.monotonic()
    for sched in schedulers:
        sched.start()
    rows: list[dict[str, Any]] = []
    try:
        counting = CountingRegistry(registry.connect(url))
        with counting, Cluster(counting) as cluster:
            # every job sharded over both instances before anything is timed
            deadline = time.monotonic() + 120
            while any(len({v.instance for v in cluster.job(n).items}) < 2 for n in names):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{backend}: jobs not sharded over both instances within 120 s")
                time.sleep(0.2)
            ready_s = time.monotonic() - started
            idle_rate = 0.0
            if address:
                idle, t0 = read_count(backend, address), time.monotonic()
                time.sleep(2.0)  # a measuring window, not a wait for a condition
                idle_rate = (read_count(backend, address) - idle).requests / (time.monotonic() - t0)
            for label, call in _operations(cluster, names):
                took: list[float] = []
                before = read_count(backend, address) if address else None
                counting.reset()
                window = time.monotonic()
                for i in range(reps):
                    t = time.perf_counter()
                    call(i)
                    took.append(time.perf_counter() - t)
                window = time.monotonic() - window
                per_call = None
                if address and before is not None:
                    counted = (read_count(backend, address) - before).requests - idle_rate * window
                    per_call = round(max(counted, 0.0) / reps, 1)
                rows.append(
                    {
                        "operation": label,
                        "median_ms": round(1000 * statistics.median(took), 1),
                        "max_ms": round(1000 * max(took), 1),
                        "calls_per_call": round(counting.round_trips / reps, 1),
                        "server_requests_per_call": per_call,
                    }
                )
    finally:
        for sched in schedulers:
            sched.shutdown(wait=False)
    return {"backend": backend, "jobs": jobs, "ready_s": round(ready_s, 1), "rows": rows}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0] if __doc__ else NAME)
    parser.add_argument("--jobs", type=int, default=None, help="jobs (default 100, quick 10)")
    parser.add_argument("--reps", type=int, default=None, help="calls per operation (default 20, quick 3)")
    parser.add_argument("--backends", default="memory,zookeeper,etcd")
    args = parser.parse_args(argv)
    args.jobs = args.jobs or (10 if args.quick else 100)
    args.reps = args.reps or (3 if args.quick else 20)
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(list(argv or []))
    chosen = [b.strip() for b in args.backends.split(",")]
    results = []
    with servers(args, zookeeper="zookeeper" in chosen, etcd="etcd" in chosen) as live:
        for backend in chosen:
            if backend == "memory":
                results.append(_measure("memory", f"memory://bench-{time.time_ns()}", None, args.jobs, args.reps))
            elif backend == "zookeeper" and live.zookeeper:
                url = f"zk://{live.zookeeper}/ops{time.time_ns()}"
                results.append(_measure(backend, url, live.zookeeper, args.jobs, args.reps))
            elif backend == "etcd" and live.etcd:
                url = f"etcd://{live.etcd}/ops{time.time_ns()}"
                results.append(_measure(backend, url, live.etcd, args.jobs, args.reps))
    operations = [row["operation"] for row in results[0]["rows"]] if results else []
    print_table(
        f"Operator calls on a {args.jobs}-job cluster (2 instances, {ITEMS} items per job): "
        "median ms (protocol calls, server requests per call)",
        ["operation", *[r["backend"] for r in results]],
        [
            [op, *[_cell(next(x for x in r["rows"] if x["operation"] == op)) for r in results]]
            for op in operations
        ],
    )
    payload = {"jobs": args.jobs, "reps": args.reps, "results": results}
    write_results(NAME, args, payload)
    return payload


def _cell(row: dict[str, Any]) -> str:
    requests = row["server_requests_per_call"]
    server = "" if requests is None else f", {requests} at the server"
    return f"{row['median_ms']} ms ({row['calls_per_call']:g} calls{server})"


# -- BENCHMARKS.md ----------------------------------------------------------------------------
def render(document: dict[str, Any], charts: Charts) -> str:
    results = document["results"]
    operations = [row["operation"] for row in results[0]["rows"]] if results else []
    header = "| operation | " + " | ".join(r["backend"] for r in results) + " |"
    lines = [
        "### Operator calls on a live cluster",
        "",
        f"`Cluster` calls on {document['jobs']} jobs run by 2 instances ({ITEMS} items each), median over "
        f"{document['reps']} calls: the time, the protocol calls made (`CountingRegistry`) and the requests the "
        "server counted per call (ZooKeeper `mntr`, etcd `/metrics`; the sessions' idle traffic subtracted). "
        "A read is one `read_tree`: one range request on etcd; on ZooKeeper one round per tree level, "
        "each level's values and child lists in multiReads of 250 nodes. `jobs` and `servers` read the whole "
        "namespace, the others one job. "
        "The anchors read the same nodes node by node (children, then each value, one call after the "
        "other), as ElasticJob's console does.",
        "",
        header,
        "|---|" + "---|" * len(results),
    ]
    for op in operations:
        cells = [_cell(next(x for x in r["rows"] if x["operation"] == op)) for r in results]
        label = op if op.startswith("anchor") else f"`{op}`"
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(document: dict[str, Any]) -> list[dict[str, str]]:
    out = []
    for r in document["results"]:
        status = next(x for x in r["rows"] if x["operation"] == "status JOB")
        anchor = next((x for x in r["rows"] if x["operation"] == ANCHOR_JOB), None)
        versus = "" if anchor is None else f" (node by node: {anchor['median_ms']} ms, {anchor['calls_per_call']:g} calls)"
        out.append(
            {
                "figure": f"`shardjob status JOB` on a {r['jobs']}-job cluster, {r['backend']}",
                "target": "one registry read per job",
                "result": f"{status['median_ms']} ms, {_cell(status).split('(', 1)[1].rstrip(')')}{versus}",
                "met": "yes" if status["calls_per_call"] <= 1 else "no",
            }
        )
    return out


if __name__ == "__main__":
    run_script(main)
