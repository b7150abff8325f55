"""A worker running every job of one config file, on memory, ZooKeeper and etcd.

On ZooKeeper and etcd a real ``shardjob worker --config FILE`` process; on memory (whose
store lives inside one process) the file runs in the test's process through the code the
command uses, ``load_worker_file`` then ``build_scheduler``. Either way three jobs of
different crons, totals and kinds run every item, the job with a listener from the file
has it called, and a secret from the environment reaches the job.
"""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from scheduler.config_file import build_scheduler, load_worker_file
from tests.harness import Harness
from tests.scenarios.once_listener import OnceCall, read_once_calls
from tests.scenarios.recording_job import RECORD_FILE_ENV
from tests.scenarios.workers import EVERY_SECOND, REPO_ROOT, Worker
from tests.scheduler.file_jobs import read_events
from tests.servers.ports import LOOPBACK, free_port
from tests.waiting import wait_for

FJ = "tests.scheduler.file_jobs"
TOKEN = "s3cret-token-from-the-environment"

#: three jobs: every second over 3 items with a listener and a secret; every 2 s over 2
#: items with item parameters, a default and a once-per-cluster listener; a SCRIPT job
#: whose command comes from the environment and whose parameter has an escaped "$"
JOBS_FILE = """
registry = "@URL@"
instance_id = "from-the-file"
max_workers = 8
@HTTP@

[jobs.fast]
target = "@FJ@:record"
cron = "@EVERY_SECOND@"
sharding_total_count = 3
job_parameter = "${SHARDJOB_TEST_TOKEN}"
listeners = ["@FJ@:RecordingListener"]

[jobs.slow]
target = "@FJ@:record"
cron = "0/2 * * * * ?"
sharding_total_count = 2
sharding_item_parameters = "0=north,1=south"
job_parameter = "${SHARDJOB_TEST_UNSET_VARIABLE:-fallback}"
listeners = ["tests.scenarios.once_listener:RecordingOnce"]

[jobs.script]
job_type = "script"
cron = "0/2 * * * * ?"
sharding_total_count = 2
script_command_line = "${SHARDJOB_TEST_PYTHON} -m tests.scheduler.file_jobs_script"
job_parameter = "costs $$5"
"""


