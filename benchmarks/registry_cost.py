"""Registry cost per fire: round trips and bytes per fire per instance in steady state, at
1, 100 and 10,000 items, on memory, ZooKeeper and etcd — beside the count ElasticJob's
algorithm makes for the same fire.

Three ``Scheduler`` instances in this process, each on its own connection wrapped in a
``CountingRegistry`` (every protocol call is one round trip; bytes are the values sent and
received; watch events are counted apart: the server pushes them, and on ZooKeeper each
one also costs the backend a read to re-arm its one-shot watch). One every-second cron job
whose items do nothing; once the assignment is settled and two fires have run, the counters
are reset and K fires are counted (10, quick 2). Per instance: round trips / fires it ran.

ElasticJob's count is derived, not measured, from its run algorithm and registry layout
(docs/registry-layout.md compares the two layouts): with
``monitorExecution`` (its default) a fire writes ``sharding/{i}/running`` for each of the
instance's k items and deletes each afterwards (2k writes); before that it checks, per item,
whether the item was taken over by failover, is disabled or is running (3k reads), reads the
resharding flag and, after the run, the failover queue (2 reads). Curator's TreeCache may
answer some reads locally, so the reads are an upper bound and the 2k writes a lower one; the
clock-skew check (off by default, as here) and misfire flags (none in steady state) add none.

Usage: ``.venv/bin/python -m benchmarks.registry_cost [--quick] [--items 1,100,10000]``
(``--quick``: 100 items only, every instance owning some: the smoke of the suite)
"""

from __future__ import annotations

import argparse
import threading
import time
from collections import Counter
from typing import Any

import registry
from benchmarks.charts import Charts
from benchmarks.common import base_parser, poll_until, print_table, run_script, servers, write_results
from benchmarks.server_counters import read_count
from registry.counting import CountingRegistry

__all__ = ["NAME", "elasticjob_round_trips", "main", "render", "summary"]

NAME = "registry_cost"
INSTANCES = 3
JOB = "cost"


def elasticjob_round_trips(items_per_instance: int) -> dict[str, int]:
    """ElasticJob's registry requests for one fire of one instance owning ``k`` items
    (module docstring): writes are exact, reads an upper bound."""
    k = items_per_instance
    return {"writes": 2 * k, "reads": 3 * k + 2, "total": 5 * k + 2}


