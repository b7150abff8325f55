"""Resharding at scale: 100 instances in several processes and one job of 10,000 items, on
ZooKeeper and etcd — the time from one more instance joining to every instance running
the new assignment, and again from it leaving cleanly; registry operations used.

Children (``_members``) each run N ``Scheduler`` instances (each its own session, counted
by a ``CountingRegistry``) of one every-second job; each child prints a line when one of
its instances first runs under a new epoch (``ran``), and its instances' summed round
trips twice a second (``trips``). The parent waits until every instance runs one epoch,
then starts the joiner (a child of one instance) at t0, and reads the assignment node:
*written* is when the first epoch naming the joiner is READY, *all running* when every
instance (joiner included) ran under it. Then the joiner shuts down cleanly and the same
is timed for the epoch without it. Registry operations in a window are the children's
round trips over it minus their steady rate (the fires' own marks) over the same time.

Usage: ``.venv/bin/python -m benchmarks.resharding_scale [--quick] [--instances 100]``
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import registry
from benchmarks.charts import Charts
from benchmarks.common import (
    BenchmarkError,
    base_parser,
    poll_until,
    print_table,
    run_script,
    servers,
    spawn_ready,
    stop_child,
    write_results,
)
from sharding.assignment import Assignment, AssignmentState
from sharding.layout import JobPaths

__all__ = ["NAME", "main", "render", "summary"]

NAME = "resharding_scale"
JOB = "scale"
PATHS = JobPaths(JOB)
TRIPS_EVERY = 0.5
#: the scale the project's performance goals name
TARGET_INSTANCES = 100
#: the goals ask for the figure, not a bound: this bound is ours
TARGET = "ours: every instance on the new assignment within 2 fire periods (2 s)"


# -- inside a child ---------------------------------------------------------------------------
def _members(url: str, first: int, count: int, total: int) -> int:
    """Run ``count`` instances; report first runs per epoch and round trips on stdout."""
    from registry.counting import CountingRegistry
    from scheduler import JobConfig, Scheduler, ShardingContext

    lock = threading.Lock()
    seen: dict[str, int] = {}
    #: ``ran`` lines of fires before ``ready``: printed right after it, for the parent reads
    #: the lines after ``ready`` only, and an epoch's first run is reported once
    held: list[str] | None = []

    def out(line: str) -> None:
        with lock:
            if held is not None:
                held.append(line)
                return
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def job_for(instance: str) -> Any:
        def run(ctx: ShardingContext) -> None:
            with lock:
                if seen.get(instance, -1) >= ctx.epoch:
                    return
                seen[instance] = ctx.epoch
            out(f"ran {instance} {ctx.epoch} {time.time():.4f}")

        return run

    counters: list[CountingRegistry] = []
    schedulers = []
    for n in range(first, first + count):
        counted = CountingRegistry(registry.connect(url))
        counters.append(counted)
        sched = Scheduler(
            counted, instance_id=f"10.9.{n // 250}.{n % 250}@-@{n}", max_workers=2, coordinator_threads=1
        )
        sched.add_job(
            JobConfig(name=JOB, cron="* * * * * ?", sharding_total_count=total), job_for(sched.instance_id)
        )
        schedulers.append(sched)
    for sched in schedulers:
        sched.start()
    with lock:
        sys.stdout.write("".join(f"{line}\n" for line in ["ready", *(held or [])]))
        sys.stdout.flush()
        held = None
    stop = threading.Event()

    def report() -> None:
        while not stop.wait(TRIPS_EVERY):
            out(f"trips {time.time():.4f} {sum(c.round_trips for c in counters)}")

    reporter = threading.Thread(target=report, daemon=True)
    reporter.start()
    sys.stdin.read()  # until the parent closes our stdin: then leave cleanly
    stop.set()
    for sched in schedulers:
        sched.shutdown(wait=True)
    for counter in counters:
        counter.close()
    return 0


# -- the parent -------------------------------------------------------------------------------
class _Fleet:
    """The children and what they report."""

    def __init__(self, url: str, total: int, workdir: Path) -> None:
        self.url = url
        self.total = total
        self.workdir = workdir
        self.lock = threading.Lock()
        #: instance -> epoch -> when it first ran under it
        self.ran: dict[str, dict[int, float]] = {}
        #: child index -> [(time, round trips)]
        self.trips: dict[int, list[tuple[float, int]]] = {}
        self.children: dict[int, subprocess.Popen[bytes]] = {}
        self._next = 0

    def spawn(self, count: int) -> int:
        index = len(self.children)
        argv = [sys.executable, "-m", "benchmarks.resharding_scale", "_members", self.url]
        argv += [str(self._next), str(count), str(self.total)]
        self._next += count
        child = spawn_ready(argv, self.workdir / f"child-{index}.log", timeout=120 + 4 * count)
        self.children[index] = child
        threading.Thread(target=self._read, args=(index, child), daemon=True).start()
        return index

    def _read(self, index: int, child: subprocess.Popen[bytes]) -> None:
        assert child.stdout is not None
        for raw in child.stdout:
            parts = raw.decode().split()
            with self.lock:
                if parts[:1] == ["ran"]:
                    self.ran.setdefault(parts[1], {})[int(parts[2])] = float(parts[3])
                elif parts[:1] == ["trips"]:
                    self.trips.setdefault(index, []).append((float(parts[1]), int(parts[2])))

    def stop(self, index: int) -> None:
        stop_child(self.children.pop(index), timeout=60)

    def close(self) -> None:
        for index in list(self.children):
            self.stop(index)

    def all_ran(self, instances: set[str], epoch: int) -> float | None:
        """When the last of ``instances`` first ran under ``epoch`` or later; None if not all have."""
        with self.lock:
            firsts = []
            for instance in instances:
                times = [t for e, t in self.ran.get(instance, {}).items() if e >= epoch]
                if not times:
                    return None
                firsts.append(min(times))
        return max(firsts)

    def instances(self) -> set[str]:
        with self.lock:
            return set(self.ran)

    def trips_at(self, moment: float) -> int:
        """The children's summed round trips at ``moment`` (linear between reports)."""
        total = 0.0
        with self.lock:
            for series in self.trips.values():
                before = [(t, n) for t, n in series if t <= moment]
                after = [(t, n) for t, n in series if t > moment]
                if before and after:
                    (t0, n0), (t1, n1) = before[-1], after[0]
                    total += n0 + (n1 - n0) * (moment - t0) / (t1 - t0)
                elif before:
                    total += before[-1][1]
        return round(total)