def jobs_file(path: Path, url: str, http: str | None = None) -> Path:
    text = JOBS_FILE.replace("@URL@", url).replace("@FJ@", FJ).replace("@EVERY_SECOND@", EVERY_SECOND)
    path.write_text(text.replace("@HTTP@", f'http = "{http}"' if http else ""), encoding="utf-8")
    return path


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The secret and the script's interpreter, for this process and the workers it starts
    (``Worker`` copies the environment); the script job imports from the checkout."""
    monkeypatch.setenv("SHARDJOB_TEST_TOKEN", TOKEN)
    monkeypatch.delenv("SHARDJOB_TEST_UNSET_VARIABLE", raising=False)
    monkeypatch.setenv("SHARDJOB_TEST_PYTHON", sys.executable)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    )


def every_job_ran(events: list[dict[str, Any]], once: list[OnceCall]) -> bool:
    def items(kind: str, job: str) -> set[int]:
        return {e["item"] for e in events if e["kind"] == kind and e["job"] == job}

    heard = any(e["kind"] == "after_job" and e["job"] == "fast" for e in events)
    return (
        items("item", "fast") == {0, 1, 2}
        and items("item", "slow") == {0, 1}
        and items("script", "script") == {0, 1}
        and heard
        and {call.kind for call in once} == {"before", "after"}
    )


def check_events(events: list[dict[str, Any]]) -> None:
    """What each job was handed, and that the listener is on its own job only."""
    by_job: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for event in events:
        by_job.setdefault((event["kind"], event["job"]), []).append(event)
    assert {e["job_parameter"] for e in by_job[("item", "fast")]} == {TOKEN}
    assert {e["total"] for e in by_job[("item", "fast")]} == {3}
    assert {e["job_parameter"] for e in by_job[("item", "slow")]} == {"fallback"}
    assert {(e["item"], e["sharding_parameter"]) for e in by_job[("item", "slow")]} == {
        (0, "north"),
        (1, "south"),
    }
    assert {e["job_parameter"] for e in by_job[("script", "script")]} == {"costs $5"}
    assert {e["listener"] for e in by_job[("after_job", "fast")]} == {"class"}
    assert {job for kind, job in by_job if kind == "after_job"} == {"fast"}


def test_a_file_of_jobs_runs_every_job(
    harness: Harness, environment: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    namespace = harness.fresh_namespace()
    if harness.name == "memory":
        run_in_process(harness.url(namespace), tmp_path, monkeypatch)
    else:
        run_worker_process(harness.url(namespace, session_timeout=10), tmp_path)


def run_in_process(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record_file = tmp_path / "events.jsonl"
    monkeypatch.setenv(RECORD_FILE_ENV, str(record_file))
    sched = build_scheduler(load_worker_file(jobs_file(tmp_path / "jobs.toml", url)))
    assert sched.instance_id == "from-the-file"
    try:
        sched.start()
        assert sched.failed_jobs == {}
        wait_for(
            lambda: every_job_ran(read_events(record_file), read_once_calls(record_file)),
            30,
            interval=0.1,
            message=lambda: f"every job's items and the listener: {read_events(record_file)}",
        )
    finally:
        sched.shutdown(wait=True)
    check_events(read_events(record_file))


def run_worker_process(url: str, tmp_path: Path) -> None:
    """``shardjob worker --config``: the command line's ``--instance-id`` (which ``Worker``
    adds) wins over the file's; the file's ``http`` serves /readyz once every job runs."""
    port = free_port()
    path = jobs_file(tmp_path / "jobs.toml", url, http=f"{LOOPBACK}:{port}")
    worker = Worker("127.0.0.1@-@file-worker", ["-v", "worker", "--config", str(path)], tmp_path, hold=0.0)
    try:
        worker.wait_ready()
        stdout = worker.stdout_file.read_text()
        assert "worker 127.0.0.1@-@file-worker running 3 jobs: 'fast', 'script', 'slow'" in stdout
        assert f"serving /metrics /healthz /readyz /dump at http://{LOOPBACK}:{port}" in stdout
        wait_for(
            lambda: every_job_ran(read_events(worker.record_file), read_once_calls(worker.record_file)),
            30,
            interval=0.1,
            message=lambda: f"every job's items and the listener: {worker.describe()}",
        )
        with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/readyz", timeout=10) as answer:
            assert answer.status == 200
        assert worker.terminate() == 0, worker.describe()
        check_events(read_events(worker.record_file))
        assert f"worker {worker.instance_id} stopped" in worker.stdout_file.read_text()
        assert "Traceback" not in worker.stderr_file.read_text(), worker.describe()
    finally:
        worker.kill()


def test_worker_listener_flags_add_listeners_to_the_one_job(tmp_path: Path) -> None:
    """``--listener`` (repeatable) on the single-job flags: a class made once, an instance
    used as it is. memory:// in one worker process is a whole cluster."""
    worker = Worker(
        "127.0.0.1@-@listener-flags",
        [
            "worker", "--registry", f"memory://listeners-{tmp_path.name}", "--job", f"{FJ}:record",
            "--name", "listened", "--cron", EVERY_SECOND, "--total", "2",
            "--listener", f"{FJ}:RecordingListener", "--listener", f"{FJ}:LISTENER",
        ],
        tmp_path,
        hold=0.0,
    )  # fmt: skip
    try:
        worker.wait_ready()

        def listeners_heard() -> set[str]:
            return {e["listener"] for e in read_events(worker.record_file) if e["kind"] == "after_job"}

        wait_for(
            lambda: listeners_heard() == {"class", "instance"},
            20,
            interval=0.1,
            message=lambda: f"both listeners called: {worker.describe()}",
        )
        assert worker.terminate() == 0, worker.describe()
    finally:
        worker.kill()
