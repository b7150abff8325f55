"""The chaos scenarios' table, printed once at the end of the test run.

Invariant: printing only — no fixture, no hook that changes how any test runs.
"""

from __future__ import annotations

import pytest

from tests.scenarios.chaos import REPORT_ENV, RESULTS, format_table


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not RESULTS:
        return
    terminalreporter.section("chaos scenarios")
    terminalreporter.write_line(format_table(RESULTS))
    failed = [r for r in RESULTS if not r.passed]
    for result in failed:
        terminalreporter.write_line(result.describe())
    terminalreporter.write_line(f"(set {REPORT_ENV}=FILE for one JSON line per scenario)")
