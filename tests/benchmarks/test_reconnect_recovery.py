"""``recovery_seconds``: from the restore to the start of the first second after which
every second ran its fires (99 % of the jobs), or None when the window ends late."""

from __future__ import annotations

from benchmarks.reconnect_recovery import recovery_seconds


def test_on_time_throughout_is_zero() -> None:
    assert recovery_seconds([100, 100, 99], 100, 0.3) == 0.0


def test_the_last_late_second_ends_the_recovery() -> None:
    # late in seconds 0 and 2 (a relapse counts): on time from second 3, restored at 0.4
    assert recovery_seconds([10, 100, 50, 100, 100], 100, 0.4) == 2.6


def test_late_at_the_end_of_the_window_is_none() -> None:
    assert recovery_seconds([100, 100, 98], 100, 0.0) is None
