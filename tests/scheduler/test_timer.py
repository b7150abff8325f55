"""The timer's drains: due callbacks start in due order, one at a time, and a callback
that blocks holds up the others only until another drain takes over; fires wait while
the group commit's backlog is at its bound, and nothing else does."""

from __future__ import annotations

import functools
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


class _Backlog:
    """A group commit's backlog as the timer sees it: each fire adds one request, and the
    test "commits" by setting the count."""

    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()

    def __call__(self) -> int:
        return self.count

    def fire(self, ran: list[float], due: float) -> None:
        with self.lock:
            self.count += 1
            ran.append(due)


def test_fires_stop_at_the_backlog_bound_and_start_again_at_half_of_it(pool: ThreadPoolExecutor) -> None:
    backlog = _Backlog()
    timer = Timer(pool, max_drains=4, stall=5.0, backlog=backlog, max_backlog=10)
    fired: list[float] = []
    marks: list[float] = []  # other callbacks: each one due after every fire is due
    base = time.time() + 0.1
    dues = [base + i * 0.001 for i in range(40)]
    for index, due in enumerate(dues):
        timer.schedule(("fire", index), due, functools.partial(backlog.fire, fired), fire=True)

    def passed_every_fire_due() -> None:
        """Schedule a plain callback due after every fire and wait until it ran: the fires
        held back by then stay held."""
        timer.schedule(("mark", len(marks)), max(dues[-1], time.time()) + 0.01, marks.append)
        count = len(marks)
        wait_for(lambda: len(marks) > count, 5, message="a plain callback ran while fires were held")

    timer.start()
    try:
        wait_for(lambda: len(fired) == 10, 5, message="the first ten fires ran")
        passed_every_fire_due()
        assert len(fired) == 10, "a fire started with the backlog at its bound"
        backlog.count = 6  # applied four: still over half the bound
        passed_every_fire_due()
        assert len(fired) == 10, "a fire started with the backlog over half its bound"
        backlog.count = 5  # down to half: fires start until the bound again
        wait_for(lambda: len(fired) == 15, 5, message="fires started again at half the bound")
        passed_every_fire_due()
        assert len(fired) == 15
        backlog.count = 0
        wait_for(lambda: len(fired) == 25, 5, message="ten more fires ran")
        backlog.count = -100  # the rest at once
        wait_for(lambda: len(fired) == len(dues), 5, message="every fire ran")
    finally:
        timer.stop()
    assert fired == dues, "fires started out of due order"


def test_a_full_backlog_never_holds_other_callbacks(pool: ThreadPoolExecutor) -> None:
    """A stalled registry fills the backlog for good: a timeout or a retry still starts."""
    timer = Timer(pool, max_drains=4, stall=5.0, backlog=lambda: 1_000_000, max_backlog=10)
    ran: list[str] = []
    due = time.time() + 0.05
    timer.schedule("fire", due, lambda _: ran.append("fire"), fire=True)
    timer.schedule("timeout", due + 0.01, lambda _: ran.append("timeout"))
    timer.schedule("retry", due + 0.02, lambda _: ran.append("retry"))
    timer.start()
    try:
        wait_for(lambda: "retry" in ran, 5, message="the callbacks due after the held fire ran")
    finally:
        timer.stop()
    assert ran == ["timeout", "retry"]


def test_max_backlog_must_be_positive(pool: ThreadPoolExecutor) -> None:
    with pytest.raises(ValueError, match="max_backlog"):
        Timer(pool, backlog=lambda: 0, max_backlog=0)
