"""``shardjob``: ``demo`` (no set-up, several instances in one process), ``worker`` (one
worker process for real deployments and docker-compose; ``--config`` runs the jobs of a
file, ``check`` validates one: ``scheduler.config_file``), ``history`` (the recorded item
runs, from the history database) and the operator commands of ``cli_ops`` (``jobs``,
``status``, ``servers``, ``trigger``, ``disable``, ``enable``, ``shutdown``, ``remove``,
``config``, ``dump``) and ``console`` (the web console, ``scheduler.console``).

Exit codes a script can rely on: ``exit_codes.ExitCode``.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import datetime
from types import FrameType
from typing import Any

import registry
from registry.backends import BackendUnavailable
from registry.errors import RegistryConnectionError, RegistryError, ShardJobError
from registry.release import VERSION
from scheduler.cli_format import format_table, iso_utc
from scheduler.cli_ops import COMMANDS as OPERATION_COMMANDS
from scheduler.cli_ops import add_operation_commands, run_operation
from scheduler.config import JobConfig, JobType
from scheduler.config_file import ConfigFileError, build_scheduler, load_worker_file, make_listener
from scheduler.console import ConsoleUnavailable
from scheduler.context import ShardingContext
from scheduler.exit_codes import ExitCode
from scheduler.gc_tuning import WORKER_GC_THRESHOLD, tune_gc
from scheduler.history.engine import HistoryUnavailable
from scheduler.http_job import HttpUnavailable
from scheduler.metrics import MetricsUnavailable
from scheduler.scheduler import Scheduler
from sharding.assignment import CorruptNodeError
from sharding.operations import NoSuchJob
from sharding.strategy_loader import import_object

__all__ = ["main"]

EXIT_OK, EXIT_ERROR, EXIT_USAGE = ExitCode.OK, ExitCode.ERROR, ExitCode.USAGE


# -- demo ---------------------------------------------------------------------------------
class _Board:
    """Collects who ran which item at each fire and prints one row per finished fire.

    It keeps the first ``limit`` fires only: the demo shuts everyone down after them, and
    a fire that starts during that shutdown is cut off by it, not by the hand-over it shows.
    Nor does it keep a fire due before every instance has started (``open``): the first
    instance may fire alone while the others still start, which is not the spread shown.
    """

    #: a row is printed once every item ran, or this many seconds after its fire time
    ROW_DEADLINE = 3.0

    def __init__(self, labels: dict[str, str], total: int, limit: int) -> None:
        self.labels = labels
        self.total = total
        self.limit = limit
        self._runs: dict[float, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
        self._printed: set[float] = set()
        self._changed = threading.Condition()
        self._since: float | None = None  # fires due before it are not kept (``open``)

    def open(self, since: float) -> None:
        """Keep the fires due from ``since`` on."""
        with self._changed:
            self._since = since

    def record(self, ctx: ShardingContext, instance_id: str) -> None:
        with self._changed:
            if self._since is None or ctx.fire_time < self._since:
                return
            if ctx.fire_time not in self._runs and len(self._runs) >= self.limit:
                return
            self._runs[ctx.fire_time][instance_id].append(ctx.sharding_item)
            self._changed.notify_all()

    def fires(self) -> int:
        with self._changed:
            return len(self._runs)

    def wait_fires(self, count: int, timeout: float) -> bool:
        """Wait until ``count`` fires began and the last of them finished (or timed out)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                self._print_finished(deadline=self.ROW_DEADLINE)
                if len(self._runs) >= count and self._finished(
                    sorted(self._runs)[count - 1], self.ROW_DEADLINE
                ):
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(min(remaining, 0.2))

    def _finished(self, fire: float, deadline: float) -> bool:
        ran = sum(len(items) for items in self._runs[fire].values())
        return ran >= self.total or time.time() - fire >= deadline

    def _print_finished(self, deadline: float) -> None:
        for fire in sorted(self._runs):
            if fire in self._printed:
                continue
            if not self._finished(fire, deadline):
                break  # rows in fire order: a later one waits for this one
            self._printed.add(fire)
            row = self._runs[fire]
            cells = []
            for instance_id in self.labels:
                items = sorted(row.get(instance_id, []))
                cells.append(f"{','.join(map(str, items)) or '-':<14}")
            stamp = datetime.fromtimestamp(fire).strftime("%H:%M:%S")
            print(f"  {stamp}   " + "  ".join(cells), flush=True)

    def flush(self) -> None:
        """Print every remaining row (once no run is in flight any more)."""
        with self._changed:
            self._print_finished(deadline=0.0)

    def summary(self) -> tuple[int, int, int]:
        """(fires, fires where every item ran exactly once, item runs that were doubled)."""
        with self._changed:
            complete = doubled = 0
            for row in self._runs.values():
                ran = [item for items in row.values() for item in items]
                doubled += len(ran) - len(set(ran))
                complete += sorted(ran) == list(range(self.total))
            return len(self._runs), complete, doubled


