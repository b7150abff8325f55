"""Latency of one registry call through ``registry.connect`` against the raw client doing
the same thing on the same server in the same run: kazoo (ZooKeeper), pyetcd (etcd).

Ops: ``get`` of a 64-byte value, ``put`` overwriting it, and a ``transaction`` of three
``Set``s (raw: a kazoo transaction of three ``set_data``, an etcd txn of three puts).
Sequential, one client, ``--ops`` each (1,000; 100 with ``--quick``) after a warm-up.
Ours and the raw client alternate in blocks of 50, so a noisy neighbour on this shared
machine hits both alike; the ratio of medians is the figure.

Usage: ``.venv/bin/python -m benchmarks.registry_latency [--quick] [--ops N]``
"""

from __future__ import annotations

import argparse
import functools
import time
import uuid
from collections.abc import Callable
from typing import Any

import registry
from benchmarks.charts import Charts
from benchmarks.common import (
    base_parser,
    first_host,
    print_table,
    run_script,
    servers,
    summarize,
    write_results,
)
from registry.protocol import Set

__all__ = ["NAME", "OPS", "main", "render", "summary"]

NAME = "registry_latency"
OPS = ("get", "put", "transaction")
VALUE = b"v" * 64
BLOCK = 50
WARMUP = 20

#: servers.md, "Latency on loopback (1,000 sequential ops, median ms)", for the record
REFERENCE_MS = {
    "zookeeper": {"get": 0.28, "create+delete": 1.66, "multi of 3": 0.68},
    "etcd": {"get": 0.29, "put": 0.50, "txn of 3 writes": 0.59},
}

Call = Callable[[], object]


def _time_block(call: Call, count: int, into: list[float]) -> None:
    clock = time.perf_counter
    for _ in range(count):
        start = clock()
        call()
        into.append((clock() - start) * 1000.0)


def _measure(ours: Call, raw: Call | None, ops: int) -> tuple[list[float], list[float]]:
    """Latencies in ms of ``ours`` and ``raw``, interleaved in blocks."""
    warm: list[float] = []
    _time_block(ours, WARMUP, warm)
    if raw is not None:
        _time_block(raw, WARMUP, warm)
    mine: list[float] = []
    theirs: list[float] = []
    done = 0
    while done < ops:
        count = min(BLOCK, ops - done)
        _time_block(ours, count, mine)
        if raw is not None:
            _time_block(raw, count, theirs)
        done += count
    return mine, theirs


def _ours(url: str) -> tuple[dict[str, Call], Callable[[], None]]:
    reg = registry.connect(url)
    paths = ["/a", "/t1", "/t2", "/t3"]
    for path in paths:
        reg.put(path, VALUE)
    txn = [Set(path, VALUE) for path in paths[1:]]
    calls: dict[str, Call] = {
        "get": lambda: reg.get("/a"),
        "put": lambda: reg.put("/a", VALUE),
        "transaction": lambda: reg.transaction(txn),
    }
    return calls, reg.close


def _kazoo(address: str, root: str) -> tuple[dict[str, Call], Callable[[], None]]:
    from kazoo.client import KazooClient

    client = KazooClient(hosts=address)
    client.start(timeout=10)
    paths = [f"{root}/a", f"{root}/t1", f"{root}/t2", f"{root}/t3"]
    for path in paths:
        client.create(path, VALUE, makepath=True)

    def multi() -> object:
        txn = client.transaction()
        for path in paths[1:]:
            txn.set_data(path, VALUE)
        return txn.commit()

    def close() -> None:
        client.delete(root, recursive=True)
        client.stop()
        client.close()

    calls: dict[str, Call] = {
        "get": lambda: client.get(paths[0]),
        "put": lambda: client.set(paths[0], VALUE),
        "transaction": multi,
    }
    return calls, close


def _pyetcd(address: str, root: str) -> tuple[dict[str, Call], Callable[[], None]]:
    import pyetcd

    host, port = first_host(address)
    client = pyetcd.client(host=host, port=port, timeout=10)
    keys = [f"{root}/a", f"{root}/t1", f"{root}/t2", f"{root}/t3"]
    for key in keys:
        client.put(key, VALUE)

    def txn() -> object:
        return client.transaction(
            compare=[], success=[client.transactions.put(key, VALUE) for key in keys[1:]], failure=[]
        )

    def close() -> None:
        client.delete_prefix(root)
        client.close()

    calls: dict[str, Call] = {
        "get": lambda: client.get(keys[0]),
        "put": lambda: client.put(keys[0], VALUE),
        "transaction": txn,
    }
    return calls, close


RAW_NAMES = {
    "zookeeper": {"get": "kazoo get", "put": "kazoo set", "transaction": "kazoo transaction of 3 set_data"},
    "etcd": {"get": "pyetcd get", "put": "pyetcd put", "transaction": "pyetcd txn of 3 puts"},
}