class _Epochs:
    """When each READY assignment appeared, and when each instance registered (watched from
    the start: a change is timed from the registry's events, not from when we looked)."""

    def __init__(self, observer: registry.RegistryCenter) -> None:
        self.lock = threading.Lock()
        self.seen: list[tuple[float, Assignment]] = []
        self.registered: dict[str, float] = {}
        self._watch = observer.watch(PATHS.assignment, self._on_event, initial=True)
        self._instances = observer.watch(PATHS.instances, self._on_instance, initial=True)

    def _on_instance(self, event: Any) -> None:
        if event.value is not None and event.path != PATHS.instances:
            with self.lock:
                self.registered.setdefault(event.path.rsplit("/", 1)[1], time.time())

    def _on_event(self, event: Any) -> None:
        if event.value is None:
            return
        try:
            assignment = Assignment.decode(PATHS.assignment, event.value)
        except ValueError:
            return
        if assignment.state is AssignmentState.READY:
            with self.lock:
                self.seen.append((time.time(), assignment))

    def first_over(self, instances: set[str], since: float) -> tuple[float, int] | None:
        with self.lock:
            for at, assignment in self.seen:
                if at >= since and set(assignment.instances) == instances:
                    return at, assignment.epoch
        return None

    def close(self) -> None:
        self._watch.cancel()
        self._instances.cancel()


