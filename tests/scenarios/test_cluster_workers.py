"""``Cluster`` watching and steering real ``shardjob worker`` processes on ZooKeeper and etcd:
a crash shows within the session timeout, an operator's item disable outlives the
owner's restart, and a configuration change reshards the live fleet with no item run
twice or on two instances at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler import Cluster, ItemStatus, JobStatus
from tests.harness import Harness
from tests.scenarios.checks import doubled_runs, overlapping_runs
from tests.scenarios.workers import Fleet
from tests.waiting import wait_for

SESSION_TIMEOUT = 2
TOTAL = 4
JOB = "job"
W1, W2 = "10.0.0.1@-@1", "10.0.0.2@-@2"
#: how long past the session timeout the registry may take to expire a session and the
#: view to show it (ZooKeeper checks sessions on ticks; etcd on lease expiry checks)
EXPIRY_SLACK = 3.0


@pytest.fixture
def namespace(server: Harness) -> str:
    return server.fresh_namespace()


@pytest.fixture
def fleet(server: Harness, namespace: str, tmp_path: Path) -> Iterator[Fleet]:
    made = Fleet(server.url(namespace, session_timeout=SESSION_TIMEOUT), tmp_path, job=JOB, total=TOTAL, hold=0.2)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def cluster(server: Harness, namespace: str) -> Iterator[Cluster]:
    with Cluster(server.url(namespace)) as made:
        yield made


def instances(cluster: Cluster) -> set[str]:
    return {view.id for view in cluster.job(JOB).instances}


def test_a_crash_shows_within_the_session_timeout(fleet: Fleet, cluster: Cluster) -> None:
    fleet.start(W1, W2)
    wait_for(lambda: instances(cluster) == {W1, W2} and cluster.job(JOB).status is JobStatus.OK, 20)
    killed = time.monotonic()
    fleet.worker(W2).kill()
    wait_for(lambda: instances(cluster) == {W1}, SESSION_TIMEOUT + EXPIRY_SLACK, message=lambda: repr(cluster.job(JOB)))
    seen = time.monotonic() - killed
    wait_for(lambda: {v.instance for v in cluster.job(JOB).items} == {W1}, 20)
    fleet.worker(W1).kill()
    wait_for(
        lambda: cluster.job(JOB).status is JobStatus.CRASHED,
        SESSION_TIMEOUT + EXPIRY_SLACK,
        message=lambda: repr(cluster.job(JOB)),
    )
    [brief] = cluster.jobs()
    assert brief.status is JobStatus.CRASHED and brief.instances == 0
    assert seen <= SESSION_TIMEOUT + EXPIRY_SLACK


def test_an_item_disabled_by_an_operator_stays_disabled_when_its_owner_restarts(
    fleet: Fleet, cluster: Cluster
) -> None:
    [worker] = fleet.start(W1)
    wait_for(lambda: {r.item for r in fleet.records()} == set(range(TOTAL)), 20)
    cluster.disable(JOB, items=[1])
    disabled_at = time.time()
    assert worker.terminate() == 0
    fleet.workers.remove(worker)
    [again] = fleet.start(W1)  # the same instance id, a new process
    assert cluster.job(JOB).items[1].status is ItemStatus.DISABLED
    wait_for(lambda: len({r.fire_time for r in again.records() if r.start > disabled_at + 1}) >= 3, 20)
    late = [r for r in again.records() if r.fire_time > disabled_at + 1]
    assert {r.item for r in late} == {0, 2, 3}, late


def test_a_config_change_reshards_the_live_fleet_with_no_overlap(fleet: Fleet, cluster: Cluster) -> None:
    fleet.start(W1, W2)
    wait_for(lambda: {v.instance for v in cluster.job(JOB).items} == {W1, W2}, 20)
    cluster.update_config(JOB, sharding_total_count=6)
    changed = time.time()
    wait_for(
        lambda: {r.item for r in fleet.records() if r.fire_time > changed} == set(range(6)),
        20,
        message=lambda: repr(cluster.job(JOB)),
    )
    detail = cluster.job(JOB)
    assert len(detail.items) == 6 and {v.instance for v in detail.items} == {W1, W2}
    records = fleet.records()
    assert doubled_runs(records) == []
    assert overlapping_runs(records) == []