def _bench_backend(
    backend: str,
    url: str,
    raw_factory: Callable[[], tuple[dict[str, Call], Callable[[], None]]] | None,
    ops: int,
) -> dict[str, Any]:
    ours, close_ours = _ours(url)
    raw: dict[str, Call] | None = None
    close_raw: Callable[[], None] | None = None
    try:
        if raw_factory is not None:
            raw, close_raw = raw_factory()
        result: dict[str, Any] = {}
        for op in OPS:
            mine, theirs = _measure(ours[op], raw[op] if raw else None, ops)
            mine_s, theirs_s = summarize(mine), summarize(theirs) if raw else None
            ratio = None
            if theirs_s is not None and theirs_s["p50"] and mine_s["p50"] is not None:
                ratio = round(float(mine_s["p50"]) / float(theirs_s["p50"]), 2)
            result[op] = {
                "shardjob_ms": mine_s,
                "raw_ms": theirs_s,
                "raw_client": RAW_NAMES.get(backend, {}).get(op),
                "ratio_p50": ratio,
            }
        return result
    finally:
        close_ours()
        if close_raw is not None:
            close_raw()


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0] if __doc__ else NAME)
    parser.add_argument("--ops", type=int, default=None, help="ops per measurement (default 1000, quick 100)")
    parser.add_argument(
        "--backends", default="memory,zookeeper,etcd", help="comma-separated subset of memory,zookeeper,etcd"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(list(argv or []))
    ops = args.ops or (100 if args.quick else 1000)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    run = uuid.uuid4().hex[:8]
    results: dict[str, Any] = {}
    with servers(args, zookeeper="zookeeper" in backends, etcd="etcd" in backends) as live:
        for backend in backends:
            if backend == "memory":
                results[backend] = _bench_backend(backend, f"memory://bench-{run}/latency", None, ops)
            elif backend == "zookeeper":
                assert live.zookeeper is not None
                results[backend] = _bench_backend(
                    backend,
                    f"zk://{live.zookeeper}/bench-latency-{run}",
                    functools.partial(_kazoo, live.zookeeper, f"/bench-latency-raw-{run}"),
                    ops,
                )
            elif backend == "etcd":
                assert live.etcd is not None
                results[backend] = _bench_backend(
                    backend,
                    f"etcd://{live.etcd}/bench-latency-{run}",
                    functools.partial(_pyetcd, live.etcd, f"/bench-latency-raw-{run}"),
                    ops,
                )
            else:
                raise ValueError(f"unknown backend {backend!r}; known: memory, zookeeper, etcd")
    rows = []
    for backend, per_op in results.items():
        for op, figures in per_op.items():
            mine, theirs = figures["shardjob_ms"], figures["raw_ms"] or {}
            rows.append(
                [
                    backend,
                    op,
                    mine["p50"],
                    mine["p90"],
                    figures["raw_client"] or "-",
                    theirs.get("p50"),
                    theirs.get("p90"),
                    figures["ratio_p50"],
                ]
            )
    print_table(
        f"Registry latency, {ops} sequential ops each (ms)",
        ["backend", "op", "ours p50", "ours p90", "raw client", "raw p50", "raw p90", "ratio p50"],
        rows,
    )
    payload = {"ops": ops, "value_bytes": len(VALUE), "results": results, "reference_ms": REFERENCE_MS}
    write_results(NAME, args, payload)
    return payload


if __name__ == "__main__":
    run_script(main)


# -- BENCHMARKS.md ----------------------------------------------------------------------------
def render(document: dict[str, Any], charts: Charts) -> str:
    """This benchmark's section of BENCHMARKS.md."""
    results: dict[str, Any] = document["results"]
    rows = []
    groups: dict[str, dict[str, float]] = {}
    for backend, per_op in results.items():
        for op, figures in per_op.items():
            ours = figures["shardjob_ms"]["p50"]
            raw = (figures.get("raw_ms") or {}).get("p50")
            rows.append(
                f"| {backend} | {op} | {ours} | {figures['shardjob_ms']['p99']} | "
                f"{raw if raw is not None else '—'} ({figures.get('raw_client') or 'no raw client'}) | "
                f"{figures.get('ratio_p50') or '—'} |"
            )
            if raw is not None:
                groups[f"{backend} {op}"] = {"shardjob": ours, "raw client": raw}
    chart = charts.bars("registry_latency", "median latency per call, ours vs the raw client", groups, "ms")
    return "\n".join(
        [
            "### Registry call latency",
            "",
            f"{document['ops']:,} sequential calls per operation and backend, {document['value_bytes']} B values; "
            "ours through the RegistryCenter protocol beside the raw client (kazoo, pyetcd) in the same run.",
            "",
            "| backend | call | ours p50 ms | ours p99 ms | raw client p50 ms | ours / raw (p50) |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
            f"![median latency per call]({chart})",
            "",
            "The protocol layer (validation, namespace, limits, error mapping) costs a few tens of "
            "microseconds over the raw client; a call is one round trip either way.",
        ]
    )


def summary(document: dict[str, Any]) -> list[dict[str, str]]:
    parts = []
    for backend in ("zookeeper", "etcd"):
        per_op = document["results"].get(backend)
        if per_op:
            ratios = "/".join(str(per_op[op].get("ratio_p50")) for op in OPS)
            parts.append(f"{backend} get/put/txn {ratios} x the raw client")
    return [
        {
            "figure": "registry call latency (p50, ours / raw client)",
            "target": "a thin layer over the raw client",
            "result": "; ".join(parts),
            "met": "n/a",
        }
    ]
