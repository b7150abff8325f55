"""The worker pool: tasks run on at most ``size`` threads, a thread woken only when none is
awake; a task that blocks holds up the others for at most ``stall`` while the pool has
room; a task that raises is logged and the pool goes on; shutdown keeps or drops what is
queued, as told."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from scheduler.workers import WorkerPool
from tests.waiting import holds_for, wait_for


@pytest.fixture
def pool() -> Iterator[WorkerPool]:
    workers = WorkerPool(3, "pool-test", stall=0.1)
    yield workers
    workers.shutdown(wait=True, drop_queued=True)


def _pool_threads() -> list[str]:
    """The pool's worker threads (its watchdog aside)."""
    return [t.name for t in threading.enumerate() if t.name.startswith("pool-test_")]


def _recording(done: list[int], i: int, finished: threading.Event) -> Callable[[], None]:
    def task() -> None:
        done.append(i)
        finished.set()

    return task


def _blocking(started: threading.Event, release: threading.Event) -> Callable[[], None]:
    def task() -> None:
        started.set()
        release.wait(10)

    return task


def test_threads_start_only_when_tasks_wait_for_one(pool: WorkerPool) -> None:
    assert _pool_threads() == [], "a thread started before any task"
    done: list[int] = []
    first = threading.Event()
    pool.submit(_recording(done, 0, first))
    assert first.wait(5)
    assert len(_pool_threads()) == 1, "one task started more than one thread"
    for i in range(1, 50):  # one after another: the awake thread takes them all
        finished = threading.Event()
        pool.submit(_recording(done, i, finished))
        assert finished.wait(5), f"task {i} did not run"
    assert done == list(range(50))
    assert len(_pool_threads()) == 1, "tasks one after another woke more than one thread"


def test_a_burst_is_taken_by_the_awake_thread() -> None:
    """Tasks queued while a thread runs wake no other thread: a burst of fires costs one
    thread taking turns on the GIL with the one submitting, not every thread of the pool."""
    pool = WorkerPool(3, "pool-test", stall=30.0)  # no rescue due within the test
    try:
        release, first = threading.Event(), threading.Event()
        done: list[int] = []
        last = threading.Event()
        pool.submit(_blocking(first, release))
        assert first.wait(5)
        for i in range(200):
            pool.submit(_recording(done, i, last if i == 199 else threading.Event()))
        release.set()
        assert last.wait(5)
        assert done == list(range(200))
        assert len(_pool_threads()) == 1, "a burst behind a short task woke more threads"
    finally:
        pool.shutdown(wait=True)


def test_blocked_tasks_get_a_thread_each_up_to_the_size(pool: WorkerPool) -> None:
    release = threading.Event()
    started = [threading.Event() for _ in range(5)]
    for event in started:
        pool.submit(_blocking(event, release))
    wait_for(lambda: sum(e.is_set() for e in started) == 3, 5, message="3 tasks started")
    # over ten stall periods, in each of which the watchdog would wake another thread
    holds_for(
        lambda: len(_pool_threads()) == 3 and sum(e.is_set() for e in started) == 3,
        10 * 0.1,
        message=lambda: f"a pool of 3 ran more: threads {_pool_threads()}",
    )
    release.set()
    wait_for(lambda: all(e.is_set() for e in started), 5, message="the queued tasks started")


def test_a_blocked_task_does_not_hold_up_the_next(pool: WorkerPool) -> None:
    """The one thread is busy for good: the next task must get a thread of its own."""
    release = threading.Event()
    first = threading.Event()
    pool.submit(_blocking(first, release))
    assert first.wait(5)
    second = threading.Event()
    pool.submit(second.set)
    try:
        assert second.wait(5), "the second task waited for the blocked first one"
    finally:
        release.set()


def test_threads_woken_for_a_stall_park_once_it_is_over(pool: WorkerPool) -> None:
    """The thread the watchdog woke for a blocked task parks once nothing is stalled: short
    tasks queued after that run one at a time, not on every thread that was ever woken."""
    started, release = threading.Event(), threading.Event()
    pool.submit(_blocking(started, release))
    assert started.wait(5)
    lock = threading.Lock()
    spans: list[tuple[float, float, str]] = []  # (start, end, thread) of the short tasks

    def short() -> None:
        start = time.monotonic()
        threading.Event().wait(0.01)  # the task's own work: it takes this long
        with lock:
            spans.append((start, time.monotonic(), threading.current_thread().name))

    count = 150  # 1.5 s of work: the queue is never empty when the blocked task ends
    for _ in range(count):
        pool.submit(short)
    wait_for(lambda: len(spans) >= 5, 5, message="another thread runs the short tasks meanwhile")
    released_at = time.monotonic()
    release.set()
    wait_for(lambda: len(spans) == count, 10, message="every short task ran")
    later = sorted(span for span in spans if span[0] > released_at + 0.05)
    assert len(later) > 50
    overlapping = [(a, b) for a, b in itertools.pairwise(later) if b[0] < a[1]]
    assert overlapping == [], f"{len(overlapping)} short tasks ran beside another after the stall ended"


def test_a_task_that_raises_is_logged_and_the_pool_goes_on(
    pool: WorkerPool, caplog: pytest.LogCaptureFixture
) -> None:
    def fail() -> None:
        raise RuntimeError("boom")

    with caplog.at_level(logging.ERROR, logger="scheduler.workers"):
        for _ in range(5):  # more failures than threads: each thread survives its own
            pool.submit(fail)
        wait_for(lambda: caplog.text.count("a task raised") == 5, 5, message=lambda: caplog.text)
    assert "boom" in caplog.text
    after = threading.Event()
    pool.submit(after.set)
    assert after.wait(5), "the pool stopped running tasks after failures"


@pytest.mark.parametrize("drop", [False, True], ids=["keep queued", "drop queued"])
def test_shutdown_runs_what_is_queued_unless_told_to_drop_it(drop: bool) -> None:
    workers = WorkerPool(1, "pool-test")
    release, first = threading.Event(), threading.Event()
    workers.submit(_blocking(first, release))
    assert first.wait(5)
    queued = threading.Event()
    workers.submit(queued.set)
    workers.shutdown(wait=False, drop_queued=drop)
    with pytest.raises(RuntimeError, match="after shutdown"):
        workers.submit(lambda: None)
    release.set()
    workers.shutdown(wait=True)  # returns once every thread has finished
    assert queued.is_set() is not drop, f"drop_queued={drop}, yet the queued task ran={queued.is_set()}"
    left = [t.name for t in threading.enumerate() if t.name.startswith("pool-test")]
    assert left == [], f"threads outlived shutdown(wait=True): {left}"


def test_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least one thread"):
        WorkerPool(0)
