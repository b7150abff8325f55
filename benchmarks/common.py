"""What every benchmark shares: the command line (``--quick``, ``--out``, ``--zk``,
``--etcd``), real servers in a temp dir, child processes that say ``ready``, percentiles,
a printed table and the JSON result file.

Invariants: a server or child started here is stopped before the benchmark returns, even
when it fails; every wait is bounded; a result file always records whether it came from a
quick run and on what machine, so quick figures are never mistaken for real ones.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import math
import os
import platform
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "REPO_ROOT",
    "RESULTS_DIR",
    "BenchmarkError",
    "Servers",
    "base_parser",
    "child_result",
    "delete_namespace",
    "first_host",
    "git_revision",
    "machine_info",
    "percentile",
    "poll_until",
    "print_table",
    "run_child",
    "run_script",
    "servers",
    "spawn_ready",
    "stop_child",
    "summarize",
    "versions",
    "write_results",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"

ZK_ENV = "SHARDJOB_TEST_ZK"
ETCD_ENV = "SHARDJOB_TEST_ETCD"


class BenchmarkError(RuntimeError):
    """A benchmark could not measure (a server or child did not come up, a wait ran out)."""


class ChildOverran(BenchmarkError):
    """A child of ``run_child`` ran over its bound (killed): a benchmark for which that is a
    figure (how far it got) catches this one."""


# -- command line ----------------------------------------------------------------------------
def add_gc_threshold(parser: argparse.ArgumentParser, who: str) -> None:
    """``--gc-threshold N``: the garbage collector's first threshold in ``who`` (0, the
    default: Python's), so a run can measure a process as ``shardjob worker`` sets it."""
    from scheduler.gc_tuning import WORKER_GC_THRESHOLD

    parser.add_argument(
        "--gc-threshold",
        type=int,
        default=0,
        metavar="N",
        help=f"the garbage collector's first threshold in {who} (default 0: Python's 700; "
        f"shardjob worker sets {WORKER_GC_THRESHOLD})",
    )


def base_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="a few seconds; figures not meaningful")
    parser.set_defaults(revision=git_revision())
    parser.add_argument(
        "--out", type=Path, default=RESULTS_DIR, help=f"folder for NAME.json (default {RESULTS_DIR})"
    )
    parser.add_argument(
        "--zk",
        default=os.environ.get(ZK_ENV) or None,
        metavar="HOST:PORT",
        help=f"use this ZooKeeper instead of starting one (default ${ZK_ENV})",
    )
    parser.add_argument(
        "--etcd",
        default=os.environ.get(ETCD_ENV) or None,
        metavar="HOST:PORT",
        help=f"use this etcd instead of starting one (default ${ETCD_ENV})",
    )
    return parser


