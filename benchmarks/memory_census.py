"""Where a job's memory goes: the growth per job of a process's RSS and of the Python heap
(``tracemalloc``), by the part of the code that allocated it, on each registry, beside
APScheduler's growth per job measured in the same run (the anchor of issue #14's RSS
target: at most 1.5 x APScheduler's RSS at 10,000 jobs), and the *floor*: what a job
cannot do without, held with nothing around it, the least any design of the mirror and
the job's objects could reach (``floor_jobs``).

Each figure is a difference between two starts of quiet jobs (a cron that does not fire
during the run, ``start_cost.quiet_cron``), a small one and a large one, each in a child
process of its own, so what one process holds whatever its job count (imports, threads,
connections) cancels out and what is left is the state a job adds; each child's namespace
is deleted once it ends (``delete_namespace``). RSS comes from children without
``tracemalloc`` (it costs memory of its own); the heap's parts from children with it,
grouped by the file that allocated each block (``COMPONENTS``). A block is counted where
it was allocated, not by what keeps it alive: a node's value read off the wire is held by
the cache but counted under the client that decoded it.

A diagnostic, run by hand (not by ``run_all``): ``.venv/bin/python -m
benchmarks.memory_census [--quick] [--jobs 2000,10000] [--backends memory,zookeeper,etcd]``
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.common import (
    REPO_ROOT,
    BenchmarkError,
    base_parser,
    delete_namespace,
    print_table,
    run_child,
    run_script,
    servers,
    status_mib,
    write_results,
)
from benchmarks.start_cost import quiet_cron

__all__ = ["BACKENDS", "COMPONENTS", "NAME", "component", "floor_jobs", "floor_template", "main", "per_job"]

NAME = "memory_census"
#: the registries, the floor (no registry: ``floor_jobs``), then the anchor
#: (APScheduler's in-memory job store, the same crons)
BACKENDS = ("memory", "zookeeper", "etcd", "floor", "apscheduler")
#: (label, where its files are), first match wins: a path relative to the repository, or
#: a package under ``site-packages``
COMPONENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("paths", ("registry/paths.py", "sharding/layout.py")),
    ("cache", ("registry/recipes/cache.py", "registry/children.py")),
    ("watch and backend", ("registry/backends/", "registry/call_stats.py")),
    ("client library", ("kazoo/", "pyetcd/", "grpc/", "google/")),
    ("sharding", ("sharding/", "registry/recipes/")),
    ("scheduler", ("scheduler/",)),
    ("apscheduler", ("apscheduler/", "tzlocal/", "pytz/")),
)
#: everything else: the standard library (threading, json, the job's own name strings)
OTHER = "other"
_SITE_PACKAGES = "/site-packages/"


def component(filename: str, root: Path = REPO_ROOT) -> str:
    """The ``COMPONENTS`` label of an allocating file, ``OTHER`` when none claims it: a
    file of an installed package by its path below ``site-packages``, one of ours by its
    path below ``root`` (never by a fragment that the checkout's own folder might hold)."""
    if _SITE_PACKAGES in filename:
        place = filename.rpartition(_SITE_PACKAGES)[2]
    else:
        try:
            place = Path(filename).relative_to(root).as_posix()
        except ValueError:
            return OTHER
    for label, prefixes in COMPONENTS:
        if place.startswith(prefixes):
            return label
    return OTHER


def per_job(small: dict[str, Any], large: dict[str, Any]) -> dict[str, float | None]:
    """Each figure's growth from the small start to the large one, per job added (bytes;
    None when either start lacks the figure)."""
    added = large["jobs"] - small["jobs"]
    if added <= 0:
        raise ValueError(f"the large start must have more jobs than the small one: {small['jobs']} -> {large['jobs']}")
    keys = (set(small["bytes"]) | set(large["bytes"])) - {"jobs"}
    return {
        key: None
        if small["bytes"].get(key) is None or large["bytes"].get(key) is None
        else round((large["bytes"][key] - small["bytes"][key]) / added, 1)
        for key in sorted(keys)
    }


# -- child ------------------------------------------------------------------------------
def _start_shardjob(url: str, jobs: int, cron: str) -> Any:
    from scheduler import JobConfig, Scheduler, ShardingContext

    def job(ctx: ShardingContext) -> None:  # never fires: the cron is a day away
        pass

    sched = Scheduler(url)
    for i in range(jobs):
        sched.add_job(JobConfig(name=f"job-{i:05d}", cron=cron), job)
    sched.start()
    if sched.failed_jobs:
        raise BenchmarkError(f"{len(sched.failed_jobs)} job(s) failed to start on {url}")
    return lambda: sched.shutdown(wait=False)


def _start_apscheduler(jobs: int, cron: str) -> Any:
    from apscheduler.schedulers.background import BackgroundScheduler
    from apscheduler.triggers.cron import CronTrigger

    second, minute, hour = cron.split()[:3]

    def job() -> None:
        pass

    sched = BackgroundScheduler(job_defaults={"coalesce": True, "max_instances": 1})
    for i in range(jobs):
        sched.add_job(job, CronTrigger(second=second, minute=minute, hour=hour), id=f"job-{i:05d}")
    sched.start()
    return lambda: sched.shutdown(wait=False)


#: a floor job's timer entry: (due, sequence, (config, parsed cron, node entries))
FloorEntry = tuple[float, int, tuple[Any, Any, tuple[object, ...]]]
#: the job whose nodes ``floor_template`` reads; each floor job's values name their own job
_TEMPLATE = "job-template"


def floor_template(cron: str) -> list[Any]:
    """The nodes (``registry.Node``) of one job started on ``memory://``, by path: what
    each floor job holds a value and a version of."""
    import registry
    from scheduler import JobConfig, Scheduler

    store = f"memory://bench-census-floor-{time.time_ns()}"
    sched = Scheduler(store)
    sched.add_job(JobConfig(name=_TEMPLATE, cron=cron), lambda ctx: None)
    sched.start()
    try:
        with registry.connect(store) as reg:
            return [node for _, node in sorted(reg.read_tree(f"/{_TEMPLATE}").items())]
    finally:
        sched.shutdown(wait=True)


def floor_jobs(
    jobs: int, cron: str, nodes: Sequence[Any]
) -> tuple[list[tuple[float, int, tuple[str, str]]], dict[tuple[str, str], FloorEntry]]:
    """What ``jobs`` started jobs cannot do without, held with nothing around them: each
    one's config, its parsed cron, a timer entry (a heap of keys and a map of entries, as
    ``scheduler.timer`` keeps), and the value and version of each of ``nodes``
    (``floor_template``), one tuple per job with no path per node (an empty value as its
    bare version, as the cache keeps it).

    Each job's values are bytes of its own, as off the wire, and each version an int above
    the small ints CPython shares, as a registry's are. No registry client is open: its
    baseline cancels out of the growth per job anyway."""
    import heapq

    from scheduler import JobConfig

    revision = 1 << 20
    heap: list[tuple[float, int, tuple[str, str]]] = []
    timer: dict[tuple[str, str], FloorEntry] = {}
    due = time.time() + 3600.0
    for i in range(jobs):
        name = f"job-{i:05d}"
        config = JobConfig(name=name, cron=cron)
        mirror: list[object] = []
        for node in nodes:
            revision += 1
            value = node.value.replace(_TEMPLATE.encode(), name.encode())
            mirror.append((bytes(bytearray(value)), revision) if value else revision)
        key = (name, "fire")
        heapq.heappush(heap, (due, i, key))
        timer[key] = (due, i, (config, config.schedule(), tuple(mirror)))
    return heap, timer


def _start_floor(jobs: int, cron: str, nodes: Sequence[Any]) -> Any:
    heap, timer = floor_jobs(jobs, cron, nodes)

    def stop() -> None:
        heap.clear()
        timer.clear()

    return stop


def _child(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="memory_census _child")
    parser.add_argument("--registry", required=True, help="a registry URL, 'floor' or 'apscheduler'")
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--cron", required=True)
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds after start() before measuring")
    parser.add_argument("--result", type=Path, required=True)
    args = parser.parse_args(argv)
    import tracemalloc

    # the floor's template job is started and gone before the count begins
    template = floor_template(args.cron) if args.registry == "floor" else []
    if args.tracemalloc:
        tracemalloc.start(1)
    began = time.monotonic()
    if args.registry == "apscheduler":
        stop = _start_apscheduler(args.jobs, args.cron)
    elif args.registry == "floor":
        stop = _start_floor(args.jobs, args.cron, template)
    else:
        stop = _start_shardjob(args.registry, args.jobs, args.cron)
    start_s = time.monotonic() - began
    time.sleep(args.settle)  # events of the start's last writes still arriving
    gc.collect()
    figures: dict[str, float | None] = {"rss": None if args.tracemalloc else _rss_bytes()}
    if args.tracemalloc:
        by_file = tracemalloc.take_snapshot().statistics("filename")
        figures.update(dict.fromkeys([label for label, _ in COMPONENTS] + [OTHER], 0.0))
        for stat in by_file:
            label = component(stat.traceback[0].filename)
            figures[label] = (figures[label] or 0.0) + stat.size
        figures["heap"] = sum(stat.size for stat in by_file)
    args.result.write_text(json.dumps({"jobs": args.jobs, "start_s": round(start_s, 2), "bytes": figures}))
    stop()
    return 0


def _rss_bytes() -> float | None:
    mib = status_mib("VmRSS")
    return None if mib is None else mib * 1024 * 1024


def _run_child(
    registry: str, jobs: int, cron: str, traced: bool, settle: float, workdir: Path, stem: str
) -> dict[str, Any]:
    argv = [
        sys.executable, "-m", "benchmarks.memory_census", "_child", "--registry", registry,
        "--jobs", str(jobs), "--cron", cron, "--settle", str(settle), *(["--tracemalloc"] if traced else []),
    ]  # fmt: skip
    bound = 300 + jobs / 10  # a traced start of 10,000 jobs on etcd took 67 s
    return run_child(argv, workdir, stem, bound, f"start of {jobs} jobs on {registry}")


# -- parent -----------------------------------------------------------------------------
def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0] if __doc__ else NAME)
    parser.add_argument("--jobs", default=None, help="SMALL,LARGE job counts (default 2000,10000; quick 20,100)")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated: " + ", ".join(BACKENDS))
    args = parser.parse_args(argv)
    counts = (args.jobs or ("20,100" if args.quick else "2000,10000")).split(",")
    try:
        args.jobs = [int(n) for n in counts]
    except ValueError:
        parser.error(f"--jobs takes two job counts, SMALL,LARGE: got {','.join(counts)!r}")
    if len(args.jobs) != 2 or not 0 < args.jobs[0] < args.jobs[1]:
        parser.error(f"--jobs takes two job counts, SMALL,LARGE with 0 < SMALL < LARGE: got {args.jobs}")
    args.backends = args.backends.split(",")
    unknown = sorted(set(args.backends) - set(BACKENDS))
    if unknown:
        parser.error(f"unknown backend(s) {unknown}; known: {', '.join(BACKENDS)}")
    if "apscheduler" not in args.backends:
        args.backends.append("apscheduler")  # the anchor
    return args


