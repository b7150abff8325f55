"""The metrics' counters take no lock on the fire path: increments from many threads at
once, on label sets that exist and ones that appear while they race, are all counted, and
the counts beyond one at a time (history rows lost) add up with them."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler import Scheduler
from scheduler.metrics import MetricsObserver
from scheduler.observe import enable_metrics

THREADS = 8
ROUNDS = 5_000


@pytest.fixture
def switch_often() -> Iterator[None]:
    """Switch threads every microsecond, so a read-modify-write that is not atomic loses
    increments at once."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def _hammer(metrics: MetricsObserver, instance: str) -> None:
    start = threading.Barrier(THREADS)

    def work(n: int) -> None:
        start.wait()
        for i in range(ROUNDS):
            metrics.fires_due.inc("shared", instance, "NORMAL")
            metrics.fires_due.inc(f"job-{i % 50}", instance, "NORMAL")  # new label sets race in

    threads = [threading.Thread(target=work, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_increments_from_racing_threads_are_all_counted(switch_often: None) -> None:
    sched = Scheduler("memory://")
    metrics = enable_metrics(sched)
    _hammer(metrics, sched.instance_id)
    value = metrics.registry.get_sample_value
    labels = {"instance": sched.instance_id, "source": "NORMAL"}
    assert value("shardjob_fires_due_total", {**labels, "job": "shared"}) == THREADS * ROUNDS
    per_job = [value("shardjob_fires_due_total", {**labels, "job": f"job-{j}"}) for j in range(50)]
    assert per_job == [THREADS * ROUNDS / 50] * 50


def test_history_losses_add_their_counts(tmp_path: Path) -> None:
    sched = Scheduler("memory://", history=f"sqlite:///{tmp_path / 'history.db'}")
    try:
        metrics = enable_metrics(sched)
        dropped = {"instance": sched.instance_id}
        assert metrics.registry.get_sample_value("shardjob_history_rows_dropped_total", dropped) == 0.0
        writer = sched.history
        assert writer is not None and writer.on_drop is not None
        for count in (1, 250, 1, 4_000):
            writer.on_drop(count)
        assert metrics.registry.get_sample_value("shardjob_history_rows_dropped_total", dropped) == 4_252.0
    finally:
        sched.shutdown(wait=True)
