"""The ``shardjob`` command line, run as a user runs it: in a subprocess, judged by its exit
code and output (0 done, 1 error, 2 bad usage or configuration, 3 registry unreachable).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pytest

import registry
from scheduler import JobConfig
from sharding.layout import JobPaths
from tests.conftest import close_harness, make_harness
from tests.harness import Harness
from tests.scenarios.workers import EVERY_SECOND, JOB_SPEC, REPO_ROOT, Fleet, Worker
from tests.servers.external import ExternalServer
from tests.servers.ports import LOOPBACK, free_port
from tests.servers.zookeeper import ZooKeeperServer
from tests.waiting import wait_for

CONSOLE_SCRIPT = Path(sys.executable).parent / "shardjob"


def shardjob(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """``python -m scheduler.cli ARGS`` from the repository root (so ``tests.*`` job modules
    import), stdin closed, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "scheduler.cli", *args],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def unreachable(scheme: str) -> str:
    return f"{scheme}://{LOOPBACK}:{free_port()}/cli?connect_timeout=1"


# -- entry point and help ------------------------------------------------------------------
def test_console_script_is_installed_and_runs() -> None:
    assert CONSOLE_SCRIPT.is_file(), f"no console script at {CONSOLE_SCRIPT}; is the package installed?"
    assert os.access(CONSOLE_SCRIPT, os.X_OK)
    done = subprocess.run(
        [str(CONSOLE_SCRIPT), "--help"], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 0, done.stderr
    assert "demo" in done.stdout and "worker" in done.stdout


@pytest.mark.parametrize(
    ("args", "mentions"),
    [
        (["--help"], ["demo", "worker", "Exit codes", "--verbose"]),
        (
            ["worker", "--help"],
            [
                "--registry", "--job", "--name", "--cron", "--time-zone", "--total", "--item-parameters",
                "--job-parameter", "--strategy", "--failover", "--no-misfire", "--overwrite", "--disabled",
                "--job-type", "--script", "--instance-id", "--max-workers", "SIGTERM",
            ],
        ),
        (["demo", "--help"], ["--registry", "--instances", "--items", "--fires"]),
    ],
    ids=["shardjob", "worker", "demo"],
)  # fmt: skip
def test_help_exits_0_and_names_the_options(args: list[str], mentions: list[str]) -> None:
    done = shardjob(*args)
    assert done.returncode == 0, done.stderr
    missing = [word for word in mentions if word not in done.stdout]
    assert missing == [], done.stdout


def test_version_is_the_installed_distributions() -> None:
    # tests/packaging checks the same on an install of the built wheel against its version
    done = shardjob("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"shardjob {metadata.version('shardjob')}\n"
    assert re.fullmatch(r"\d+\.\d+\.\d+", metadata.version("shardjob"))


# -- bad usage: exit 2 and a message naming the problem ------------------------------------
# Configuration errors are given an unreachable registry on purpose: they must be found
# before connecting (exit 2, not 3).
@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["worker", "--registry", "@zk", "--job", JOB_SPEC, "--cron", "61 * * * *"], "cron"),
        (["worker", "--registry", "@zk", "--job", JOB_SPEC, "--cron", "not a cron"], "cron"),
        (["worker", "--registry", "@zk", "--job", JOB_SPEC, "--strategy", "NO_SUCH_STRATEGY"], "NO_SUCH_STRATEGY"),
        (["worker", "--registry", "@zk", "--job", JOB_SPEC, "--total", "0"], "sharding_total_count"),
        (["worker", "--registry", "@zk", "--job", JOB_SPEC, "--time-zone", "Mars/Olympus"], "Mars/Olympus"),
        (["worker", "--registry", "@zk", "--job", "no_such_module_xyz:run"], "no_such_module_xyz"),
        (["worker", "--registry", "@zk", "--job", "tests.scenarios.recording_job:nope"], "nope"),
        (["worker", "--registry", "bogus://127.0.0.1:2181", "--job", JOB_SPEC], "bogus"),
        (["worker", "--registry", "zk://127.0.0.1:notaport/ns", "--job", JOB_SPEC], "notaport"),
        (["worker", "--registry", "zk://", "--job", JOB_SPEC], "host"),
        (["worker", "--registry", "etcd://127.0.0.1:2379?session_timeout=soon", "--job", JOB_SPEC], "session_timeout"),
        (["worker", "--registry", "memory://cli", "--cron", EVERY_SECOND], "--job"),
        (["worker", "--job", JOB_SPEC], "--registry"),
        (["worker", "--registry", "memory://cli", "--job", JOB_SPEC, "--total", "many"], "--total"),
        (["launch"], "launch"),
    ],
    ids=[
        "cron-range", "cron-garbage", "strategy", "total", "time-zone", "job-module", "job-attribute",
        "url-scheme", "url-port", "url-host", "url-option", "missing-job", "missing-registry",
        "total-not-int", "unknown-command",
    ],
)  # fmt: skip
def test_bad_usage_exits_2_naming_the_problem(args: list[str], names: str) -> None:
    argv = [unreachable("zk") if arg == "@zk" else arg for arg in args]
    done = shardjob(*argv)
    assert done.returncode == 2, f"exit {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}"
    assert names in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


