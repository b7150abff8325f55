"""What observability costs a busy process: 1,000 every-second jobs on ``memory://``, bare
(the anchor, in the same run) and with metrics on, with metrics and run history to SQLite,
and with metrics and run history to PostgreSQL.

Each variant runs in a child process of ``benchmarks.scheduler_lateness`` (the same
start-up, warm-up and window), one after the other, in ``--rounds`` alternating orders so
a busy spell of this shared machine falls on every variant. With metrics on, the child
serves ``/metrics`` and scrapes it every 10 s as a Prometheus server would. Reported: fire
lateness p50/p99 and CPU per fire, each as a ratio to the bare run, and the history rows
written, dropped and still buffered after a flush (the database is up throughout: the
target is none lost).

Target (issue 17): lateness p99 and CPU per fire within 1.2x the bare run.

Usage: ``.venv/bin/python -m benchmarks.observability_overhead [--quick] [--jobs 1000]``
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import observability_parts
from benchmarks.charts import Charts
from benchmarks.common import add_gc_threshold, base_parser, print_table, run_script, write_results
from benchmarks.scheduler_lateness import SCRAPE_INTERVAL, _run_child, child_bound, pool_rounds

__all__ = ["NAME", "VARIANTS", "main", "render", "summary"]

NAME = "observability_overhead"
#: (label, metrics on, s between scrapes (0: none), history database: "" none, else
#: "sqlite" or "postgresql")
VARIANTS = (
    ("bare", False, 0.0, ""),
    ("metrics, not scraped", True, 0.0, ""),
    ("metrics", True, SCRAPE_INTERVAL, ""),
    ("metrics + history to SQLite", True, SCRAPE_INTERVAL, "sqlite"),
    ("metrics + history to PostgreSQL", True, SCRAPE_INTERVAL, "postgresql"),
)
#: the target: lateness p99 and CPU per fire at most this times the bare run's
TARGET_RATIO = 1.2


def _database(kind: str, workdir: Path, index: int, postgres: str | None) -> str:
    if kind == "sqlite":
        return f"sqlite:///{workdir / f'history-{index}.db'}"
    if kind == "postgresql" and postgres:
        from tests.servers.postgres import fresh_database

        return fresh_database(postgres)
    return ""


def _postgres(workdir: Path) -> tuple[Any, str | None, str | None]:
    """A PostgreSQL server started for the run: (server, URL, why not)."""
    from tests.servers.postgres import PostgresServer, postgres_available

    missing = postgres_available()
    if missing:
        return None, None, missing
    server = PostgresServer(workdir / "postgres")
    server.launch()
    server.wait_ready(60)
    return server, server.url, None


def _ratio(value: float | None, anchor: float | None) -> float | None:
    return None if value is None or not anchor else round(value / anchor, 2)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0] if __doc__ else NAME)
    parser.add_argument("--jobs", type=int, default=None, help="every-second jobs (default 1000, quick 200)")
    parser.add_argument("--duration", type=float, default=None, help="window per variant, s (default 30, quick 3)")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 3, quick 1)")
    parser.add_argument("--warmup", type=float, default=None, help="s after every job fired (default 5, quick 0.5)")
    add_gc_threshold(parser, "every variant, the bare one too")
    args = parser.parse_args(argv)
    args.jobs = args.jobs or (200 if args.quick else 1000)
    args.duration = args.duration or (3.0 if args.quick else 30.0)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.warmup = args.warmup if args.warmup is not None else (0.5 if args.quick else 5.0)
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(list(argv or []))
    per_round = args.duration / args.rounds
    bound = child_bound(args.jobs, per_round, args.warmup)
    rounds: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _, _ in VARIANTS}
    skipped: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="shardjob-obs-") as tmp:
        workdir = Path(tmp)
        server, postgres, why_not = _postgres(workdir)
        if why_not:
            skipped["metrics + history to PostgreSQL"] = why_not
        try:
            for index in range(args.rounds):
                order = VARIANTS if index % 2 == 0 else tuple(reversed(VARIANTS))
                for tag, (label, metrics, scrape, kind) in enumerate(order):
                    if label in skipped:
                        continue
                    database = _database(kind, workdir, index, postgres)
                    figures = _run_child(
                        "shardjob", args.jobs, per_round, args.warmup, bound, workdir, index,
                        history=database, metrics=metrics, scrape=scrape, tag=f"-v{tag}",
                        gc_threshold=args.gc_threshold,
                    )  # fmt: skip
                    rounds[label].append(figures)
                    print(f"round {index + 1}/{args.rounds} {label}: p99 {figures['lateness_ms']['p99']} ms", flush=True)
            databases = {"SQLite": _database("sqlite", workdir, args.rounds, postgres)}
            if postgres:
                databases["PostgreSQL"] = _database("postgresql", workdir, args.rounds, postgres)
            parts = observability_parts.measure(args.jobs, databases, seconds=60 if args.quick else 150)
        finally:
            if server is not None:
                server.stop()
                server.remove()  # its data dir is outside workdir (the postgres user's own)
    results: list[dict[str, Any]] = []
    bare = pool_rounds(rounds["bare"])
    for label, metrics, scrape, kind in VARIANTS:
        if label in skipped:
            results.append({"variant": label, "skipped": skipped[label]})
            continue
        pooled = pool_rounds(rounds[label])
        rows = {
            key: sum(r.get(key, 0) for r in rounds[label])
            for key in ("history_written", "history_dropped", "history_buffered")
        }
        results.append(
            {
                "variant": label,
                "metrics": metrics,
                "history": kind or None,
                "fires": pooled["fires"],
                "expected_fires": pooled["expected_fires"],
                "lateness_ms": pooled["lateness_ms"],
                "cpu_us_per_fire": pooled["cpu_us_per_fire"],
                "p99_ratio": _ratio(pooled["lateness_ms"]["p99"], bare["lateness_ms"]["p99"]),
                "cpu_ratio": _ratio(pooled["cpu_us_per_fire"], bare["cpu_us_per_fire"]),
                "rounds_p99_ms": [r["p99_ms"] for r in pooled["rounds"]],
                "scrape_ms": max((r.get("scrape_ms") or 0.0 for r in rounds[label]), default=None) if scrape else None,
                **(rows if kind else {}),
            }
        )
    print_table(
        f"Observability overhead, {args.jobs} every-second jobs on memory:// ({args.rounds} rounds)",
        ["variant", "fires", "p50 ms", "p99 ms", "x bare p99", "CPU us/fire", "x bare CPU", "scrape ms", "history rows"],
        [_row(r) for r in results],
    )
    parts["floor_ratio"] = _floors(parts, bare["cpu_us_per_fire"])
    print_table(
        f"The parts, measured apart (CPU µs per fire; the bare run: {bare['cpu_us_per_fire']})",
        ["part", "µs/fire", "floor x bare"],
        _parts_rows(parts),
    )
    payload = {
        "jobs": args.jobs,
        "duration": args.duration,
        "rounds": args.rounds,
        "gc_threshold": args.gc_threshold,
        "results": results,
        "parts": parts,
    }
    write_results(NAME, args, payload)
    return payload


def _history_cell(r: dict[str, Any]) -> str:
    if not r.get("history"):
        return "-"
    return f"{r['history_written']} written, {r['history_dropped']} dropped, {r['history_buffered']} left"


def _row(r: dict[str, Any]) -> list[object]:
    if "skipped" in r:
        return [r["variant"], "skipped: " + r["skipped"], None, None, None, None, None, None, None]
    return [
        r["variant"],
        f"{r['fires']}/{r['expected_fires']}",
        r["lateness_ms"]["p50"],
        r["lateness_ms"]["p99"],
        r["p99_ratio"],
        r["cpu_us_per_fire"],
        r["cpu_ratio"],
        r["scrape_ms"],
        _history_cell(r),
    ]


def _floors(parts: dict[str, Any], bare: float | None) -> dict[str, dict[str, float | None]]:
    """Per database, on a fresh table and after ``parts["seconds"]``: (bare + both
    observers + the drain) / bare, the least the variant with metrics and that history
    can cost."""
    both = parts["producers"].get("metrics + history")
    return {
        database: {
            when: None if not bare or both is None else round((bare + both + us) / bare, 2)
            for when, us in drain.items()
        }
        for database, drain in parts["drain"].items()
    }


def _parts_rows(parts: dict[str, Any]) -> list[list[object]]:
    rows: list[list[object]] = [[f"observers: {p}", us, None] for p, us in parts["producers"].items()]
    floors = parts.get("floor_ratio", {})
    for database, drain in parts["drain"].items():
        for when, label in (("first_30s", "first 30 s"), ("last_30s", f"last 30 s of {parts['seconds']}")):
            rows.append(
                [
                    f"history writer to {database}, {label} ({parts['rows_per_fire']} rows per fire)",
                    drain[when],
                    floors.get(database, {}).get(when),
                ]
            )
    return rows


# -- BENCHMARKS.md ----------------------------------------------------------------------------
def render(document: dict[str, Any], charts: Charts) -> str:
    lines = [
        "### Observability overhead",
        "",
        f"{document['jobs']} every-second jobs in one process on `memory://`, {document['duration']:g} s of window "
        f"per variant in {document['rounds']} alternating rounds; the bare run is the anchor of the same run. "
        "Metrics on means `/metrics` served and scraped every 10 s; history rows are counted after a flush, "
        "the database up throughout. "
        + (
            f"Every variant runs with the garbage collector's first threshold at {document['gc_threshold']:,}, "
            "as `shardjob worker` runs."
            if document.get("gc_threshold")
            else "The garbage collector runs with Python's default thresholds."
        ),
        "",
        "| variant | fires | p50 ms | p99 ms | p99 x bare | CPU µs/fire | CPU x bare | slowest scrape ms | history rows |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in document["results"]:
        cells = ["" if c is None else str(c) for c in _row(r)]
        lines.append("| " + " | ".join(cells) + " |")
    parts = document.get("parts")
    if parts:
        lines += [
            "",
            "The parts, measured apart in one thread with the collector off "
            "(`benchmarks/observability_parts.py`): the observers as the runner calls them for a fire of one "
            "item, and the history writer's drain of the rows one fire leaves, fed the same jobs' fires for "
            f"{parts['seconds']} simulated seconds (the variants above write 30 s of rows to fresh tables). The "
            "floor is the bare run's CPU per fire plus both observers and the drain, over the bare run's: the "
            "least that variant can cost.",
            "",
            "| part | CPU µs/fire | floor x bare |",
            "|---|---|---|",
        ]
        for row in _parts_rows(parts):
            lines.append("| " + " | ".join("" if c is None else str(c) for c in row) + " |")
    return "\n".join(lines)


def summary(document: dict[str, Any]) -> list[dict[str, str]]:
    out = []
    for r in document["results"]:
        if r["variant"] == "bare" or "skipped" in r:
            continue
        lost = r.get("history_dropped", 0) + r.get("history_buffered", 0)
        met = (
            r["p99_ratio"] is not None
            and r["p99_ratio"] <= TARGET_RATIO
            and r["cpu_ratio"] is not None
            and r["cpu_ratio"] <= TARGET_RATIO
            and lost == 0
        )
        out.append(
            {
                "figure": f"{r['variant']}, {document['jobs']} every-second jobs (x the bare run)",
                "target": f"p99 and CPU/fire <= {TARGET_RATIO}x, no history row lost",
                "result": f"p99 {r['p99_ratio']}x, CPU {r['cpu_ratio']}x" + (f", {lost} rows lost" if r.get("history") else ""),
                "met": "yes" if met else "no",
            }
        )
    return out


if __name__ == "__main__":
    run_script(main)
