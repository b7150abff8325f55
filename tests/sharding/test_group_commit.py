"""Fenced marks of several jobs in one group commit, on every backend: a job whose plan
went stale is fenced out alone, and the other jobs of the same shared transaction run."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from registry.recipes.batch import TransactionBatcher
from sharding import FenceReason, InstanceIdentity, ShardingService, ShardingSettings
from sharding.layout import JobPaths
from tests.harness import Harness
from tests.waiting import wait_for

JOBS = ("alpha", "beta", "gamma")


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(4, thread_name_prefix="group-commit-test")
    yield pool
    pool.shutdown(wait=False, cancel_futures=True)


def test_a_fenced_out_job_does_not_stop_the_others_in_its_batch(
    harness: Harness, executor: ThreadPoolExecutor
) -> None:
    namespace = harness.fresh_namespace()
    reg = harness.connect(namespace, session_timeout=harness.min_session_timeout)
    operator = harness.connect(namespace)
    identity = InstanceIdentity.create("10.0.0.7@-@1")
    services = {
        job: ShardingService(reg, job, identity, ShardingSettings(total=2), executor=executor) for job in JOBS
    }
    try:
        for service in services.values():
            service.start()
        planned = {}
        for job, service in services.items():
            current = service.ensure_ready(10)
            planned[job] = service.marks.plan(current, service.local_items(current), fire_time=1.0)
        # beta's assignment moves on between planning and marking (a resharding began)
        beta = JobPaths("beta").assignment
        stored = operator.get(beta)
        assert stored is not None
        operator.put(beta, stored)
        told: dict[str, BaseException | None] = {}
        lock = threading.Lock()

        def record(job: str, error: BaseException | None) -> None:
            with lock:
                told[job] = error

        # queued before the committer starts: the three marks share one transaction
        batcher = TransactionBatcher(reg, max_ops=sum(reg.transaction_cost(p.ops) for p in planned.values()))
        for job, request in planned.items():
            batcher.submit(request.ops, functools.partial(record, job))
        batcher.start()
        wait_for(lambda: len(told) == len(JOBS), 10, message=lambda: f"told so far: {told}")
        batcher.close()
        assert batcher.commits == 2  # the shared transaction, then the others again at once
        assert told["alpha"] is None and told["gamma"] is None
        error = told["beta"]
        assert error is not None
        assert services["beta"].marks.refusal(planned["beta"], error).reason is FenceReason.ASSIGNMENT
        running = {job: operator.exists(JobPaths(job).running_of(identity.instance_id)) for job in JOBS}
        assert running == {"alpha": True, "beta": False, "gamma": True}
    finally:
        for service in services.values():
            service.stop()


def test_marks_planned_before_the_session_was_lost_are_refused_without_a_round_trip(
    harness: Harness, executor: ThreadPoolExecutor
) -> None:
    """Once the session is lost, the registration every planned mark is fenced on went
    with it: the jobs count as unregistered at once, and the group commit tells each
    queued mark its refusal without sending it. (Their rejoining is held back, so the new
    session registers nothing meanwhile.)"""
    namespace = harness.fresh_namespace()
    reg = harness.connect(namespace, session_timeout=harness.min_session_timeout)
    identity = InstanceIdentity.create("10.0.0.7@-@1")
    held_back: list[object] = []
    services = {
        job: ShardingService(
            reg, job, identity, ShardingSettings(total=2), executor=executor, rejoin=held_back.append
        )
        for job in JOBS
    }
    try:
        for service in services.values():
            service.start()
        planned = {}
        for job, service in services.items():
            current = service.ensure_ready(10)
            planned[job] = service.marks.plan(current, service.local_items(current), fire_time=1.0)
        assert all(service.marks.doomed(planned[job]) is None for job, service in services.items())
        harness.expire_session(reg)
        wait_for(
            lambda: all(services[job].marks.doomed(planned[job]) is not None for job in JOBS),
            harness.min_session_timeout + 10,
            message="a mark fenced on the lost session's registration is not known to be doomed",
        )
        assert not any(service.registered for service in services.values())
        told: dict[str, BaseException | None] = {}
        lock = threading.Lock()

        def record(job: str, error: BaseException | None) -> None:
            with lock:
                told[job] = error

        batcher = TransactionBatcher(reg)
        for job, request in planned.items():
            marks = services[job].marks
            batcher.submit(request.ops, functools.partial(record, job), doomed=functools.partial(marks.doomed, request))
        batcher.start()
        wait_for(lambda: len(told) == len(JOBS), 10, message=lambda: f"told so far: {told}")
        batcher.close()
        assert batcher.commits == 0, "marks fenced on a lost registration were sent"
        for job, error in told.items():
            assert error is not None
            assert services[job].marks.refusal(planned[job], error).reason is FenceReason.REGISTRATION
    finally:
        for service in services.values():
            service.stop()