def _change(fleet: _Fleet, epochs: _Epochs, expected: set[str], t0: float, steady: float) -> dict[str, Any]:
    """Time from ``t0`` to the first READY epoch over exactly ``expected``, and to all of
    them running under it; registry operations over that window beyond the steady rate,
    measured over the ``steady`` seconds before ``t0``."""
    if poll_until(lambda: epochs.first_over(expected, t0) is not None, 120, 0.01) is None:
        raise BenchmarkError(f"no READY assignment over the {len(expected)} instances within 120 s")
    found = epochs.first_over(expected, t0)
    assert found is not None
    written_at, epoch = found
    if poll_until(lambda: fleet.all_ran(expected, epoch) is not None, 120, 0.05) is None:
        raise BenchmarkError(f"not every instance ran epoch {epoch} within 120 s")
    all_running = fleet.all_ran(expected, epoch)
    assert all_running is not None
    time.sleep(2 * TRIPS_EVERY)  # the children's next counter reports cover the window's end
    duration = all_running - t0
    steady_rate = (fleet.trips_at(t0) - fleet.trips_at(t0 - steady)) / steady
    used = fleet.trips_at(all_running) - fleet.trips_at(t0)
    return {
        "epoch": epoch,
        "written_s": round(written_at - t0, 3),
        "all_running_s": round(duration, 3),
        "round_trips_window": used,
        "round_trips_beyond_steady": round(used - steady_rate * duration),
        "steady_round_trips_per_s": round(steady_rate, 1),
    }


def _diagnosis(observer: registry.RegistryCenter, workdir: Path) -> str:
    """What the registry and the children's logs say, for a run that did not finish."""
    lines = []
    try:
        raw = observer.get(PATHS.assignment)
        flag = observer.get(PATHS.necessary)
        leader = observer.get(PATHS.leader)
        online = observer.children(PATHS.instances)
        running = observer.children(PATHS.running)
        if raw is not None:
            assignment = Assignment.decode(PATHS.assignment, raw)
            lines.append(
                f"assignment: epoch {assignment.epoch}, {assignment.state.value}, "
                f"{len(assignment.instances)} instances"
            )
        lines.append(f"flag: {flag!r}; leader: {leader!r}; online: {len(online)}; running marks: {running}")
    except Exception as exc:  # a diagnosis must not hide the failure it explains
        lines.append(f"registry unreadable: {exc!r}")
    for log_file in sorted(workdir.glob("child-*.log")):
        tail = log_file.read_text(errors="replace").splitlines()[-8:]
        lines.append(f"--- {log_file.name}")
        lines.extend(tail)
    return "\n".join(lines)


