"""After its session expired, a scheduler of many jobs fires every job again soon, even
with one coordinator thread: no job's resume holds that thread waiting for the job to be
registered again, and the jobs register and campaign again on threads of their own
(``scheduler.burst_pool``), never waiting for the coordinator pool, where fires wait for
a registration and a leader."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from registry.backends.base import BaseRegistry
from scheduler import JobConfig, Scheduler, ShardingContext
from sharding.layout import JobPaths
from tests.harness import Harness
from tests.scheduler.held_pool import holding_a_thread
from tests.waiting import wait_for

JOBS = 20
EVERY_SECOND = "* * * * * ?"


@pytest.mark.parametrize("harness", ["memory", "zookeeper", "etcd"], indirect=True)
def test_every_job_fires_again_soon_after_the_session_expired(harness: Harness) -> None:
    lock = threading.Lock()
    fired: dict[str, float] = {}

    def job(ctx: ShardingContext) -> None:
        with lock:
            fired[ctx.job_name] = max(fired.get(ctx.job_name, 0.0), ctx.fire_time)

    sched = Scheduler(
        harness.url(harness.fresh_namespace(), session_timeout=harness.min_session_timeout),
        coordinator_threads=1,
        max_workers=2,
    )
    try:
        for n in range(JOBS):
            sched.add_job(JobConfig(name=f"job-{n:02d}", cron=EVERY_SECOND), job)
        sched.start()
        wait_for(lambda: len(fired) == JOBS, 30, message=lambda: f"{len(fired)} of {JOBS} jobs fired")
        reg: Any = sched.registry
        assert isinstance(reg, BaseRegistry)
        harness.expire_session(reg)
        expired = time.time()
        # each job's resume used to hold the one coordinator thread up to 30 s
        wait_for(
            lambda: all(fire > expired for fire in dict(fired).values()),
            20,
            message=lambda: f"{sum(f > expired for f in dict(fired).values())} of {JOBS} jobs fired again",
        )
    finally:
        sched.shutdown(wait=False)


@pytest.mark.parametrize("harness", ["memory", "zookeeper", "etcd"], indirect=True)
def test_jobs_register_and_campaign_again_while_the_coordinator_pool_is_held(harness: Harness) -> None:
    sched = Scheduler(
        harness.url(harness.fresh_namespace(), session_timeout=harness.min_session_timeout),
        coordinator_threads=1,
        max_workers=2,
    )
    names = [f"job-{n:02d}" for n in range(JOBS)]
    try:
        for name in names:
            sched.add_job(JobConfig(name=name, cron="0 0 0 1 1 ? 2099"), lambda ctx: None)
        sched.start()
        runtime = sched.runtime
        assert runtime is not None
        reg = runtime.reg
        assert isinstance(reg, BaseRegistry)
        me = sched.instance_id

        def rejoined() -> list[str]:
            return [
                name
                for name in names
                if reg.exists(JobPaths(name).instance(me)) and reg.get(JobPaths(name).leader) == me.encode()
            ]

        with holding_a_thread(runtime.coordinator) as release:  # the coordinator's only thread
            harness.expire_session(reg)
            wait_for(
                lambda: len(rejoined()) == JOBS,
                20,
                message=lambda: f"{len(rejoined())} of {JOBS} jobs registered and leading again",
            )
            assert not release.is_set()
    finally:
        sched.shutdown(wait=False)
