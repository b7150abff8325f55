"""``benchmarks.report`` assembles BENCHMARKS.md: each section from its results, the
hand-written notes after it, and the summary's verdicts against the targets. Fed documents
shaped as the benchmarks write them; no benchmark runs here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import run_all, scheduler_lateness, start_cost
from benchmarks.report import NOTE_HEADING, NOTES_DIR, write_report


def _start(backend: str, jobs: int, cron: str, start_s: float) -> dict[str, Any]:
    return {
        "backend": backend, "crons": cron, "jobs": jobs, "cron": "* * * * * ?", "start_s": start_s,
        "cpu_s": start_s / 2, "cpu_ms_per_job": 1.0, "cpu_x_memory": 1.0, "server_requests": 25 * jobs,
        "requests_per_job": 25.0, "fires_during_start": 0, "failed_jobs": 0, "rss_mib": 100.0,
    }  # fmt: skip


def _start_document(results: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "benchmark": "start_cost", "quick": False, "created": "2026-11-27T09:00:00", "gc_threshold": 20000,
        "machine": {"cpus": 2, "python": "3.11"}, "versions": {}, "git": {"commit": "0123456789ab"},
        "results": results,
    }  # fmt: skip


def _report(tmp_path: Path, notes: dict[str, str]) -> str:
    results, notes_dir = tmp_path / "results", tmp_path / "notes"
    results.mkdir()
    notes_dir.mkdir()
    document = _start_document([_start("memory", 1000, "every-second", 1.0), _start("etcd", 1000, "every-second", 3.0)])
    (results / "start_cost.json").write_text(json.dumps(document))
    for name, text in notes.items():
        (notes_dir / f"{name}.md").write_text(text)
    output = write_report(results, tmp_path / "BENCHMARKS.md", tmp_path / "charts", notes_dir)
    return output.read_text()


def test_a_note_follows_its_section_and_a_missing_section_keeps_its_note(tmp_path: Path) -> None:
    report = _report(
        tmp_path,
        {
            "start_cost": f"{NOTE_HEADING}Where a start-up goes\n\nThe tree watch reads each node once.\n",
            "fleet_requests": f"{NOTE_HEADING}A fleet, earlier\n\nMeasured 2026-11-20.\n",
        },
    )
    section = report.split("### Start-up apart from the fires", 1)[1].split("\n### ", 1)[0]
    table, note = section.split(f"{NOTE_HEADING}Where a start-up goes", 1)
    assert "| 1,000 | etcd | every-second | 3.0 |" in table  # this run's figures come first
    assert "The tree watch reads each node once." in note
    # fleet_requests has no results in this folder: its line saying so, then its note
    fleet = report.split("### fleet_requests", 1)[1].split("\n### ", 1)[0]
    assert "No results: run" in fleet and fleet.index("No results") < fleet.index("A fleet, earlier")


def test_a_note_without_its_own_heading_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"start_cost\.md must open with a heading"):
        _report(tmp_path, {"start_cost": "Figures of an earlier run, unlabelled.\n"})


def test_every_committed_note_opens_with_a_heading_of_its_own() -> None:
    notes = sorted(NOTES_DIR.glob("*.md"))
    assert notes, "benchmarks/notes/ holds the hand-written analyses"
    for path in notes:
        assert path.read_text().startswith(NOTE_HEADING), path.name


def test_start_cost_summary_holds_each_real_registry_to_its_bound() -> None:
    document = _start_document(
        [
            _start("memory", 1000, "every-second", 1.0),
            _start("zookeeper", 1000, "quiet", 2.5),
            _start("zookeeper", 1000, "every-second", 4.9),
            _start("etcd", 1000, "every-second", 5.1),
            _start("zookeeper", 10000, "every-second", 59.0),
            _start("etcd", 10000, "every-second", 61.0),
        ]
    )
    rows = {row["figure"]: row for row in start_cost.summary(document)}
    assert set(rows) == {
        f"`start()` of {jobs} every-second jobs, {backend}"
        for jobs in ("1,000", "10,000")
        for backend in ("zookeeper", "etcd")
    }  # memory is the anchor, quiet starts go beside the every-second ones
    assert [rows[f"`start()` of 1,000 every-second jobs, {b}"]["met"] for b in ("zookeeper", "etcd")] == ["yes", "no"]
    assert [rows[f"`start()` of 10,000 every-second jobs, {b}"]["met"] for b in ("zookeeper", "etcd")] == ["yes", "no"]
    assert "(quiet cron: 2.5 s)" in rows["`start()` of 1,000 every-second jobs, zookeeper"]["result"]


def _lateness(fires: int, due: int, p99: float, rss: float, start_s: float = 1.0) -> dict[str, Any]:
    return {
        "fires": fires, "expected_fires": due, "lateness_ms": {"p50": p99 / 2, "p99": p99, "max": p99},
        "rss_mib": rss, "start_s": start_s, "server": {"requests_per_job_fire": 0.03},
    }  # fmt: skip


def test_past_1000_jobs_a_registry_is_held_to_apschedulers_rss_too() -> None:
    per_scheduler = {
        "shardjob": _lateness(10_000, 10_000, 100.0, 250.0),
        "apscheduler": _lateness(10_000, 10_000, 120.0, 100.0),
        "shardjob-zookeeper": _lateness(9_950, 10_000, 140.0, 149.0),
        "shardjob-etcd": _lateness(9_950, 10_000, 140.0, 151.0),
    }
    rows = {row["figure"]: row for row in scheduler_lateness._registry_rows(10_000, per_scheduler)}
    zookeeper = rows["10,000 every-second jobs in one process, zookeeper"]
    etcd = rows["10,000 every-second jobs in one process, etcd"]
    assert zookeeper["met"] == "yes" and "RSS 149.0 MiB (1.49 x APScheduler's)" in zookeeper["result"]
    assert etcd["met"] == "no" and "1.51 x APScheduler's" in etcd["result"]
    # at 1,000 jobs RSS is no target: the same footprint passes
    small = scheduler_lateness._registry_rows(1000, {**per_scheduler, "shardjob-etcd": _lateness(1000, 1000, 140.0, 151.0)})
    assert [row["met"] for row in small if row["figure"].endswith("etcd")] == ["yes"]
    assert all("RSS" not in row["target"] for row in small)


def test_run_all_refuses_a_negative_collector_threshold_before_starting_anything(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        run_all.main(["--gc-threshold", "-5"])
    assert exited.value.code == 2
    assert "--gc-threshold must be >= 0 (0: Python's), got -5" in capsys.readouterr().err