def _bench(url: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    fleet = _Fleet(url, args.items, workdir)
    observer = registry.connect(url)
    epochs = _Epochs(observer)
    try:
        per_child = -(-args.instances // args.processes)
        remaining = args.instances
        while remaining:
            fleet.spawn(min(per_child, remaining))
            remaining -= min(per_child, remaining)
        if poll_until(lambda: len(fleet.instances()) >= args.instances, 120, 0.1) is None:
            raise BenchmarkError(f"only {len(fleet.instances())} of {args.instances} instances ran")
        base = fleet.instances()
        joins, leaves = [], []
        for _ in range(args.repeats):
            time.sleep(args.steady + 0.5)  # a steady window before the change, for its rate (not a condition)
            spawned = time.time()
            joiner = fleet.spawn(1)
            if poll_until(lambda: bool(fleet.instances() - base), 120, 0.05) is None:
                raise BenchmarkError("the joiner never ran")
            joined = fleet.instances() - base
            # the join is timed from the joiner's registration, not from its process start
            with epochs.lock:
                t0 = min((epochs.registered.get(i, spawned) for i in joined), default=spawned)
            joins.append(_change(fleet, epochs, base | joined, t0, args.steady))
            time.sleep(args.steady + 0.5)
            t1 = time.time()
            fleet.stop(joiner)
            leaves.append(_change(fleet, epochs, base, t1, args.steady))
            with fleet.lock:
                for instance in joined:
                    fleet.ran.pop(instance, None)
        return {
            "instances": args.instances,
            "items": args.items,
            "processes": args.processes,
            "joins": joins,
            "leaves": leaves,
        }
    except BenchmarkError as exc:
        raise BenchmarkError(f"{url}: {exc}\n{_diagnosis(observer, workdir)}") from None
    finally:
        fleet.close()
        epochs.close()
        observer.close()


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0] if __doc__ else NAME)
    parser.add_argument("--instances", type=int, default=None, help="instances (default 100, quick 10)")
    parser.add_argument("--items", type=int, default=None, help="items (default 10000, quick 100)")
    parser.add_argument("--processes", type=int, default=None, help="child processes (default 4, quick 2)")
    parser.add_argument("--repeats", type=int, default=None, help="joins and leaves (default 3, quick 1)")
    parser.add_argument(
        "--steady", type=float, default=None, help="s of steady state before each change (default 5, quick 2)"
    )
    parser.add_argument(
        "--backends", default="zookeeper,etcd", help="comma-separated, of zookeeper and etcd (default both)"
    )
    args = parser.parse_args(argv)
    args.instances = args.instances or (10 if args.quick else 100)
    args.items = args.items or (100 if args.quick else 10_000)
    args.processes = args.processes or (2 if args.quick else 4)
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.steady = args.steady or (2.0 if args.quick else 5.0)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = sorted(set(args.backends) - {"zookeeper", "etcd"})
    if unknown or not args.backends:
        parser.error(f"--backends: expected zookeeper and/or etcd, got {unknown or 'nothing'}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    if argv and argv[0] == "_members":
        raise SystemExit(_members(argv[1], int(argv[2]), int(argv[3]), int(argv[4])))
    args = parse_args(list(argv or []))
    results: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(prefix="shardjob-bench-reshard-") as tmp,
        servers(args, zookeeper="zookeeper" in args.backends, etcd="etcd" in args.backends) as live,
    ):
        for backend, address, scheme in (("zookeeper", live.zookeeper, "zk"), ("etcd", live.etcd, "etcd")):
            if address:
                url = f"{scheme}://{address}/bench-reshard-{time.time_ns()}"
                try:
                    results[backend] = {"completed": True, **_bench(url, args, Path(tmp))}
                except BenchmarkError as exc:
                    # a scale one backend cannot reach is a figure too, with what it showed
                    print(f"{backend}: did not converge: {exc}", file=sys.stderr)
                    error, _, diagnosis = str(exc).partition("\n")
                    results[backend] = {
                        "completed": False,
                        "instances": args.instances,
                        "items": args.items,
                        "processes": args.processes,
                        "error": error.split(": ", 1)[-1],
                        "diagnosis": diagnosis[:4000],
                    }
    rows = []
    for backend, figures in results.items():
        if not figures["completed"]:
            rows.append([backend, "-", "-", "-", "-", f"did not converge: {figures['error']}"])
            continue
        for what in ("joins", "leaves"):
            runs = figures[what]
            rows.append(
                [
                    backend,
                    what[:-1],
                    statistics.median(r["written_s"] for r in runs),
                    statistics.median(r["all_running_s"] for r in runs),
                    max(r["all_running_s"] for r in runs),
                    statistics.median(r["round_trips_beyond_steady"] for r in runs),
                ]
            )
    print_table(
        f"Resharding, {args.instances} instances in {args.processes} processes, {args.items:,} items, {args.repeats} runs",
        [
            "backend",
            "change",
            "written s (median)",
            "all running s (median)",
            "all running s (max)",
            "round trips beyond steady",
        ],
        rows,
    )
    payload = {
        "instances": args.instances,
        "items": args.items,
        "processes": args.processes,
        "results": results,
    }
    write_results(NAME, args, payload)
    return payload


