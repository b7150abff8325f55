"""The burst pool: blocking tasks submitted together each get a thread, up to ``size``;
threads leave once idle for ``linger``; a task that raises is logged and the pool goes
on; after shutdown nothing is accepted, queued tasks are dropped when asked, and ``wait``
joins what runs."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator

import pytest

from scheduler.burst_pool import BurstPool
from scheduler.errors import PoolShutDown
from tests.waiting import holds_for, wait_for


@pytest.fixture
def release() -> Iterator[threading.Event]:
    gate = threading.Event()
    yield gate
    gate.set()  # no test leaves a task blocked


def _blocking(started: list[int], i: int, release: threading.Event) -> Callable[[], None]:
    def task() -> None:
        started.append(i)
        release.wait(10)

    return task


def test_blocking_tasks_submitted_together_each_get_a_thread_up_to_size(release: threading.Event) -> None:
    pool = BurstPool(8, "burst-test")
    started: list[int] = []
    try:
        for i in range(20):
            pool.submit(_blocking(started, i, release))
        wait_for(lambda: len(started) == 8, 5, message=lambda: f"{len(started)} of 8 tasks started at once")
        holds_for(lambda: len(started) == 8 and pool.threads == 8, 0.3, message="more than size threads ran")
        release.set()
        wait_for(lambda: len(started) == 20, 5, message=lambda: f"{len(started)} of 20 tasks ran")
        assert sorted(started) == list(range(20))
    finally:
        pool.shutdown(wait=True)


def test_idle_threads_leave_after_linger_and_come_back_for_the_next_burst(release: threading.Event) -> None:
    pool = BurstPool(4, "burst-test", linger=0.2)
    started: list[int] = []
    try:
        for i in range(4):
            pool.submit(_blocking(started, i, release))
        wait_for(lambda: pool.threads == 4 and len(started) == 4, 5, message="the burst did not get 4 threads")
        release.set()
        wait_for(lambda: pool.threads == 0, 5, message=lambda: f"{pool.threads} thread(s) stayed after the burst")
        done = threading.Event()
        pool.submit(done.set)
        assert done.wait(5), "a task after the threads left never ran"
    finally:
        pool.shutdown(wait=True)


def test_one_task_at_a_time_reuses_the_lingering_thread() -> None:
    pool = BurstPool(4, "burst-test", linger=5.0)
    names: list[str] = []
    try:
        for _ in range(10):
            done = threading.Event()

            def task(done: threading.Event = done) -> None:
                names.append(threading.current_thread().name)
                done.set()

            pool.submit(task)
            assert done.wait(5)
            wait_for(lambda: pool.idle == 1, 5, message="the thread did not go back to waiting")
        assert set(names) == {"burst-test-1"}, f"tasks one after another started threads {sorted(set(names))}"
    finally:
        pool.shutdown(wait=True)


def test_a_task_that_raises_is_logged_and_the_pool_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    pool = BurstPool(1, "burst-test")

    def boom() -> None:
        raise RuntimeError("boom")

    try:
        with caplog.at_level(logging.ERROR, logger="scheduler.burst_pool"):
            pool.submit(boom)
            done = threading.Event()
            pool.submit(done.set)
            assert done.wait(5), "the task after a raising one never ran"
        assert any("a task raised" in r.getMessage() and r.exc_info for r in caplog.records)
    finally:
        pool.shutdown(wait=True)


def _one_running_two_queued(release: threading.Event) -> tuple[BurstPool, list[int]]:
    """A one-thread pool running task 0 (held by ``release``), tasks 1 and 2 queued."""
    pool = BurstPool(1, "burst-test")
    started: list[int] = []
    for i in range(3):
        pool.submit(_blocking(started, i, release))
    wait_for(lambda: started == [0], 5, message="the first task never started")
    return pool, started


def test_shutdown_drops_queued_tasks_when_told_and_waits_for_running_ones(release: threading.Event) -> None:
    pool, started = _one_running_two_queued(release)
    stopper = threading.Thread(target=pool.shutdown, kwargs={"wait": True, "drop_queued": True})
    stopper.start()
    holds_for(lambda: stopper.is_alive(), 0.3, message="shutdown(wait=True) returned while a task ran")
    with pytest.raises(PoolShutDown, match="burst-test"):
        pool.submit(lambda: None)
    release.set()
    stopper.join(5)
    assert not stopper.is_alive() and pool.threads == 0
    assert started == [0], "a task dropped at shutdown ran"


def test_shutdown_keeps_queued_tasks_unless_told(release: threading.Event) -> None:
    pool, started = _one_running_two_queued(release)
    release.set()
    pool.shutdown(wait=True)
    assert started == [0, 1, 2]


class _LockSeeingWaits:
    """A lock that notes which threads had to wait for it (its ``acquire`` first tries
    without blocking): what a test can wait on instead of guessing with a sleep."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.waited: set[threading.Thread] = set()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(False):
            return True
        if not blocking:
            return False
        self.waited.add(threading.current_thread())
        return self._lock.acquire(True, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_shutdown_while_a_new_thread_is_being_started_joins_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shutdown that lands between a new thread's creation and its start waits for the
    start, then joins it (joining a thread not yet started raises)."""
    pool = BurstPool(2, "burst-test")
    lock = _LockSeeingWaits()
    monkeypatch.setattr(pool, "_cond", threading.Condition(lock))  # type: ignore[arg-type]
    starting, go_on = threading.Event(), threading.Event()
    real_start = threading.Thread.start

    def slow_start(thread: threading.Thread) -> None:
        if thread.name.startswith("burst-test"):
            starting.set()
            go_on.wait(10)
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", slow_start)
    ran = threading.Event()
    submitter = threading.Thread(target=pool.submit, args=(ran.set,))
    real_start(submitter)
    assert starting.wait(5), "the pool never started a thread"
    failures: list[BaseException] = []

    def stop() -> None:
        try:
            pool.shutdown(wait=True)
        except BaseException as exc:
            failures.append(exc)

    stopper = threading.Thread(target=stop)
    real_start(stopper)
    wait_for(
        lambda: stopper in lock.waited or not stopper.is_alive(),
        5,
        message="shutdown neither waited for the pool's lock nor returned",
    )
    go_on.set()
    submitter.join(5)
    stopper.join(5)
    assert not failures, f"shutdown raised: {failures!r}"
    assert not stopper.is_alive() and pool.threads == 0
    assert ran.is_set(), "the task submitted before the shutdown was dropped unasked"


@pytest.mark.parametrize(("size", "linger"), [(0, 1.0), (1, 0.0), (1, float("nan"))])
def test_bad_settings_are_refused(size: int, linger: float) -> None:
    with pytest.raises(ValueError, match="burst pool"):
        BurstPool(size, "burst-test", linger=linger)
