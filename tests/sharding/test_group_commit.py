"""Fenced marks of several jobs in one group commit, on every backend: a job whose plan
went stale is fenced out alone, and the other jobs of the same shared transaction run."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from registry.backends.base import BaseRegistry
from registry.recipes.batch import TransactionBatcher
from sharding import FenceReason, InstanceIdentity, ShardingService, ShardingSettings
from sharding.layout import JobPaths
from sharding.run_marks import MarkRequest
from tests.harness import Harness
from tests.outcomes import Outcomes
from tests.waiting import wait_for

JOBS = ("alpha", "beta", "gamma")


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(4, thread_name_prefix="group-commit-test")
    yield pool
    pool.shutdown(wait=False, cancel_futures=True)


def _planned_marks(
    reg: BaseRegistry, identity: InstanceIdentity, executor: ThreadPoolExecutor, **options: Any
) -> tuple[dict[str, ShardingService], dict[str, MarkRequest]]:
    """``JOBS`` started (``options`` to each ``ShardingService``), and each one's mark planned."""
    services = {
        job: ShardingService(reg, job, identity, ShardingSettings(total=2), executor=executor, **options)
        for job in JOBS
    }
    planned = {}
    for service in services.values():
        service.start()
    for job, service in services.items():
        current = service.ensure_ready(10)
        planned[job] = service.marks.plan(current, service.local_items(current), fire_time=1.0)
    return services, planned


def test_a_fenced_out_job_does_not_stop_the_others_in_its_batch(
    harness: Harness, executor: ThreadPoolExecutor
) -> None:
    namespace = harness.fresh_namespace()
    reg = harness.connect(namespace, session_timeout=harness.min_session_timeout)
    operator = harness.connect(namespace)
    identity = InstanceIdentity.create("10.0.0.7@-@1")
    services, planned = _planned_marks(reg, identity, executor)
    try:
        # beta's assignment moves on between planning and marking (a resharding began)
        beta = JobPaths("beta").assignment
        stored = operator.get(beta)
        assert stored is not None
        operator.put(beta, stored)
        told: Outcomes[str] = Outcomes()
        # queued before the committer starts: the three marks share one transaction
        batcher = TransactionBatcher(reg, max_ops=sum(reg.transaction_cost(p.ops) for p in planned.values()))
        for job, request in planned.items():
            batcher.submit(request.ops, functools.partial(told.record, job))
        batcher.start()
        told.wait(len(JOBS), 10)
        batcher.close()
        assert batcher.commits == 2  # the shared transaction, then the others again at once
        assert told.by_key["alpha"] is None and told.by_key["gamma"] is None
        error = told.by_key["beta"]
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
    services, planned = _planned_marks(reg, identity, executor, rejoin=held_back.append)
    try:
        assert all(service.marks.doomed(planned[job]) is None for job, service in services.items())
        harness.expire_session(reg)
        wait_for(
            lambda: all(services[job].marks.doomed(planned[job]) is not None for job in JOBS),
            harness.min_session_timeout + 10,
            message="a mark fenced on the lost session's registration is not known to be doomed",
        )
        assert not any(service.registered for service in services.values())
        told: Outcomes[str] = Outcomes()
        batcher = TransactionBatcher(reg)
        for job, request in planned.items():
            marks = services[job].marks
            batcher.submit(
                request.ops, functools.partial(told.record, job), doomed=functools.partial(marks.doomed, request)
            )
        batcher.start()
        told.wait(len(JOBS), 10)
        batcher.close()
        assert batcher.commits == 0, "marks fenced on a lost registration were sent"
        for job, error in told.by_key.items():
            assert error is not None
            assert services[job].marks.refusal(planned[job], error).reason is FenceReason.REGISTRATION
    finally:
        for service in services.values():
            service.stop()