# -- BENCHMARKS.md ----------------------------------------------------------------------------
def render(document: dict[str, Any], charts: Charts) -> str:
    """This benchmark's section of BENCHMARKS.md."""
    rows = []
    groups: dict[str, dict[str, float]] = {}
    failed: dict[str, dict[str, Any]] = {}
    for backend, figures in document["results"].items():
        if not figures.get("completed", True):
            failed[backend] = figures
            rows.append(f"| {backend} | join | 0 | did not converge: {figures['error']} | | | |")
            continue
        for what in ("joins", "leaves"):
            runs = figures[what]
            written = statistics.median(r["written_s"] for r in runs)
            running = statistics.median(r["all_running_s"] for r in runs)
            rows.append(
                f"| {backend} | {what[:-1]} | {len(runs)} | {written:.2f} | {running:.2f} | "
                f"{max(r['all_running_s'] for r in runs):.2f} | "
                f"{statistics.median(r['round_trips_beyond_steady'] for r in runs):,.0f} |"
            )
            groups[f"{backend} {what[:-1]}"] = {"assignment written": written, "all running it": running}
    chart = charts.bars("resharding", "from the change to the new assignment (median s)", groups, "s")
    return "\n".join(
        [
            "### Resharding at scale",
            "",
            f"{document['instances']} instances in {document['processes']} processes (each instance its own "
            f"session), one every-second job of {document['items']:,} items; one more instance joins, then leaves "
            "cleanly. *Written*: the first READY epoch over the new membership; *all running*: every instance "
            "ran a fire under it. Round trips: the children's counted calls over the window minus their "
            "steady rate (the fires' own marks).",
            "",
            "| backend | change | runs | written s | all running s (median) | max | round trips beyond steady |",
            "|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"![resharding]({chart})",
            "",
            "The leader writes one assignment node whatever the item count; everyone then starts at its "
            "next fire, so *all running* is about one fire period after *written*. At 100 instances this "
            "2-core machine is saturated in steady state (each child process near 40% of a core, the "
            "ZooKeeper server near 25%): on ZooKeeper each of the leader's registry round trips then took "
            "0.1-0.35 s (its logs, timed by step), and those few round trips are most of *written*.",
            *(
                []
                if document["instances"] >= TARGET_INSTANCES
                else [
                    "",
                    f"**This run used {document['instances']} instances, not the {TARGET_INSTANCES} the goals name.**",
                ]
            ),
            *_failures(failed),
        ]
    )


def _failures(failed: dict[str, dict[str, Any]]) -> list[str]:
    """What a backend that did not converge showed when the parent gave up."""
    lines: list[str] = []
    for backend, figures in failed.items():
        lines += [
            "",
            f"**{backend} did not converge** at {figures['instances']} instances: {figures['error']}. "
            "What the registry and the children's logs showed when the parent gave up:",
            "",
            "```",
            *[line[:240] for line in figures["diagnosis"].splitlines()[:12]],
            "```",
        ]
    return lines


def summary(document: dict[str, Any]) -> list[dict[str, str]]:
    rows = []
    for backend, figures in document["results"].items():
        if not figures.get("completed", True):
            rows.append(
                {
                    "figure": f"resharding, {figures['instances']} instances x {figures['items']:,} items, {backend}",
                    "target": TARGET,
                    "result": f"did not converge: {figures['error']}",
                    "met": "no",
                }
            )
            continue
        join = statistics.median(r["all_running_s"] for r in figures["joins"])
        leave = statistics.median(r["all_running_s"] for r in figures["leaves"])
        rows.append(
            {
                "figure": f"resharding, {figures['instances']} instances x {figures['items']:,} items, {backend}",
                "target": TARGET,
                "result": f"join {join:.2f} s, leave {leave:.2f} s to all running (median)",
                "met": "yes" if max(join, leave) <= 2.0 else "no",
            }
        )
    return rows


if __name__ == "__main__":
    run_script(main)
