"""The lateness benchmark's sample store (``scheduler_lateness._Recorder``): it lives in
the measured process, so its pairs must survive concurrent fires and its footprint must
stay out of the RSS it reports."""

from __future__ import annotations

import sys
import threading
import tracemalloc

import pytest

from benchmarks.scheduler_lateness import _Recorder

THREADS = 8
PER_THREAD = 5_000


def _record_concurrently(recorder: _Recorder) -> list[float]:
    """Every thread records its own scheduled times at once; returns them all."""
    scheduled = [[1e6 * (t + 1) + i for i in range(PER_THREAD)] for t in range(THREADS)]
    start = threading.Barrier(THREADS)

    def fire(times: list[float]) -> None:
        start.wait()
        for when in times:
            recorder.record(f"job-{when}", when)

    threads = [threading.Thread(target=fire, args=(times,)) for times in scheduled]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [when for times in scheduled for when in times]


def test_concurrent_fires_keep_each_pair_together() -> None:
    recorder = _Recorder()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the GIL passes as often as it can: a pair recorded in two steps splits
    try:
        scheduled = _record_concurrently(recorder)
    finally:
        sys.setswitchinterval(interval)
    samples = list(recorder.samples)
    assert len(samples) == 2 * len(scheduled)
    # a split pair would put a lateness (about 1.7e9 s here) among the scheduled times
    assert sorted(samples[0::2]) == sorted(scheduled)
    assert len(recorder.fired) == len(scheduled)


def test_lateness_between_takes_the_fires_scheduled_in_the_window() -> None:
    recorder = _Recorder()
    for when in (10.0, 11.0, 12.0, 13.0):
        recorder.record("job", when)
    late = recorder.lateness_between(11.0, 13.0)
    assert len(late) == 2
    # each is the time of recording minus its own scheduled time, in that order
    assert late[0] - late[1] == pytest.approx(1.0, abs=0.5)


def test_fires_by_second_counts_each_second_of_the_window() -> None:
    recorder = _Recorder()
    for when in (9.9, 10.0, 10.5, 12.2, 12.9, 12.99, 13.0):
        recorder.record("job", when)
    late, counts = recorder.fires_by_second(10.0, 13.0)
    assert counts == [2, 0, 3]  # the second with no fire shows as 0: a pause
    assert len(late) == sum(counts)


def test_a_sample_costs_two_doubles() -> None:
    recorder = _Recorder()
    recorder.record("job", 0.0)  # the one name, in ``fired`` before the count starts
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(100_000):
            recorder.record("job", float(i))
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # a list of (scheduled, late) tuples held 112 bytes a sample; the array's growth
    # allowance keeps it under 20
    assert grown / 100_000 < 20
