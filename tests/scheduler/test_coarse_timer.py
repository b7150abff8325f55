"""``CoarseTimer``: owners due within one second share one bucket and one entry of the
timer; each is told once per schedule, never before its second, on the executor; an owner
rescheduled or cancelled since is told too, with the old second, which it ignores."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from scheduler.coarse_timer import CoarseTimer
from scheduler.timer import Timer
from tests.waiting import wait_for


class Owner:
    """Records each call: the second told, the time it came, the thread it ran on."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, float, str]] = []
        self._lock = threading.Lock()

    def on_due(self, second: int) -> None:
        with self._lock:
            self.calls.append((second, time.time(), threading.current_thread().name))


@pytest.fixture
def coarse() -> Iterator[tuple[CoarseTimer, Timer]]:
    pool = ThreadPoolExecutor(4, thread_name_prefix="coarse-test")
    timer = Timer(pool, max_drains=4)
    timer.start()
    yield CoarseTimer(timer, pool), timer
    timer.stop()
    pool.shutdown(wait=False, cancel_futures=True)


def test_owners_due_in_one_second_share_one_timer_entry_and_are_each_told_once(
    coarse: tuple[CoarseTimer, Timer],
) -> None:
    wheel, timer = coarse
    owners = [Owner() for _ in range(2000)]
    due = math.floor(time.time()) + 1.2  # every owner in the bucket of the second after
    seconds = {id(wheel.schedule(owner, due + index / 10_000)) for index, owner in enumerate(owners)}
    second = math.ceil(due)
    assert len(seconds) == 1  # one int object, kept by every owner of the bucket
    assert timer.pending((wheel, second)) == second  # one entry of the timer for all
    assert wheel.pending() == len(owners)
    wait_for(lambda: all(owner.calls for owner in owners), 10, message="every owner told")
    for owner in owners:
        ((told, at, thread),) = owner.calls
        assert told == second and at >= second
        assert thread.startswith("coarse-test")  # on the executor, not the timer's thread
    assert wheel.pending() == 0


def test_a_rescheduled_owner_is_told_of_both_seconds(coarse: tuple[CoarseTimer, Timer]) -> None:
    wheel, _ = coarse
    owner = Owner()
    now = time.time()
    first = wheel.schedule(owner, now + 0.2)
    second = wheel.schedule(owner, now + 1.2)
    assert second == first + 1
    wait_for(lambda: len(owner.calls) == 2, 10, message="both buckets came due")
    assert [told for told, _, _ in owner.calls] == [first, second]
