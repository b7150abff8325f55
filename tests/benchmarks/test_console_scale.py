"""Smoke test of ``benchmarks/console_scale.py`` (not in ``run_all``: it measures the
optional console): a quick run on the memory backend writes its JSON with every request
timed. No timing is asserted (speed targets are benchmarks, never timed assertions)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import console_scale


def test_console_scale_quick(tmp_path: Path) -> None:
    console_scale.main(["--quick", "--backends", "memory", "--out", str(tmp_path)])
    document = json.loads((tmp_path / "console_scale.json").read_text())
    assert document["benchmark"] == "console_scale" and document["jobs"] == 100
    [result] = document["results"]
    assert result["backend"] == "memory"
    assert {"GET /", "GET /api/jobs", "GET / after one change", "anchor: Cluster.jobs()"} <= set(result["rows"])
    assert all(row["median_ms"] > 0 for row in result["rows"].values())