def _demo(args: argparse.Namespace) -> int:
    url = args.registry or f"memory://shardjob-demo-{int(time.time())}?session_timeout=3"
    registry.parse_url(url)
    total, count = args.items, args.instances
    if count < 2:
        raise ValueError(f"--instances must be >= 2 (one of them leaves midway), got {count}")
    if total < 1:
        raise ValueError(f"--items must be >= 1, got {total}")
    if args.fires < 1:
        raise ValueError(f"--fires must be >= 1, got {args.fires}")
    stop_console: Callable[[], None] | None = None
    if args.console:
        from scheduler.console.serve import start_side_console

        stop_console = start_side_console(url, args.console)
    schedulers = [Scheduler(url, max_workers=4, coordinator_threads=2) for _ in range(count)]
    labels = {s.instance_id: chr(ord("A") + i) for i, s in enumerate(schedulers)}
    board = _Board(labels, total, limit=2 * args.fires)
    print(f"shardjob demo: job 'demo', {total} items, fires every second, registry {registry.parse_url(url)}")
    for label_id, label in labels.items():
        print(f"  instance {label} = {label_id}")
    for sched in schedulers:
        instance_id = sched.instance_id

        def work(ctx: ShardingContext, instance_id: str = instance_id) -> None:
            board.record(ctx, instance_id)

        sched.add_job(
            JobConfig(
                name="demo",
                cron="* * * * * ?",
                sharding_total_count=total,
                sharding_item_parameters=",".join(f"{i}=item-{i}" for i in range(total)),
            ),
            work,
        )
    print("\n  time       " + "  ".join(f"{label:<14}" for label in labels.values()))
    try:
        for sched in schedulers:
            sched.start()
        board.open(time.time())
        if not board.wait_fires(args.fires, args.fires * 3 + 20):
            print("demo: fires did not arrive in time", file=sys.stderr)
            return EXIT_ERROR
        leaving = schedulers[-1]
        print(
            f"\n  -- instance {labels[leaving.instance_id]} shuts down cleanly: its items move at once --\n"
        )
        leaving.shutdown(wait=True)
        if not board.wait_fires(2 * args.fires, args.fires * 3 + 20):
            print("demo: fires did not arrive in time after the shutdown", file=sys.stderr)
            return EXIT_ERROR
    finally:
        for sched in schedulers:
            sched.shutdown(wait=True)
        board.flush()
        if stop_console is not None:
            stop_console()
    fires, complete, doubled = board.summary()
    print(
        f"\ndemo done: {fires} fires, {complete} with every item run exactly once, {doubled} item runs doubled."
    )
    if complete < fires:
        print(
            "  (a fire racing the hand-over skips the leaver's items for that one fire; failover=True covers them)"
        )
    return EXIT_OK if doubled == 0 else EXIT_ERROR


# -- worker -------------------------------------------------------------------------------
def _load_job(spec: str) -> Any:
    target = import_object(spec, "--job")
    return target() if isinstance(target, type) else target


