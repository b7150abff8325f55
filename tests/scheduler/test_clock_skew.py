"""``max_time_diff_seconds`` reads the registry's clock at most once a second for every job
of a process (``scheduler/clock_skew.py``), on every backend: a measurement is a round trip,
a write on ZooKeeper, and measured per fire it cost as many requests as fires."""

from __future__ import annotations

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