class _Tally:
    """Which fires each instance ran (the items do nothing else)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.fires: dict[str, set[float]] = {}

    def job(self, instance: str) -> Any:
        def run(ctx: Any) -> None:
            with self.lock:
                self.fires.setdefault(instance, set()).add(ctx.fire_time)

        return run

    def count(self, instance: str, since: float) -> int:
        with self.lock:
            return sum(1 for f in self.fires.get(instance, ()) if f >= since)


def _measure(
    url: str, items: int, failover: bool, fires: int, server: tuple[str, str] | None = None
) -> dict[str, Any]:
    """``server``: (backend, address) whose own request counter is read over the window."""
    from scheduler import JobConfig, Scheduler

    tally = _Tally()
    counters: list[CountingRegistry] = []
    schedulers: list[Scheduler] = []
    try:
        for index in range(INSTANCES):
            counted = CountingRegistry(registry.connect(url))
            counters.append(counted)
            sched = Scheduler(counted, instance_id=f"10.0.0.{index + 1}@-@{index + 1}")
            sched.add_job(
                JobConfig(name=JOB, cron="* * * * * ?", sharding_total_count=items, failover=failover),
                tally.job(sched.instance_id),
            )
            schedulers.append(sched)
        for sched in schedulers:
            sched.start()
        settled = time.time()
        owners = min(items, INSTANCES)

        def steady() -> bool:
            return sum(tally.count(s.instance_id, settled) >= 2 for s in schedulers) >= owners

        # steady state: every instance that owns items ran two fires after all started
        if poll_until(steady, 60, 0.05) is None:
            raise RuntimeError(f"{items} items: not every owner ran twice within 60 s")
        time.sleep(1 - time.time() % 1 + 0.5)  # mid-second: no fire half counted at the reset
        for counter in counters:
            counter.reset()
        wire0 = read_count(*server) if server else None
        start = time.time()
        time.sleep(fires)  # the window: K whole seconds, K fires
        wire = read_count(*server) - wire0 if server and wire0 is not None else None
        snapshots = [(c.snapshot(), c.events, Counter(c.calls)) for c in counters]
        per_instance: list[dict[str, Any]] = []
        for sched, ((trips, sent, received), events, calls) in zip(schedulers, snapshots, strict=True):
            ran = tally.count(sched.instance_id, start)
            per_instance.append(
                {
                    "instance": sched.instance_id,
                    "fires": ran,
                    "round_trips": trips,
                    "bytes": sent + received,
                    "events": events,
                    "calls": dict(calls),
                }
            )
    finally:
        for sched in schedulers:
            sched.shutdown(wait=True)
        for counter in counters:
            counter.close()
    fired = [p for p in per_instance if p["fires"]]
    total_fires = sum(p["fires"] for p in fired)
    owned = -(-items // INSTANCES)
    return {
        "items": items,
        "failover": failover,
        "items_per_instance": owned,
        "per_instance": per_instance,
        "round_trips_per_fire": round(sum(p["round_trips"] for p in fired) / total_fires, 2),
        "bytes_per_fire": round(sum(p["bytes"] for p in fired) / total_fires),
        "events_per_fire": round(sum(p["events"] for p in fired) / total_fires, 2),
        # every request the server received in the window (pings and keep-alives of the
        # three sessions included), per fire that ran
        "server_requests_per_fire": None if wire is None else round(wire.requests / total_fires, 2),
        "elasticjob": elasticjob_round_trips(owned),
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0] if __doc__ else NAME)
    parser.add_argument("--items", default=None, help="comma-separated item counts (default 1,100,10000)")
    parser.add_argument("--fires", type=int, default=None, help="fires counted (default 10, quick 2)")
    args = parser.parse_args(argv)
    args.items = [int(n) for n in (args.items or ("100" if args.quick else "1,100,10000")).split(",")]
    args.fires = args.fires or (2 if args.quick else 10)
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(list(argv or []))
    results: list[dict[str, Any]] = []
    with servers(args) as live:
        urls = {"memory": f"memory://bench-cost-{time.time_ns()}"}
        if live.zookeeper:
            urls["zookeeper"] = f"zk://{live.zookeeper}/bench-cost-{time.time_ns()}"
        if live.etcd:
            urls["etcd"] = f"etcd://{live.etcd}/bench-cost-{time.time_ns()}"
        addresses = {"zookeeper": live.zookeeper, "etcd": live.etcd}
        for backend, base in urls.items():
            where = addresses.get(backend)
            for items in args.items:
                for failover in (False, True):
                    url = f"{base}-{items}-{int(failover)}"
                    figures = _measure(url, items, failover, args.fires, (backend, where) if where else None)
                    figures["backend"] = backend
                    results.append(figures)
    rows = [
        [
            r["backend"],
            r["items"],
            "on" if r["failover"] else "off",
            r["round_trips_per_fire"],
            r["server_requests_per_fire"],
            r["bytes_per_fire"],
            r["events_per_fire"],
            r["elasticjob"]["total"],
            round(r["elasticjob"]["total"] / r["round_trips_per_fire"], 1),
        ]
        for r in results
    ]
    print_table(
        f"Registry cost per fire per instance, {INSTANCES} instances, {args.fires} fires",
        [
            "backend",
            "items",
            "failover",
            "round trips",
            "at the server",
            "bytes",
            "events",
            "ElasticJob (derived)",
            "EJ / ours",
        ],
        rows,
    )
    payload = {"instances": INSTANCES, "fires": args.fires, "results": results}
    write_results(NAME, args, payload)
    return payload


# -- BENCHMARKS.md ----------------------------------------------------------------------------
def render(document: dict[str, Any], charts: Charts) -> str:
    """This benchmark's section of BENCHMARKS.md."""
    rows = []
    groups: dict[str, dict[str, float]] = {}
    for r in document["results"]:
        ej = r["elasticjob"]
        rows.append(
            f"| {r['backend']} | {r['items']:,} | {r['items_per_instance']:,} | {'on' if r['failover'] else 'off'} | "
            f"{r['round_trips_per_fire']} | {r.get('server_requests_per_fire') or '-'} | "
            f"{r['bytes_per_fire']:,} | {r['events_per_fire']} | {ej['writes']:,} + {ej['reads']:,} |"
        )
        if r["backend"] == "zookeeper" and not r["failover"]:
            groups[f"{r['items']:,} items"] = {
                "shardjob": r["round_trips_per_fire"],
                "ElasticJob": ej["total"],
            }
    lines = [
        "### Registry cost per fire",
        "",
        f"{document['instances']} instances of one every-second job, each on its own connection counted by "
        f"`registry.counting.CountingRegistry`, {document['fires']} fires in steady state; per fire per instance. "
        "*events* are the watch notifications the instance received (the server pushes them; ZooKeeper's "
        "backend re-arms its one-shot watch with one read each). ElasticJob's column is derived from its run "
        "algorithm (writes exact + reads at most; docstring of `benchmarks/registry_cost.py`). *at the server* "
        "is every request the server itself counted in the window (ZooKeeper's `mntr` `zk_packets_received`, "
        "etcd's `/metrics` `grpc_server_msg_received_total`), pings and lease keep-alives of the three "
        "sessions included, divided by the fires run.",
        "",
        "| backend | items | per instance | failover | round trips | at the server | bytes | events "
        "| ElasticJob writes + reads |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
    ]
    if groups:
        chart = charts.bars(
            "registry_cost",
            "round trips per fire per instance (ZooKeeper)",
            groups,
            "round trips",
            log_scale=True,
        )
        lines += ["", f"![round trips per fire]({chart})"]
    lines += [
        "",
        "One fenced transaction writes the running mark and one transaction removes it, whatever the item "
        "count: the cost per fire does not grow with items, where ElasticJob's grows with each item. With "
        "one job per process nothing shares them; with many jobs firing together the group commit does "
        "(see the lateness section's server requests per job-fire).",
    ]
    return "\n".join(lines)


def summary(document: dict[str, Any]) -> list[dict[str, str]]:
    rows = []
    for backend in ("zookeeper", "etcd", "memory"):
        found = [r for r in document["results"] if r["backend"] == backend and not r["failover"]]
        if not found:
            continue
        trips = [r["round_trips_per_fire"] for r in found]
        counts = ", ".join(f"{r['items']:,}" for r in found)
        ej = " / ".join(f"{r['elasticjob']['total']:,}" for r in found)
        rows.append(
            {
                "figure": f"registry round trips per fire per instance, {backend}",
                "target": "O(1) in items",
                "result": f"{' / '.join(str(t) for t in trips)} at {counts} items (ElasticJob, derived: {ej})",
                "met": "yes" if max(trips) <= min(trips) + 0.5 else "no",
            }
        )
    return rows


if __name__ == "__main__":
    run_script(main)