def _server(backend: str, addresses: dict[str, str | None]) -> str | None:
    """The registry URL of ``backend``'s server, no namespace; None for a process's own."""
    address = addresses.get(backend)
    return None if address is None else f"{backend}://{address}"


def _url(backend: str, server: str | None, namespace: str) -> str:
    """What the child is given: a registry URL under ``namespace``, or the pseudo-registry's
    name (``floor``, ``apscheduler``)."""
    if backend == "memory":
        return f"memory://{namespace[1:]}"  # a store named like the other children's namespaces
    if server is None:
        return backend
    return f"{server}{namespace}"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    small, large = args.jobs
    cron = quiet_cron(datetime.datetime.now())
    settle = 0.5 if args.quick else 2.0  # a quick start of tens of jobs has no backlog of events
    with (
        servers(args, zookeeper="zookeeper" in args.backends, etcd="etcd" in args.backends) as found,
        tempfile.TemporaryDirectory(prefix="shardjob-census-") as tmp,
    ):
        addresses = {"zookeeper": found.zookeeper, "etcd": found.etcd}

        def census(backend: str) -> dict[str, Any]:
            starts = {}
            for traced in (False, True):
                for jobs in (small, large):
                    stem = f"{backend}-{jobs}-{'traced' if traced else 'plain'}"
                    namespace = f"/bench-census-{stem}-{time.time_ns()}"
                    server = _server(backend, addresses)
                    url = _url(backend, server, namespace)
                    starts[traced, jobs] = _run_child(url, jobs, cron, traced, settle, Path(tmp), stem)
                    if server is not None:  # the next child finds the server holding its own jobs only
                        delete_namespace(server, namespace)
            growth = per_job(starts[False, small], starts[False, large])
            growth.update({k: v for k, v in per_job(starts[True, small], starts[True, large]).items() if k != "rss"})
            return {
                "backend": backend,
                "jobs": [small, large],
                "start_s": {str(jobs): starts[False, jobs]["start_s"] for jobs in (small, large)},
                "rss_mib": {str(jobs): _mib(starts[False, jobs]["bytes"]["rss"]) for jobs in (small, large)},
                "bytes_per_job": growth,
            }

        # one child at a time, so that no start is timed beside another; a quick run (a
        # check of the census's shape, tens of jobs) runs two registries' children at once
        with ThreadPoolExecutor(max_workers=2 if args.quick else 1) as pool:
            results = list(pool.map(census, args.backends))
    anchor = next(r for r in results if r["backend"] == "apscheduler")
    _print(results, anchor, small, large)
    payload = {"cron": cron, "results": results}
    write_results(NAME, args, payload)
    return payload


