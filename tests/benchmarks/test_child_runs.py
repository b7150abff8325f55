"""``benchmarks.common.run_child``, which every benchmark that measures in child processes
runs them through: a result, a failure named with its log, an overrun that a benchmark
can turn into a figure (``scheduler_lateness``: how far a start got within its bound)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from benchmarks import scheduler_lateness
from benchmarks.common import BenchmarkError, ChildOverran, run_child

#: a child script: writes its ``--result`` (the last argument) unless told to fail or hang
_CHILD = """
import json, signal, sys
mode, result = sys.argv[1], sys.argv[-1]
print("child says", mode, flush=True)
if mode == "hang":
    signal.pause()  # until run_child's bound kills it
if mode == "fail":
    sys.exit(3)
open(result, "w").write(json.dumps({"mode": mode}))
"""


def _argv(mode: str) -> list[str]:
    return [sys.executable, "-c", _CHILD, mode]


def test_a_child_s_result_is_what_it_wrote(tmp_path: Path) -> None:
    assert run_child(_argv("ok"), tmp_path, "ok", 30.0, "the ok child") == {"mode": "ok"}
    assert "child says ok" in (tmp_path / "ok.log").read_text()


def test_a_failed_child_is_named_with_its_log(tmp_path: Path) -> None:
    with pytest.raises(BenchmarkError, match=r"the failing child failed \(3\):\nchild says fail") as caught:
        run_child(_argv("fail"), tmp_path, "fail", 30.0, "the failing child")
    assert not isinstance(caught.value, ChildOverran)


def test_a_child_over_its_bound_is_killed_and_named(tmp_path: Path) -> None:
    with pytest.raises(ChildOverran, match=r"the hanging child took over 1 s:\nchild says hang"):
        run_child(_argv("hang"), tmp_path, "hang", 1.0, "the hanging child")


def test_a_lateness_child_over_its_bound_is_a_figure_not_an_error(tmp_path: Path) -> None:
    # 200 jobs for 30 s cannot end within 2 s: the child is killed, and what it got to is
    # the figure for this job count
    figures = scheduler_lateness._run_child("shardjob", 200, 30.0, 1.0, 2.0, tmp_path)
    assert figures["completed"] is False
    assert figures["bound_s"] == 2.0
    assert figures["jobs"] == 200 and figures["expected_fires"] == 6000
    assert isinstance(figures["progress"], dict)
