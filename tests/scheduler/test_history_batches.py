"""When the history writer writes: every ``flush_interval``, in transactions of at most
``batch_size`` rows, at once for a backlog, a flush or a close; and the settings it refuses."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from scheduler.history import HistoryWriter
from tests.waiting import wait_for


def _row(i: int) -> tuple[object, ...]:  # COLUMNS["status_trace"] order
    return ("batched", "t", "t", "i", "NORMAL", "0", float(i), "RUNNING", None, float(i))


def test_rows_gather_for_the_flush_interval_and_a_flush_does_not_wait(tmp_path: Path) -> None:
    writer = HistoryWriter(f"sqlite:///{tmp_path / 'runs.db'}", batch_size=3, flush_interval=1.5, max_age=None)
    writer.start()
    try:
        writer.put_row("status_trace", _row(0))
        wait_for(lambda: writer.written == 1, 10, message="the first row is written at once")
        first = time.monotonic()
        writer.put_row("status_trace", _row(1))
        wait_for(lambda: writer.written == 2, 10, message="the next row waits at most the interval")
        assert time.monotonic() - first >= 1.2, "the second row did not wait for the flush interval"

        for i in range(2, 9):  # a backlog of 7 rows: 3 and 3 at once, then 1 left to wait
            writer.put_row("status_trace", _row(i))
        wait_for(lambda: writer.written == 8, 10, message="the backlog goes in full batches")
        assert writer.buffered == 1

        began = time.monotonic()
        assert writer.flush(10)
        assert writer.written == 9 and time.monotonic() - began < 1.2, "a flush waited for the interval"
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("buffer_size", 0),
        ("batch_size", 0),
        ("flush_interval", 0.0),
        ("flush_interval", float("nan")),
        ("retry_interval", -1.0),
        ("retention_interval", 0.0),
        ("max_age", 0.0),
        ("max_rows", 0),
    ],
)
def test_a_bad_setting_is_refused_by_name(tmp_path: Path, setting: str, value: float) -> None:
    settings: dict[str, Any] = {setting: value}
    with pytest.raises(ValueError, match=setting):
        HistoryWriter(f"sqlite:///{tmp_path / 'runs.db'}", **settings)
    assert not (tmp_path / "runs.db").exists()  # refused before anything was opened
