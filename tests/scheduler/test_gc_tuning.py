"""The collector setting for many jobs (``scheduler/gc_tuning.py``): ``tune_gc`` sets the
first threshold only, and ``shardjob worker`` applies it to its own process unless told
``--gc-threshold 0``."""

from __future__ import annotations

import gc
import json
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler import tune_gc
from scheduler.gc_tuning import WORKER_GC_THRESHOLD
from tests.scenarios.workers import EVERY_SECOND, REPO_ROOT
from tests.waiting import wait_for


@pytest.fixture
def thresholds() -> Iterator[tuple[int, int, int]]:
    saved = gc.get_threshold()
    try:
        yield saved
    finally:
        gc.set_threshold(*saved)


def test_tune_gc_sets_the_first_threshold_and_keeps_the_others(thresholds: tuple[int, int, int]) -> None:
    gc.set_threshold(700, 11, 12)
    assert tune_gc() == (WORKER_GC_THRESHOLD, 11, 12) == gc.get_threshold()
    assert tune_gc(5_000) == (5_000, 11, 12)
    assert tune_gc(0) == (5_000, 11, 12)  # 0: left as it is


@pytest.mark.parametrize("bad", [-1, 2.5, True, "20000"])
def test_tune_gc_refuses_what_is_not_a_threshold(thresholds: tuple[int, int, int], bad: object) -> None:
    with pytest.raises(ValueError, match="threshold"):
        tune_gc(bad)  # type: ignore[arg-type]
    assert gc.get_threshold() == thresholds


def _python_default() -> list[int]:
    done = subprocess.run(
        [sys.executable, "-c", "import gc, json; print(json.dumps(gc.get_threshold()))"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return list(json.loads(done.stdout))


@pytest.mark.parametrize(
    ("option", "first"),
    [([], WORKER_GC_THRESHOLD), (["--gc-threshold", "0"], None), (["--gc-threshold", "50000"], 50_000)],
    ids=["default", "zero-keeps-python-s", "given"],
)
def test_worker_runs_its_jobs_with_the_threshold_it_was_given(
    tmp_path: Path, option: list[str], first: int | None
) -> None:
    probe = tmp_path / "thresholds.json"
    argv = [
        sys.executable, "-m", "scheduler.cli", "worker", "--registry", f"memory://gc-{uuid.uuid4().hex[:8]}",
        "--job", "tests.scenarios.gc_probe:record", "--cron", EVERY_SECOND, "--job-parameter", str(probe),
        *option,
    ]  # fmt: skip
    with open(tmp_path / "out", "wb") as out:
        worker = subprocess.Popen(argv, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for(probe.exists, 30, interval=0.05, message=lambda: (tmp_path / "out").read_text())
            seen = json.loads(probe.read_text())
        finally:
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(30) == 0, (tmp_path / "out").read_text()
    default = _python_default()
    assert seen == [default[0] if first is None else first, *default[1:]]


def test_worker_refuses_a_negative_threshold_before_it_starts() -> None:
    done = subprocess.run(
        [
            sys.executable, "-m", "scheduler.cli", "worker", "--registry", "memory://gc-bad",
            "--job", "tests.scenarios.gc_probe:record", "--cron", EVERY_SECOND, "--gc-threshold", "-5",
        ],
        cwd=REPO_ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "threshold" in done.stderr and "-5" in done.stderr and "Traceback" not in done.stderr