def run_script(main: Callable[[list[str]], object]) -> None:
    """``if __name__ == "__main__"`` of every script: quiet logging, then ``main``."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    main(sys.argv[1:])


# -- statistics ---------------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100), linear between closest ranks; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(values: Sequence[float], digits: int = 3) -> dict[str, float | int | None]:
    """n, p50, p90, p99 and max of ``values``, rounded; None for an empty sample."""
    if not values:
        return {"n": 0, "p50": None, "p90": None, "p99": None, "max": None}
    return {
        "n": len(values),
        "p50": round(percentile(values, 50), digits),
        "p90": round(percentile(values, 90), digits),
        "p99": round(percentile(values, 99), digits),
        "max": round(max(values), digits),
    }


def poll_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.005) -> float | None:
    """Poll ``predicate``; the ``time.monotonic()`` at which it first held, None on timeout.

    The interval bounds the measurement error of a benchmark that times an event it can
    only observe (another process's death seen through the registry)."""
    deadline = time.monotonic() + timeout
    while True:
        now = time.monotonic()
        if predicate():
            return now
        if now >= deadline:
            return None
        time.sleep(interval)


# -- output -----------------------------------------------------------------------------------
def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


def _line(cells: Sequence[str], widths: Sequence[int], left: Collection[int]) -> str:
    """Columns in ``left`` (labels, notes) left-aligned, the others (figures) right-aligned."""
    return "  ".join(
        c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
    ).rstrip()


def print_table(
    title: str, headers: Sequence[str], rows: Sequence[Sequence[object]], left: Collection[int] = (0,)
) -> None:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    print(f"\n{title}")
    print(_line(headers, widths, left))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print(_line(row, widths, left))
    sys.stdout.flush()


def _first_line(path: str, prefix: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                if line.startswith(prefix):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def status_mib(field: str) -> float | None:
    """A size from this process's ``/proc/self/status`` in MiB: ``VmRSS`` (resident now) or
    ``VmHWM`` (its peak). Both are this process's own since its exec, unlike ``getrusage``'s
    ``ru_maxrss``, which Linux carries over from the parent through fork and exec."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(f"{field}:"):
                    return round(int(line.split()[1]) / 1024.0, 1)
    except OSError:
        pass
    return None


def machine_info() -> dict[str, Any]:
    memory = _first_line("/proc/meminfo", "MemTotal")
    return {
        "cpus": os.cpu_count(),
        "cpu_model": _first_line("/proc/cpuinfo", "model name"),
        "memory_gib": round(int(memory.split()[0]) / 2**20, 1) if memory else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


#: the distributions whose versions a figure depends on (None: not installed)
_PACKAGES = ("kazoo", "etcd-sdk-python", "APScheduler", "tooz", "matplotlib")


def versions() -> dict[str, str | None]:
    """Versions of the clients, the anchors and the servers (Debian's, as the tests use)."""
    from importlib import metadata

    found: dict[str, str | None] = {}
    for package in _PACKAGES:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    jars = sorted(Path("/usr/share/java").glob("zookeeper-[0-9]*.jar"))
    found["ZooKeeper server"] = (
        jars[-1].name.removeprefix("zookeeper-").removesuffix(".jar") if jars else None
    )
    try:
        out = subprocess.run(["etcd", "--version"], capture_output=True, text=True, timeout=10).stdout
        found["etcd server"] = out.split("Version:", 1)[1].split()[0] if "Version:" in out else None
    except (OSError, subprocess.TimeoutExpired):
        found["etcd server"] = None
    return found


def git_revision() -> dict[str, Any] | None:
    """The commit measured and whether the work tree differed from it (others edit the
    code while benchmarks run: a figure is only meaningful with its revision)."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        )
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if commit.returncode != 0:
        return None
    modified = [line[3:] for line in status.stdout.splitlines() if line.strip()]
    return {"commit": commit.stdout.strip(), "modified_files": modified}


def write_results(name: str, args: argparse.Namespace, payload: dict[str, Any]) -> Path:
    """Write ``{out}/{name}.json`` with the run's mode and machine; returns its path."""
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": name,
        "quick": bool(args.quick),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "versions": versions(),
        # taken when the arguments were parsed: the code the run started with
        "git": getattr(args, "revision", None) or git_revision(),
        **payload,
    }
    path = out / f"{name}.json"
    path.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n")
    print(f"\nwrote {path}")
    return path


# -- servers ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Servers:
    """``host:port[,host:port...]`` of each server, None when not asked for."""

    zookeeper: str | None
    etcd: str | None


def first_host(address: str) -> tuple[str, int]:
    """The first ``host:port`` of a list (the raw anchor clients talk to one server)."""
    host, _, port = address.split(",")[0].strip().rpartition(":")
    return host, int(port)


@contextlib.contextmanager
def servers(args: argparse.Namespace, *, zookeeper: bool = True, etcd: bool = True) -> Iterator[Servers]:
    """The servers given by ``--zk``/``--etcd``, or ones started now in a temp dir (both
    launched before waiting, to overlap their start-up) and stopped on exit."""
    from tests.servers.etcd import EtcdServer
    from tests.servers.process import ServerProcess
    from tests.servers.zookeeper import DEFAULT_HEAP, ZooKeeperServer

    with tempfile.TemporaryDirectory(prefix="shardjob-bench-") as tmp:
        started: list[ServerProcess] = []
        zk: ZooKeeperServer | None = None
        etcd_server: EtcdServer | None = None
        try:
            if zookeeper and not args.zk:
                zk = ZooKeeperServer(Path(tmp) / "zookeeper", heap=DEFAULT_HEAP)
                zk.launch()
                started.append(zk)
            if etcd and not args.etcd:
                # compacted as docs/registry.md asks of a deployment (1 minute: the
                # retention it gives for 10,000 every-second jobs)
                etcd_server = EtcdServer(
                    Path(tmp) / "etcd",
                    extra_args=["--auto-compaction-mode=periodic", "--auto-compaction-retention=1m"],
                )
                etcd_server.launch()
                started.append(etcd_server)
            # the readiness probes' first attempts hit a port not yet open; kazoo logs
            # each as a warning that says nothing about the benchmark
            probe_log = logging.getLogger("kazoo.client")
            level = probe_log.level
            probe_log.setLevel(logging.ERROR)
            try:
                for server in started:
                    server.wait_ready(60)
            finally:
                probe_log.setLevel(level)
            # read once they serve: a server whose port was taken is relaunched on another
            zk_address = zk.address if zk is not None else args.zk if zookeeper else None
            etcd_address = etcd_server.address if etcd_server is not None else args.etcd if etcd else None
            yield Servers(zk_address, etcd_address)
        finally:
            for server in started:
                server.stop()


# -- child processes ------------------------------------------------------------------------
def spawn_ready(argv: Sequence[str], log_path: Path, timeout: float = 30.0) -> subprocess.Popen[bytes]:
    """Start ``argv`` (from the repository root) and wait until it prints ``ready``.

    Its stderr goes to ``log_path``; its stdin stays open (a child that reads it learns of
    our death by EOF). On timeout or early exit it is killed and ``BenchmarkError`` names it.

    Invariant: nothing after the ``ready`` line is consumed here. Its stdout is read a byte at
    a time up to that line's end, so whatever the child prints next, even in the same
    write, is left in the pipe for the caller's reader.
    """
    log = open(log_path, "ab")  # noqa: SIM115 - the child keeps writing after we return
    try:
        proc = subprocess.Popen(
            list(argv),
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
        )
    finally:
        log.close()
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    line = b""
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while line != b"ready\n":
            remaining = deadline - time.monotonic()
            if remaining <= 0 or proc.poll() is not None:
                stop_child(proc)
                tail = log_path.read_text(errors="replace")[-2000:]
                state = "exited" if remaining > 0 else f"not ready after {timeout:g}s"
                raise BenchmarkError(f"child {' '.join(argv[:4])}... {state}; stderr:\n{tail}")
            if selector.select(min(remaining, 0.2)):
                byte = os.read(proc.stdout.fileno(), 1)
                if not byte:
                    proc.wait(min(max(remaining, 0.1), 5.0))
                    continue
                line = b"" if line.endswith(b"\n") else line
                line += byte
    return proc


def ask(child: subprocess.Popen[bytes], request: str) -> str:
    """Send ``request`` (one line) to a child started by ``spawn_ready`` and return its
    one-line answer; ``BenchmarkError`` if the child exited instead."""
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(f"{request}\n".encode())
    child.stdin.flush()
    line = b""
    while not line.strip():  # blank lines a child's "ready" print may have left
        line = child.stdout.readline()
        if not line:
            raise BenchmarkError(f"child {child.args!r} exited before answering {request!r}")
    return line.decode().strip()


def child_result(returncode: int, result_file: Path, log_file: Path, what: str) -> dict[str, Any]:
    """The JSON a child process wrote to ``result_file``; ``BenchmarkError`` naming ``what``
    with the tail of its log when it failed or wrote nothing."""
    if returncode != 0 or not result_file.exists():
        tail = log_file.read_text(errors="replace")[-3000:]
        raise BenchmarkError(f"{what} failed ({returncode}):\n{tail}")
    result: dict[str, Any] = json.loads(result_file.read_text())
    return result


def run_child(argv: Sequence[str], workdir: Path, stem: str, bound: float, what: str) -> dict[str, Any]:
    """Run a child script (from the repository root) that writes its JSON result to
    ``workdir/stem.json`` (its ``--result`` argument), its output to ``workdir/stem.log``;
    the result, or ``BenchmarkError`` naming ``what`` with the log's tail when it failed
    (``ChildOverran`` when it ran over ``bound`` seconds and was killed)."""
    result_file, log_file = workdir / f"{stem}.json", workdir / f"{stem}.log"
    with open(log_file, "wb") as log:
        try:
            proc = subprocess.run(
                [*argv, "--result", str(result_file)],
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=bound,
            )
        except subprocess.TimeoutExpired:
            tail = log_file.read_text(errors="replace")[-3000:]
            raise ChildOverran(f"{what} took over {bound:g} s:\n{tail}") from None
    return child_result(proc.returncode, result_file, log_file, what)


def delete_namespace(server: str, namespace: str) -> float:
    """Delete an ended child's namespace on ``server`` (a registry URL without one);
    returns the seconds it took.

    Hazard: a server keeps an ended child's jobs. Left in place, the third 10,000-job
    child of ``scheduler_lateness`` found 23,000 earlier jobs beside its own, so later
    children measured a larger registry than earlier ones, and a session's etcd grown to 1.2 million keys ran
    89-94 % of fires where a fresh one ran 98 %. Deleted, every child finds its server
    holding only its own jobs. Call it between children, outside every window (on
    ZooKeeper it takes about 16 s at 10,000 jobs).
    """
    import registry

    began = time.monotonic()
    with registry.connect(server) as root:
        root.delete(namespace)
    return round(time.monotonic() - began, 2)


def stop_child(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """Close its stdin (our child scripts leave cleanly on EOF), then SIGTERM, then SIGKILL."""
    if proc.poll() is None:
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.close()
        try:
            proc.wait(min(timeout, 2.0))
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