# -- registry unreachable: exit 3 ---------------------------------------------------------
@pytest.mark.parametrize("scheme", ["zk", "etcd"])
def test_unreachable_registry_exits_3(scheme: str) -> None:
    done = shardjob("worker", "--registry", unreachable(scheme), "--job", JOB_SPEC, "--cron", EVERY_SECOND)
    assert done.returncode == 3, f"exit {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}"
    assert "unreachable" in done.stderr
    assert "Traceback" not in done.stderr


# -- a worker on memory:// stops gracefully on a signal --------------------------------------
@pytest.fixture
def memory_fleet(tmp_path: Path) -> Iterator[Fleet]:
    # memory:// lives inside one process: a single worker is a whole cluster
    made = Fleet(f"memory://cli-{tmp_path.name}", tmp_path, job="job", total=2)
    try:
        yield made
    finally:
        made.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_memory_worker_runs_its_items_and_exits_0_on_signal(memory_fleet: Fleet, sig: signal.Signals) -> None:
    worker = memory_fleet.start("127.0.0.1@-@solo")[0]
    wait_for(
        lambda: {r.item for r in worker.records()} == {0, 1},
        20,
        interval=0.1,
        message=lambda: f"both items run:\n{worker.describe()}",
    )
    assert worker.terminate(sig=sig) == 0, worker.describe()
    out = worker.stdout_file.read_text()
    assert f"worker {worker.instance_id} running job 'job'" in out
    assert f"worker {worker.instance_id} stopped" in out
    assert "Traceback" not in worker.stderr_file.read_text()


@pytest.fixture(params=["zookeeper", "etcd"])
def server_harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    """A real registry (the session's ZooKeeper or etcd server)."""
    made = make_harness(request.param, request)
    try:
        yield made
    finally:
        close_harness(made)


def test_worker_on_a_real_registry_leaves_it_on_sigint(server_harness: Harness, tmp_path: Path) -> None:
    """SIGINT (Ctrl-C) on ZooKeeper and etcd: exit 0, and the worker's instance node is gone
    from the registry as soon as it has exited — removed by its graceful shutdown, not by
    the session's expiry (10 s here)."""
    namespace = server_harness.fresh_namespace()
    fleet = Fleet(server_harness.url(namespace, session_timeout=10), tmp_path, job="job", total=2)
    observer = server_harness.connect(namespace)
    try:
        worker = fleet.start("127.0.0.1@-@sigint")[0]
        wait_for(
            lambda: {r.item for r in worker.records()} == {0, 1},
            20,
            interval=0.1,
            message=lambda: f"both items run:\n{worker.describe()}",
        )
        assert observer.children(JobPaths("job").instances) == [worker.instance_id]
        assert worker.terminate(sig=signal.SIGINT) == 0, worker.describe()
        assert observer.children(JobPaths("job").instances) == [], "the instance node outlived the worker"
        assert f"worker {worker.instance_id} stopped" in worker.stdout_file.read_text()
        assert "Traceback" not in worker.stderr_file.read_text()
    finally:
        fleet.close()


def test_worker_whose_job_cannot_start_exits_1(
    zk_server: ZooKeeperServer | ExternalServer, tmp_path: Path
) -> None:
    """Another identity owns the namespace (ZooKeeper digest ACL: readable by all, writable
    by its owner only), so this worker's job cannot register. A worker process that runs
    nothing must say so and exit 1 ("error"), not report itself running."""
    namespace = f"/cli-acl-{uuid.uuid4().hex[:12]}"
    owner = registry.connect(f"zk://owner:secret@{zk_server.address}{namespace}")
    try:
        owner.put(
            JobPaths("job").config, JobConfig(name="job", cron=EVERY_SECOND, sharding_total_count=2).to_json()
        )
        other = Fleet(
            f"zk://intruder:other@{zk_server.address}{namespace}?session_timeout=2", tmp_path, total=2
        )
        worker = Worker("127.0.0.1@-@intruder", other.argv, tmp_path, hold=0.0)
        other.workers.append(worker)
        try:
            wait_for(
                lambda: not worker.alive or "running" in worker.stdout_file.read_text(),
                30,
                interval=0.05,
                message=lambda: worker.describe(),
            )
            assert "running" not in worker.stdout_file.read_text(), worker.describe()
            assert worker.proc.wait(15) == 1, worker.describe()
            assert "not authorised" in worker.stderr_file.read_text(), worker.describe()
        finally:
            other.close()
    finally:
        owner.close()