def parse_props(assignments: Sequence[str]) -> dict[str, str]:
    """``--prop KEY=VALUE`` (repeated) -> ``{KEY: VALUE}``; the value may hold ``=``.
    ``ValueError`` naming a malformed or repeated one."""
    props: dict[str, str] = {}
    for assignment in assignments:
        key, sep, value = assignment.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--prop {assignment!r}: expected KEY=VALUE")
        if key in props:
            raise ValueError(f"--prop {key}: given twice")
        props[key] = value
    return props


def _worker(args: argparse.Namespace) -> int:
    tune_gc(args.gc_threshold)  # the worker owns its process (scheduler/gc_tuning.py)
    if args.config is not None:
        return _worker_from_file(args)
    if args.registry is None:
        raise ValueError("--registry is required (or --config FILE)")
    job_type = JobType[args.job_type.upper()]
    codeless = job_type in (JobType.SCRIPT, JobType.HTTP)  # nothing to import: no --job
    target = None if codeless else _load_job(args.job) if args.job else None
    if target is None and not codeless:
        raise ValueError("--job is required unless --job-type script or http")
    name = args.name or (args.job.partition(":")[2].split(".")[-1] if args.job else "")
    if not name:
        kind = "an http" if job_type is JobType.HTTP else "a script"
        raise ValueError(f"--name is required for {kind} job (there is no function to name it after)")
    config = JobConfig(
        name=name,
        cron=args.cron,
        time_zone=args.time_zone,
        sharding_total_count=args.total,
        sharding_item_parameters=args.item_parameters,
        job_parameter=args.job_parameter,
        failover=args.failover,
        misfire=not args.no_misfire,
        monitor_execution=not args.no_monitor_execution,
        sharding_strategy=args.strategy,
        max_time_diff_seconds=args.max_time_diff_seconds,
        reconcile_interval_minutes=args.reconcile_interval_minutes,
        overwrite=args.overwrite,
        disabled=args.disabled,
        job_type=job_type,
        script_command_line=args.script or "",
        streaming_process=args.streaming,
        props=parse_props(args.prop),
    )
    listeners = [make_listener(spec, "--listener") for spec in args.listener]
    sched = Scheduler(
        args.registry, instance_id=args.instance_id, max_workers=args.max_workers, history=args.history
    )
    sched.add_job(config, target, listeners=listeners)
    return _run_worker(sched, args.http)


#: ``worker`` options a --config file also sets (the command line's win), and the top-level
#: ones; every other worker option declares the one job of a command line: not with --config
_NOT_JOB_OPTIONS = ("command", "verbose", "config", "instance_id", "max_workers", "history", "http", "gc_threshold")


def _worker_from_file(args: argparse.Namespace) -> int:
    defaults = build_parser().parse_args(["worker", "--config", args.config])
    given = [
        "--" + name.replace("_", "-")
        for name, value in vars(args).items()
        if name not in _NOT_JOB_OPTIONS and value != getattr(defaults, name, value)
    ]
    if given:
        raise ValueError(
            f"--config: {', '.join(given)} cannot go with it (with --config the registry and the "
            "jobs are declared in the file)"
        )
    try:
        worker_file = load_worker_file(args.config)
    except ConfigFileError as exc:
        for line in exc.errors:
            print(f"shardjob: {line}", file=sys.stderr)
        return EXIT_USAGE
    sched = build_scheduler(
        worker_file, instance_id=args.instance_id, max_workers=args.max_workers, history=args.history
    )
    return _run_worker(sched, args.http or worker_file.http)


