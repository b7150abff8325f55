"""The timer's drains: due callbacks start in due order, one at a time, and a callback
that blocks holds up the others only until another drain takes over."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from scheduler.timer import Timer
from tests.waiting import wait_for


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    executor = ThreadPoolExecutor(4, thread_name_prefix="timer-test")
    yield executor
    executor.shutdown(wait=False, cancel_futures=True)


def test_callbacks_due_together_run_in_due_order_one_at_a_time(pool: ThreadPoolExecutor) -> None:
    timer = Timer(pool, max_drains=4, stall=5.0)
    lock = threading.Lock()
    ran: list[float] = []
    busy = [0, 0]  # now, most at once
    # the timer logs and swallows a callback's exception: what the callback sees is
    # collected here and judged by the test
    threads: set[str] = set()

    def record(due: float) -> None:
        with lock:
            busy[0] += 1
            busy[1] = max(busy[1], busy[0])
            threads.add(threading.current_thread().name)
        with lock:
            ran.append(due)
            busy[0] -= 1

    base = time.time() + 0.2
    dues = [base + i * 0.001 for i in range(200)]
    for index, due in enumerate(reversed(dues)):
        timer.schedule(("job", index), due, record)
    timer.start()
    try:
        wait_for(lambda: len(ran) == len(dues), 10, message="every callback ran")
    finally:
        timer.stop()
    assert ran == sorted(dues)
    assert busy[1] == 1
    assert threads and all(name.startswith("timer-test") for name in threads), threads


def test_a_blocked_callback_holds_the_others_only_until_another_drain_starts(
    pool: ThreadPoolExecutor,
) -> None:
    timer = Timer(pool, max_drains=2, stall=0.2)
    release = threading.Event()
    ran: list[str] = []

    def blocker(_: float) -> None:
        ran.append("blocker")
        release.wait(10)

    def quick(_: float) -> None:
        ran.append("quick")

    due = time.time() + 0.1
    timer.schedule("blocker", due, blocker)
    timer.schedule("quick", due + 0.001, quick)
    timer.start()
    try:
        wait_for(lambda: "quick" in ran, 5, message="the second callback ran while the first blocks")
        assert not release.is_set()
    finally:
        release.set()
        timer.stop()
    assert ran == ["blocker", "quick"]


def test_a_rescue_drain_leaves_once_nothing_is_stalled(pool: ThreadPoolExecutor) -> None:
    """The drain started for a blocked callback stops when that callback returns: the queue
    goes back to one drain at a time, not to every drain a stall started."""
    timer = Timer(pool, max_drains=2, stall=0.2)
    release = threading.Event()
    lock = threading.Lock()
    spans: list[tuple[float, float]] = []  # the quick callbacks' (start, end)

    def blocker(_: float) -> None:
        release.wait(10)

    def quick(_: float) -> None:
        start = time.monotonic()
        threading.Event().wait(0.02)  # the callback's own work: it takes this long
        with lock:
            spans.append((start, time.monotonic()))

    due = time.time() + 0.1
    timer.schedule("blocker", due, blocker)
    count = 60
    for index in range(count):
        timer.schedule(("quick", index), due + 0.001 * (index + 1), quick)
    timer.start()
    try:
        wait_for(lambda: len(spans) >= 5, 5, message="the rescue drain runs quick callbacks")
        released_at = time.monotonic()
        release.set()
        wait_for(lambda: len(spans) == count, 10, message="every quick callback ran")
    finally:
        release.set()
        timer.stop()
    # after the release, the rescue drain finishes the callback it is in and leaves
    later = sorted(span for span in spans if span[0] > released_at + 0.1)
    assert len(later) > 10
    overlapping = [(a, b) for a, b in itertools.pairwise(later) if b[0] < a[1]]
    assert overlapping == [], f"{len(overlapping)} callbacks ran beside another after the stall ended"


def test_max_drains_must_be_positive(pool: ThreadPoolExecutor) -> None:
    with pytest.raises(ValueError, match="max_drains"):
        Timer(pool, max_drains=0)
