"""``max_time_diff_seconds`` reads the registry's clock at most once a second for every job
of a process (``scheduler/clock_skew.py``), on every backend: a measurement is a round trip,
a write on ZooKeeper, and measured per fire it cost as many requests as fires."""

from __future__ import annotations

import inspect
import sys
import threading
import time

import pytest

from registry.counting import CountingRegistry
from scheduler import JobConfig, Scheduler, ShardingContext
from scheduler.clock_skew import ClockSkew
from tests.harness import Harness
from tests.waiting import wait_for

OFFSET = 30.0  # seconds the local clock below is ahead of the registry's


def _ahead() -> float:
    return time.time() + OFFSET


def test_callers_share_one_measurement_a_second(harness: Harness) -> None:
    reg = harness.connect(harness.fresh_namespace())
    try:
        probe = ClockSkew(reg, _ahead)
        answers: list[float] = []
        lock = threading.Lock()
        stop = time.monotonic() + 2.5

        def ask() -> None:
            while time.monotonic() < stop:
                skew = probe.skew()
                with lock:
                    answers.append(skew)

        threads = [threading.Thread(target=ask) for _ in range(8)]
        began = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        took = time.monotonic() - began
        assert len(answers) > 100
        # one at the start and one per second after: never one per caller or per call
        assert 2 <= probe.measured <= int(took) + 2, (probe.measured, took)
        # the registry's clock, read over the network, is the local one less the offset
        assert all(abs(skew + OFFSET) < 1.5 for skew in answers), sorted(answers)[:: max(1, len(answers) // 10)]
    finally:
        reg.close()


def test_a_failed_measurement_is_not_kept(harness: Harness) -> None:
    reg = harness.connect(harness.fresh_namespace())
    calls = [0]

    def fails_once() -> float:
        calls[0] += 1
        if calls[0] == 1:
            raise OSError("clock unreadable")
        return time.time()

    try:
        probe = ClockSkew(reg, fails_once)
        with pytest.raises(OSError, match="clock unreadable"):
            probe.skew()
        assert abs(probe.skew()) < 1.5  # measured again at once, not the failure kept
        assert probe.measured == 1 and calls[0] == 2
    finally:
        reg.close()


def _waiting_for_the_lock(thread: threading.Thread) -> bool:
    """``thread`` is blocked on the measurement lock of ``ClockSkew.skew``."""
    source, first = inspect.getsourcelines(ClockSkew.skew)
    lock_line = first + next(n for n, line in enumerate(source) if "with self._lock" in line)
    frame = sys._current_frames().get(thread.ident or -1)
    return frame is not None and frame.f_code is ClockSkew.skew.__code__ and frame.f_lineno == lock_line


def test_callers_that_waited_for_a_failed_measurement_share_its_error(harness: Harness) -> None:
    reg = harness.connect(harness.fresh_namespace())
    release = threading.Event()
    calls = [0]

    def fails_slowly_once() -> float:
        calls[0] += 1
        if calls[0] == 1:
            release.wait(10)  # a reading that hangs until its request times out
            raise OSError("clock unreadable")
        return time.time()

    errors: list[Exception] = []

    def ask() -> None:
        try:
            probe.skew()
        except Exception as exc:
            errors.append(exc)

    try:
        probe = ClockSkew(reg, fails_slowly_once)
        first = threading.Thread(target=ask)
        first.start()
        wait_for(lambda: calls[0] == 1, 10, message="the first measurement under way")
        waiters = [threading.Thread(target=ask) for _ in range(4)]
        for thread in waiters:
            thread.start()
        wait_for(lambda: all(_waiting_for_the_lock(t) for t in waiters), 10, message="4 callers waiting")
        release.set()
        for thread in (first, *waiters):
            thread.join(10)
        # one attempt for the five callers: the waiters did not each try again
        assert calls[0] == 1
        assert sorted(type(e).__name__ for e in errors) == ["ClockSkewError"] * 4 + ["OSError"]
        assert all("clock unreadable" in str(e) for e in errors), errors
        assert abs(probe.skew()) < 1.5  # a caller after the failure measures again
        assert calls[0] == 2
    finally:
        release.set()
        reg.close()


def test_max_age_must_be_positive(harness: Harness) -> None:
    reg = harness.connect(harness.fresh_namespace())
    try:
        with pytest.raises(ValueError, match="max_age"):
            ClockSkew(reg, max_age=0)
    finally:
        reg.close()


def test_many_jobs_checking_their_clock_read_the_registrys_once_a_second(harness: Harness) -> None:
    namespace = harness.fresh_namespace()
    counting = CountingRegistry(harness.connect(namespace))
    fires: list[float] = []
    lock = threading.Lock()

    def job(ctx: ShardingContext) -> None:
        with lock:
            fires.append(time.monotonic())

    sched = Scheduler(counting)
    for n in range(20):
        sched.add_job(JobConfig(name=f"job-{n:02d}", cron="* * * * * ?", max_time_diff_seconds=5), job)
    try:
        sched.start()
        wait_for(lambda: len(fires) >= 20, 30, message="every job fired once")
        counting.reset()
        began, fired = time.monotonic(), len(fires)
        wait_for(lambda: len(fires) - fired >= 60, 30, message="three seconds of fires")
        took, ran = time.monotonic() - began, len(fires) - fired
        reads = counting.calls["server_time"]
        # every fire checked the clock (a refusal would have stopped it), 20 a second,
        # against at most one reading of the registry's clock a second
        assert reads <= took + 2, f"{reads} clock readings in {took:.1f} s for {ran} fires"
        assert ran >= 3 * reads, (ran, reads)
    finally:
        sched.shutdown()