def _run_worker(sched: Scheduler, http: str | None) -> int:
    """Start ``sched`` and run it until SIGTERM or SIGINT, then shut down gracefully."""
    endpoint = sched.serve_http(http) if http else None
    # Hazard: a signal handler runs on the main thread between two bytecodes, wherever that
    # thread is, even inside a lock: ``threading.Event.set`` here deadlocked when the signal
    # landed as ``Event.wait`` took its lock back, the worker then hung until SIGKILL. The
    # handler sets a plain flag, which takes no lock, and the main loop polls it.
    stop_requested = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    sched.start()
    failed = sched.failed_jobs
    if failed:
        # a worker that runs fewer jobs than it was given says so and stops: a fleet
        # quietly short of a job is worse than a worker that does not start
        sched.shutdown(wait=False)
        if endpoint is not None:
            endpoint.close()
        for name, exc in failed.items():
            print(f"shardjob: job {name!r} could not start: {exc}", file=sys.stderr)
        return EXIT_ERROR
    names = sched.jobs
    running = f"job {names[0]!r}" if len(names) == 1 else f"{len(names)} jobs: {', '.join(map(repr, names))}"
    print(f"worker {sched.instance_id} running {running}; SIGTERM stops it gracefully", flush=True)
    if endpoint is not None:
        print(f"serving /metrics /healthz /readyz /dump at {endpoint.url}", flush=True)
    # Hazard: the kernel may deliver SIGTERM to any thread (grpc's, kazoo's); the handler
    # then runs only when the main thread next wakes, and a wait with no timeout never
    # wakes. Waking each half second lets the handler run.
    while not stop_requested:
        time.sleep(0.5)
    sched.shutdown(wait=True)
    if endpoint is not None:
        endpoint.close()
    print(f"worker {sched.instance_id} stopped", flush=True)
    return EXIT_OK


def _check(args: argparse.Namespace) -> int:
    try:
        worker_file = load_worker_file(args.config)
    except ConfigFileError as exc:
        for line in exc.errors:
            print(f"shardjob: {line}", file=sys.stderr)
        return EXIT_USAGE
    for line in worker_file.describe():
        print(line)
    return EXIT_OK


# -- history --------------------------------------------------------------------------------
def parse_since(text: str, now: float | None = None) -> float:
    """``30m``, ``2h``, ``7d``, ``90s`` ago, or an ISO 8601 time (UTC when no zone) -> epoch."""
    from datetime import timezone

    now = time.time() if now is None else now
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    value = text.strip()
    if value[:-1].replace(".", "", 1).isdigit() and value[-1:] in units:
        return now - float(value[:-1]) * units[value[-1]]
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"--since {text!r}: expected 30m, 2h, 7d or an ISO time such as 2026-01-31T02:00") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return stamp.timestamp()