def _mib(value: float | None) -> float | None:
    return None if value is None else round(value / (1024 * 1024), 1)


def _x(value: float | None, base: float | None) -> float | None:
    return None if value is None or not base else round(value / base, 2)


def _int(value: float | None) -> int | None:
    return None if value is None else round(value)


def _print(results: Sequence[dict[str, Any]], anchor: dict[str, Any], small: int, large: int) -> None:
    labels = [label for label, _ in COMPONENTS] + [OTHER]
    base_rss = anchor["bytes_per_job"].get("rss")
    base_large = anchor["rss_mib"][str(large)]
    rows = []
    for r in results:
        growth = r["bytes_per_job"]
        rows.append([
            r["backend"], r["rss_mib"][str(small)], r["rss_mib"][str(large)], _x(r["rss_mib"][str(large)], base_large),
            _int(growth.get("rss")), _x(growth.get("rss"), base_rss), _int(growth.get("heap")),
            *(_int(growth.get(label)) for label in labels),
        ])  # fmt: skip
    print_table(
        f"Memory a job adds, quiet jobs, from {small:,} to {large:,} jobs (bytes per job; anchor: APScheduler)",
        ["registry", f"RSS MiB at {small:,}", f"RSS MiB at {large:,}", "x APScheduler", "RSS B/job", "x APScheduler",
         "heap B/job", *labels],
        rows,
        left={0},
    )  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        sys.exit(_child(sys.argv[2:]))
    run_script(main)
