"""The chaos scenarios' table, printed once at the end of the test run: a plugin the root
``tests/conftest.py`` loads (``pytest_plugins``), so that the process printing the summary
has it even when it collects nothing itself (pytest-xdist's controller).

Invariant: printing only — no fixture, no hook that changes how any test runs.

Under pytest-xdist a scenario runs in a worker process while the table is printed by the
controller, which never sees the worker's ``RESULTS``. So each result recorded during a
test phase leaves ``RESULTS`` with that phase's report (as a JSON user property, which
xdist sends to the controller), and the table is made of what the reports brought: one
path, with or without workers.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

from tests.scenarios.chaos import REPORT_ENV, RESULTS, ChaosResult, format_table

_PROPERTY = "chaos_result"

#: every scenario's result, as the test reports brought them to this process
_REPORTED: list[ChaosResult] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    while RESULTS:
        report.user_properties.append((_PROPERTY, RESULTS.pop(0).to_json()))
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _REPORTED.extend(ChaosResult.from_json(str(value)) for name, value in report.user_properties if name == _PROPERTY)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _REPORTED:
        return
    terminalreporter.section("chaos scenarios")
    terminalreporter.write_line(format_table(_REPORTED))
    failed = [r for r in _REPORTED if not r.passed]
    for result in failed:
        terminalreporter.write_line(result.describe())
    terminalreporter.write_line(f"(set {REPORT_ENV}=FILE for one JSON line per scenario)")