# -- demo --------------------------------------------------------------------------------
_ROW = re.compile(r"^\s*(\d\d:\d\d:\d\d)\s+(.*?)\s*$")
_LABEL = re.compile(r"^[A-Z]:$")


@dataclass
class Demo:
    """``shardjob demo``'s table: column labels, rows before and after the announced
    shutdown (each row: label -> items), and who left."""

    ids: dict[str, str] = field(default_factory=dict)
    columns: list[str] = field(default_factory=list)
    before: list[dict[str, list[int]]] = field(default_factory=list)
    after: list[dict[str, list[int]]] = field(default_factory=list)
    leaver: str | None = None
    total: int = 6


def parse_demo(out: str) -> Demo:
    demo = Demo()
    if found := re.search(r"(\d+) items", out):
        demo.total = int(found.group(1))
    for line in out.splitlines():
        if found := re.match(r"^\s*instance ([A-Z]) = (\S+)", line):
            demo.ids[found.group(1)] = found.group(2)
        elif found := re.match(r"^\s*time((?:\s+[A-Z])+)\s*$", line):
            demo.columns = found.group(1).split()
        elif found := re.search(r"instance ([A-Z]) shuts down", line):
            demo.leaver = found.group(1)
        elif (found := _ROW.match(line)) and demo.columns:
            # a cell is "-" or "0,1,2", optionally preceded by its label ("A: 0,1")
            cells = [c for c in found.group(2).split() if not _LABEL.match(c)]
            assert len(cells) == len(demo.columns), f"row {line!r} does not match columns {demo.columns}"
            row = {
                label: [] if cell == "-" else [int(i) for i in cell.split(",")]
                for label, cell in zip(demo.columns, cells, strict=True)
            }
            (demo.after if demo.leaver else demo.before).append(row)
    return demo


def covers_all_once(row: dict[str, list[int]], total: int, only: Sequence[str]) -> bool:
    ran = [item for label in only for item in row[label]]
    others = [item for label, items in row.items() if label not in only for item in items]
    return sorted(ran) == list(range(total)) and not others


def test_demo_shows_instances_and_items_moving_and_exits_0(harness: Harness) -> None:
    """``shardjob demo`` on its own memory registry, and with ``--registry`` on ZooKeeper
    and etcd."""
    assert CONSOLE_SCRIPT.is_file(), f"no console script at {CONSOLE_SCRIPT}"
    registry_args: list[str] = []
    if harness.name != "memory":
        url = harness.url(harness.fresh_namespace(), session_timeout=harness.min_session_timeout)
        registry_args = ["--registry", url]
    done = subprocess.run(
        [str(CONSOLE_SCRIPT), "demo", *registry_args],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = done.stdout
    assert done.returncode == 0, f"exit {done.returncode}\n{out}\n{done.stderr}"
    scheme = {"memory": "memory", "zookeeper": "zk", "etcd": "etcd"}[harness.name]
    assert f"registry {scheme}://" in out, out
    demo = parse_demo(out)
    assert len(demo.ids) >= 2 and len(set(demo.ids.values())) == len(demo.ids), out
    assert sorted(demo.columns) == sorted(demo.ids), out
    assert demo.leaver in demo.ids, f"no announced shutdown:\n{out}"
    everyone = demo.columns
    stayers = [label for label in everyone if label != demo.leaver]

    # before: full fires spread over every instance, the leaver among them
    full_before = [row for row in demo.before if covers_all_once(row, demo.total, everyone)]
    assert full_before, f"no fire before the shutdown ran every item exactly once:\n{out}"
    assert all(all(row[label] for label in everyone) for row in full_before), out
    # after: the remaining instances alone run every item exactly once; the leaver's moved
    full_after = [row for row in demo.after if covers_all_once(row, demo.total, stayers)]
    assert full_after, f"no fire after the shutdown where the remaining instances cover all items:\n{out}"
    left_items = set(full_before[-1][demo.leaver])
    assert left_items and left_items <= {i for label in stayers for i in full_after[-1][label]}, out
    # no row ever shows an item twice
    for row in demo.before + demo.after:
        ran = [item for items in row.values() for item in items]
        assert len(ran) == len(set(ran)), f"an item ran twice in one fire: {row}\n{out}"
    # the shutdown at the end cuts no fire short: the last one shown ran every item
    assert covers_all_once(demo.after[-1], demo.total, stayers), f"the last fire is incomplete:\n{out}"
    summary = re.search(
        r"demo done: (\d+) fires, (\d+) with every item run exactly once, (\d+) item runs doubled", out
    )
    assert summary, out
    assert int(summary.group(1)) == len(demo.before) + len(demo.after), out
    assert int(summary.group(3)) == 0, out
