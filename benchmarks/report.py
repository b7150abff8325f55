"""BENCHMARKS.md from the benchmarks' JSON results: when, on what, the summary against the
project's performance targets, then one section (tables and charts) per benchmark.

Each benchmark module provides ``render(document, charts) -> str`` (its section) and
``summary(document) -> list[dict]`` (rows of the summary table: figure, target, result,
met). This module only assembles them, and appends to a benchmark's section the
hand-written analysis kept in ``benchmarks/notes/<name>.md`` (findings, where the time goes,
before/after runs of past changes, each dated), so a regenerated report keeps them.

Invariants: figures from a ``--quick`` run are never presented as real ones (their section
says so and they stay out of the summary); a benchmark without results gets a line saying
how to produce them, not a silent gap; charts are written next to the report's links; a
note is never mistaken for this run's figures (it follows them under its own heading).

Usage: ``.venv/bin/python -m benchmarks.report [--results DIR] [--output FILE]``
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path
from typing import Any

from benchmarks.charts import Charts
from benchmarks.common import REPO_ROOT, RESULTS_DIR

__all__ = ["BENCHMARK_NAMES", "NOTES_DIR", "NOTE_HEADING", "write_report"]

#: the hand-written analysis of each benchmark, ``<name>.md``, appended to its section
NOTES_DIR = Path(__file__).resolve().parent / "notes"
#: how a note opens: a heading under its benchmark's section
NOTE_HEADING = "#### "

#: every benchmark, in report order (each is ``benchmarks.<name>``)
BENCHMARK_NAMES = (
    "election_failover",
    "registry_cost",
    "resharding_scale",
    "scheduler_lateness",
    "start_cost",
    "fleet_requests",
    "reconnect_recovery",
    "restart_recovery",
    "cluster_ops",
    "console_scale",
    "observability_overhead",
    "registry_latency",
)


def _load(results_dir: Path, name: str) -> dict[str, Any] | None:
    path = results_dir / f"{name}.json"
    if not path.exists():
        return None
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def _notes(notes_dir: Path, name: str) -> list[str]:
    """``name``'s hand-written notes, to follow its generated section; none when absent."""
    path = notes_dir / f"{name}.md"
    if not path.exists():
        return []
    text = path.read_text().strip()
    if not text.startswith(NOTE_HEADING):
        raise ValueError(f"{path} must open with a heading of its own ({NOTE_HEADING}...), not {text[:40]!r}")
    return [text, ""]


def _header(documents: dict[str, dict[str, Any]]) -> list[str]:
    newest = max(documents.values(), key=lambda d: d.get("created", ""))
    machine = newest.get("machine", {})
    versions = newest.get("versions", {})
    commits = sorted({(d.get("git") or {}).get("commit", "?")[:10] for d in documents.values()})
    lines = [
        "# Benchmarks",
        "",
        "Measured side by side with the anchors in the same run: these "
        "machines are shared and noisy, so read ratios and medians, never a lone absolute time.",
        "",
        f"- **Date**: {', '.join(sorted({d.get('created', '?')[:10] for d in documents.values()}))}",
        f"- **Machine**: {machine.get('cpus')} cores ({machine.get('cpu_model') or 'unknown model'}), "
        f"{machine.get('memory_gib')} GiB, {machine.get('platform')}",
        f"- **Python** {machine.get('python')}; "
        + ", ".join(f"{name} {version or 'not installed'}" for name, version in versions.items()),
        f"- **Code**: commit {', '.join(commits)}",
        "- **Regenerate**: `.venv/bin/python -m benchmarks.run_all` (all, full mode, then this file); "
        "`--only NAME[,NAME]` reruns some and rebuilds the report from every result in "
        "`benchmarks/results/`. Each section's figures come from that run; what follows a "
        "section under a heading of its own is hand-written analysis (`benchmarks/notes/`), dated "
        "where it quotes figures of earlier runs.",
        "",
    ]
    return lines


def _summary(documents: dict[str, dict[str, Any]], modules: dict[str, Any]) -> list[str]:
    lines = ["## Summary", "", "| figure | target | result | met |", "|---|---|---|---|"]
    for name, document in documents.items():
        if document.get("quick"):
            continue
        for row in modules[name].summary(document):
            lines.append(f"| {row['figure']} | {row['target']} | {row['result']} | {row['met']} |")
    return [*lines, ""]


def write_report(
    results_dir: Path = RESULTS_DIR,
    output: Path = REPO_ROOT / "BENCHMARKS.md",
    charts_dir: Path | None = None,
    notes_dir: Path = NOTES_DIR,
) -> Path:
    """Write the report from ``results_dir``'s JSON files and ``notes_dir``'s notes; returns
    its path."""
    charts = Charts(charts_dir or output.parent / "docs" / "benchmarks", output.parent)
    documents: dict[str, dict[str, Any]] = {}
    modules: dict[str, Any] = {}
    for name in BENCHMARK_NAMES:
        document = _load(results_dir, name)
        if document is not None:
            documents[name] = document
            modules[name] = importlib.import_module(f"benchmarks.{name}")
    lines = _header(documents) if documents else ["# Benchmarks", "", "No results yet.", ""]
    lines += _summary(documents, modules)
    lines += ["## Details", ""]
    for name in BENCHMARK_NAMES:
        document = documents.get(name)
        if document is None:
            lines += [f"### {name}", "", f"No results: run `.venv/bin/python -m benchmarks.{name}`.", ""]
            lines += _notes(notes_dir, name)
            continue
        section = modules[name].render(document, charts)
        if document.get("quick"):
            section += (
                "\n\n**These figures come from a `--quick` run (a smoke test): they are not measurements.**"
            )
        lines += [section, ""]
        lines += _notes(notes_dir, name)
    output.write_text("\n".join(lines).rstrip() + "\n")
    return output


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "report")
    parser.add_argument("--results", type=Path, default=RESULTS_DIR, help="folder of the JSON results")
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "BENCHMARKS.md")
    args = parser.parse_args(argv)
    path = write_report(args.results, args.output)
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