def _history(args: argparse.Namespace) -> int:
    import json

    from scheduler.history import HistoryReader

    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}")
    if args.trace and (args.item is not None or args.failed):
        raise ValueError("--trace lists state changes of whole runs: --item and --failed do not apply")
    since = parse_since(args.since) if args.since else None
    try:
        from sqlalchemy.exc import SQLAlchemyError
    except ImportError:
        raise HistoryUnavailable("shardjob history needs SQLAlchemy: pip install 'shardjob[history]'") from None
    table: list[tuple[str, ...]]
    try:
        with HistoryReader(args.history) as reader:
            if args.trace:
                traces = reader.status_trace(args.job, since=since, limit=args.limit)
                found: list[Any] = list(traces)
                table = [("at (UTC)", "fire (UTC)", "job", "items", "source", "instance", "state", "message")]
                table += [
                    (
                        iso_utc(t.creation_time)[:23],
                        iso_utc(t.fire_time)[:19] if t.fire_time else "",
                        t.job_name,
                        t.sharding_items,
                        t.source,
                        t.instance_id,
                        t.state,
                        t.message or "",
                    )
                    for t in traces
                ]
            else:
                runs = reader.executions(args.job, item=args.item, since=since, failed=args.failed, limit=args.limit)
                found = list(runs)
                table = [("fire (UTC)", "started", "job", "item", "source", "instance", "secs", "result")]
                table += [
                    (
                        iso_utc(r.fire_time)[:19],
                        iso_utc(r.start_time)[11:23],
                        r.job_name,
                        str(r.sharding_item),
                        r.source,
                        r.instance_id,
                        "" if r.end_time is None else f"{r.end_time - r.start_time:.3f}",
                        "ok" if r.success else (r.failure_cause or r.outcome),
                    )
                    for r in runs
                ]
    except SQLAlchemyError as exc:
        print(f"shardjob: history database error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        print(json.dumps([row.to_json() for row in found], indent=2))
        return EXIT_OK
    print(format_table(table[0], table[1:]))
    if not found:
        print("(nothing recorded)")
    return EXIT_OK


# -- entry point ----------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardjob",
        description="Distributed, sharded cron jobs on ZooKeeper, etcd or an in-process registry.",
        epilog="Exit codes: 0 done, 1 error, 2 bad usage or configuration, 3 registry unreachable, "
        "4 no such job.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO (default: warnings only)")
    parser.add_argument("--version", action="version", version=f"shardjob {VERSION}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="run several instances in one process and watch the items move",
        description="Run INSTANCES schedulers of one job in this process, print who runs which item at "
        "each fire, shut one down cleanly midway and show its items move to the others.",
    )
    demo.add_argument(
        "--registry", metavar="URL", help="registry URL (default: an in-process memory:// store)"
    )
    demo.add_argument("--instances", type=int, default=3, metavar="N", help="instances to start (default 3)")
    demo.add_argument("--items", type=int, default=6, metavar="N", help="sharding items (default 6)")
    demo.add_argument(
        "--fires", type=int, default=4, metavar="N", help="fires before and after the shutdown (default 4)"
    )
    demo.add_argument(
        "--console",
        metavar="HOST:PORT",
        help="also serve the web console on HOST:PORT (e.g. 127.0.0.1:8080) over the demo's registry "
        "(needs shardjob[console]; use --fires 60 to have time to watch)",
    )

    worker = commands.add_parser(
        "worker",
        help="run one worker process for a job (or for every job of a --config file)",
        description="Run one instance of a job (or of every job a --config file declares) until "
        "SIGTERM or SIGINT, then shut down gracefully: running items finish, this instance's nodes "
        "are removed and its items move at once.",
    )
    worker.add_argument(
        "--config",
        metavar="FILE",
        help="run every job of this TOML file (registry and jobs in the file; --instance-id, "
        "--max-workers, --history and --http override its options); see shardjob check",
    )
    worker.add_argument(
        "--registry", metavar="URL", help="zk://..., etcd://... or memory://... (required unless --config)"
    )
    worker.add_argument(
        "--job",
        metavar="MODULE:FUNC",
        help="the job: a function of one ShardingContext (or a dataflow object/class)",
    )
    worker.add_argument("--name", help="job name (default: the function's name)")
    worker.add_argument(
        "--cron", help="Unix (5 fields) or Quartz (6-7, seconds first) cron; omit for a one-off job"
    )
    worker.add_argument("--time-zone", help="IANA name (Asia/Shanghai) or offset (GMT+08:00)")
    worker.add_argument("--total", type=int, default=1, metavar="N", help="sharding_total_count (default 1)")
    worker.add_argument("--item-parameters", default="", metavar="'0=a,1=b'", help="sharding_item_parameters")
    worker.add_argument("--job-parameter", default="", help="job_parameter")
    worker.add_argument(
        "--strategy", default="AVG_ALLOCATION", help="sharding strategy (default AVG_ALLOCATION)"
    )
    worker.add_argument(
        "--failover", action="store_true", help="run a crashed instance's items elsewhere at once"
    )
    worker.add_argument(
        "--no-misfire", action="store_true", help="skip fires that find the job still running"
    )
    worker.add_argument(
        "--no-monitor-execution", action="store_true", help="a resharding does not wait for running items"
    )
    worker.add_argument(
        "--max-time-diff-seconds", type=int, default=-1, metavar="S", help="max clock skew (-1: off)"
    )
    worker.add_argument(
        "--reconcile-interval-minutes", type=float, default=10, metavar="M", help="self-repair interval"
    )
    worker.add_argument("--overwrite", action="store_true", help="local config replaces the registry's")
    worker.add_argument("--disabled", action="store_true", help="start with this server disabled")
    worker.add_argument("--job-type", default="simple", choices=["simple", "dataflow", "script", "http"])
    worker.add_argument(
        "--prop",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a job prop, repeatable; an http job's request: http.uri, http.method, http.data, ...",
    )
    worker.add_argument(
        "--script", metavar="COMMAND", help="script job command line (context appended as JSON)"
    )
    worker.add_argument(
        "--streaming", action="store_true", help="dataflow: fetch again until nothing is left"
    )
    worker.add_argument("--instance-id", help="instance id (default {ip}@-@{pid})")
    worker.add_argument("--max-workers", type=int, metavar="N", help="worker threads (default 2 x cores)")
    worker.add_argument(
        "--gc-threshold",
        type=int,
        default=WORKER_GC_THRESHOLD,
        metavar="N",
        help=f"the garbage collector's first threshold for this process (default {WORKER_GC_THRESHOLD:,}; "
        "0 keeps Python's 700): many jobs' fires otherwise keep the collector busy",
    )
    worker.add_argument(
        "--history", metavar="DB_URL", help="record every run: sqlite:///path or postgresql://..."
    )
    worker.add_argument(
        "--http", metavar="HOST:PORT", help="serve /metrics /healthz /readyz /dump (e.g. 127.0.0.1:9100)"
    )
    worker.add_argument(
        "--listener",
        action="append",
        default=[],
        metavar="MODULE:ATTR",
        help="a listener of the job (repeatable): a JobListener instance, or a class or "
        "zero-argument factory called once to make one",
    )

    check = commands.add_parser(
        "check",
        help="validate a worker --config file without running it",
        description="Parse FILE, substitute its ${VAR}s, build every job's config and import every "
        "target, listener and error handler, as worker --config does, without connecting to the "
        "registry. Prints one line per job; exit 0 when the file is valid, 2 with every error "
        "(file, job and field named) on stderr when not.",
    )
    check.add_argument("--config", required=True, metavar="FILE", help="the TOML file of worker --config")

    history = commands.add_parser(
        "history",
        help="show recorded item runs, newest first",
        description="Read the run history a worker wrote with --history DB_URL.",
    )
    history.add_argument("job", nargs="?", help="only this job")
    history.add_argument("--history", required=True, metavar="DB_URL", help="sqlite:///path or postgresql://...")
    history.add_argument("--item", type=int, metavar="N", help="only this sharding item")
    history.add_argument("--since", metavar="WHEN", help="30m, 2h, 7d ago, or an ISO time (UTC)")
    history.add_argument("--failed", action="store_true", help="only failed runs")
    history.add_argument("--limit", type=int, default=50, metavar="N", help="at most N rows (default 50)")
    history.add_argument("--json", action="store_true", help="a JSON list of objects instead of a table")
    history.add_argument(
        "--trace",
        action="store_true",
        help="state changes of runs instead (RUNNING, FINISHED, ERROR, and fires not run: "
        "OWED, MISFIRE, SKIPPED, FENCED_OUT; RESHARDED)",
    )
    add_operation_commands(commands)
    from scheduler.console.serve import add_console_command

    add_console_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        if args.command == "demo":
            return _demo(args)
        if args.command == "history":
            return _history(args)
        if args.command == "check":
            return _check(args)
        if args.command == "console":
            from scheduler.console.serve import run_console

            return run_console(args)
        if args.command in OPERATION_COMMANDS:
            return run_operation(args)
        return _worker(args)
    except NoSuchJob as exc:
        print(f"shardjob: {exc}", file=sys.stderr)
        return ExitCode.NO_SUCH_JOB
    except CorruptNodeError as exc:  # a ValueError, but the registry's fault, not the caller's
        print(f"shardjob: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except ValueError as exc:
        print(f"shardjob: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (BackendUnavailable, HistoryUnavailable, MetricsUnavailable, ConsoleUnavailable, HttpUnavailable) as exc:
        print(f"shardjob: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RegistryConnectionError as exc:
        print(f"shardjob: registry unreachable: {exc}", file=sys.stderr)
        return ExitCode.UNREACHABLE
    except RegistryError as exc:
        print(f"shardjob: registry error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except (ShardJobError, TimeoutError) as exc:
        print(f"shardjob: {exc}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
