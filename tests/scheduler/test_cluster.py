"""``Cluster`` on memory, ZooKeeper and etcd, against schedulers of this process: the views
follow the cluster as it changes, and every operator action does what it says, lands
whole even when raced, and refuses bad input naming it with nothing written.

Real worker processes (SIGKILL, restarts) are in ``tests/scenarios/test_cluster_workers.py``.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from registry.counting import CountingRegistry
from scheduler import (
    Cluster,
    ItemStatus,
    JobStatus,
    LiveInstances,
    NoSuchJob,
    Scheduler,
)
from tests.harness import Harness
from tests.scheduler.cluster_kit import EVERY_SECOND, JOB, PATHS, A, B, Runs, config, owners, start
from tests.waiting import holds_for, wait_for


def test_views_follow_instances_joining_and_leaving(
    harness: Harness, namespace: str, made: list[Scheduler], cluster: Cluster
) -> None:
    runs = Runs()
    a = start(harness, made, namespace, A, config(sharding_item_parameters="0=x,3=y", description="d"), runs)
    wait_for(lambda: set(owners(cluster).values()) == {A}, 15, message=lambda: repr(cluster.job(JOB)))
    [brief] = cluster.jobs()
    assert (brief.name, brief.status, brief.cron, brief.sharding_total_count, brief.instances, brief.description) == (
        JOB,
        JobStatus.OK,
        EVERY_SECOND,
        4,
        1,
        "d",
    )
    start(harness, made, namespace, B, config(), runs)
    wait_for(lambda: set(owners(cluster).values()) == {A, B}, 15, message=lambda: repr(cluster.job(JOB)))
    detail = cluster.job(JOB)
    assert detail.leader == A and detail.epoch is not None and detail.epoch >= 2
    assert [(i.id, i.ip, i.enabled, i.leader) for i in detail.instances] == [
        (A, "10.0.0.1", True, True),
        (B, "10.0.0.2", True, False),
    ]
    assert [v.parameter for v in detail.items] == ["x", "", "", "y"]
    assert sorted(i for v in detail.instances for i in v.items) == [0, 1, 2, 3]
    servers = {s.ip: s for s in cluster.servers()}
    assert {ip: (s.instances, s.jobs, s.disabled_jobs, s.online) for ip, s in servers.items()} == {
        "10.0.0.1": (1, 1, 0, True),
        "10.0.0.2": (1, 1, 0, True),
    }
    a.shutdown(wait=True)
    wait_for(lambda: set(owners(cluster).values()) == {B}, 15, message=lambda: repr(cluster.job(JOB)))
    assert cluster.job(JOB).leader == B


def test_a_running_item_and_a_resharding_that_waits_for_it_are_shown(
    harness: Harness, namespace: str, made: list[Scheduler], cluster: Cluster
) -> None:
    runs = Runs()
    runs.hold.clear()  # every run blocks until released
    start(harness, made, namespace, A, config(sharding_total_count=2), runs)
    running = wait_for(
        lambda: [v for v in cluster.job(JOB).items if v.status is ItemStatus.RUNNING],
        15,
        message=lambda: repr(cluster.job(JOB)),
    )
    assert {v.instance for v in running} == {A} and all(v.fire_time is not None for v in running)
    assert cluster.job(JOB).instances[0].running_fire is not None
    start(harness, made, namespace, B, config(sharding_total_count=2), runs)  # the leader must wait for A's run
    wait_for(
        lambda: cluster.job(JOB).status is JobStatus.SHARDING_FLAG, 15, message=lambda: repr(cluster.job(JOB))
    )
    detail = cluster.job(JOB)
    assert {v.status for v in detail.items} <= {ItemStatus.RUNNING, ItemStatus.SHARDING_FLAG}
    runs.hold.set()
    wait_for(lambda: cluster.job(JOB).status is JobStatus.OK, 15, message=lambda: repr(cluster.job(JOB)))


def test_a_disabled_item_stops_running_from_the_next_fire_and_stays_disabled_across_a_restart(
    harness: Harness, namespace: str, made: list[Scheduler], cluster: Cluster
) -> None:
    runs = Runs()
    a = start(harness, made, namespace, A, config(sharding_total_count=2), runs)
    wait_for(lambda: runs.items_after(0) == {0, 1}, 15)
    cluster.disable(JOB, items=[1])
    assert [v.status for v in cluster.job(JOB).items][1] is ItemStatus.DISABLED
    after = runs.last_fire()  # a fire may be under way
    wait_for(lambda: len(runs.fires_after(after)) >= 2, 15)
    assert runs.items_after(after + 1) == {0}
    a.shutdown(wait=True)
    restarted = start(harness, made, namespace, A, config(sharding_total_count=2), runs)
    begun = runs.last_fire()
    wait_for(lambda: len(runs.fires_after(begun)) >= 2, 15)
    assert runs.items_after(begun) == {0}
    cluster.enable(JOB, items=[1])
    wait_for(lambda: 1 in runs.items_after(begun), 15)
    assert restarted.running


def test_a_disabled_server_stays_disabled_across_a_restart(
    harness: Harness, namespace: str, made: list[Scheduler], cluster: Cluster
) -> None:
    runs = Runs()
    start(harness, made, namespace, A, config(), runs)
    b = start(harness, made, namespace, B, config(), runs)
    wait_for(lambda: set(owners(cluster).values()) == {A, B}, 15)
    cluster.disable(JOB, server="10.0.0.2")
    wait_for(lambda: set(owners(cluster).values()) == {A}, 15)
    b.shutdown(wait=True)
    start(harness, made, namespace, B, config(), runs)  # its config says enabled
    wait_for(lambda: B in {i.id for i in cluster.job(JOB).instances}, 15)
    holds_for(lambda: set(owners(cluster).values()) == {A}, 2.0, message=lambda: repr(cluster.job(JOB)))
    assert [(s.ip, s.disabled_jobs) for s in cluster.servers()] == [("10.0.0.1", 0), ("10.0.0.2", 1)]
    cluster.enable(JOB, server="10.0.0.2")
    wait_for(lambda: set(owners(cluster).values()) == {A, B}, 15)


def test_disabling_the_job_disables_every_server_and_servers_that_join_later(
    harness: Harness, namespace: str, made: list[Scheduler], cluster: Cluster
) -> None:
    runs = Runs()
    start(harness, made, namespace, A, config(), runs)
    wait_for(lambda: cluster.job(JOB).status is JobStatus.OK, 15)
    cluster.disable(JOB)
    wait_for(lambda: cluster.job(JOB).status is JobStatus.DISABLED, 15)
    assert cluster.config(JOB).disabled
    start(harness, made, namespace, B, config(), runs)
    wait_for(lambda: len(cluster.job(JOB).instances) == 2, 15)
    assert [i.enabled for i in cluster.job(JOB).instances] == [False, False]
    cluster.enable(JOB)
    wait_for(lambda: set(owners(cluster).values()) == {A, B}, 15)
    assert not cluster.config(JOB).disabled


def test_config_update_reshards_the_running_cluster(
    harness: Harness, namespace: str, made: list[Scheduler], cluster: Cluster
) -> None:
    runs = Runs()
    start(harness, made, namespace, A, config(sharding_total_count=2), runs)
    start(harness, made, namespace, B, config(sharding_total_count=2), runs)
    wait_for(lambda: set(owners(cluster).values()) == {A, B}, 15)
    updated = cluster.update_config(JOB, sharding_total_count=5, job_parameter="p")
    assert updated.sharding_total_count == 5 and cluster.config(JOB) == updated
    wait_for(lambda: len(owners(cluster)) == 5 and None not in owners(cluster).values(), 15)
    changed = runs.last_fire()
    wait_for(lambda: runs.items_after(changed) == {0, 1, 2, 3, 4}, 15)


def test_two_operators_changing_different_fields_both_land(harness: Harness, namespace: str, made: list[Scheduler]) -> None:
    runs = Runs()
    start(harness, made, namespace, A, config(), runs)
    url = harness.url(namespace)
    with Cluster(url) as first, Cluster(url) as second:
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def change(cluster: Cluster, field: str, values: list[str]) -> None:
            try:
                barrier.wait(5)
                for value in values:
                    fields: dict[str, Any] = {field: value}
                    cluster.update_config(JOB, **fields)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [
            threading.Thread(target=change, args=(first, "description", [f"d{i}" for i in range(15)])),
            threading.Thread(target=change, args=(second, "job_parameter", [f"p{i}" for i in range(15)])),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        stored = first.config(JOB)
        assert (stored.description, stored.job_parameter) == ("d14", "p14")


def test_remove_is_refused_while_instances_run_the_job_and_force_shuts_them_down(
    harness: Harness, namespace: str, made: list[Scheduler], cluster: Cluster
) -> None:
    runs = Runs()
    a = start(harness, made, namespace, A, config(), runs)
    wait_for(lambda: cluster.job(JOB).status is JobStatus.OK, 15)
    with pytest.raises(LiveInstances, match=A):
        cluster.remove(JOB)
    assert [b.name for b in cluster.jobs()] == [JOB]
    cluster.remove(JOB, force=True, timeout=30)
    assert cluster.jobs() == []
    assert a.shut_down_jobs.keys() == {JOB}
    with pytest.raises(NoSuchJob):
        cluster.job(JOB)


def test_shutdown_of_one_instance_moves_its_items_and_it_stays_down(
    harness: Harness, namespace: str, made: list[Scheduler], cluster: Cluster
) -> None:
    runs = Runs()
    a = start(harness, made, namespace, A, config(), runs)
    start(harness, made, namespace, B, config(), runs)
    wait_for(lambda: set(owners(cluster).values()) == {A, B}, 15)
    assert cluster.shutdown(JOB, instance=A, timeout=30) == [A]
    wait_for(lambda: set(owners(cluster).values()) == {B}, 15)
    assert JOB in a.shut_down_jobs and a.running
    gone = runs.last_fire()
    wait_for(lambda: len(runs.fires_after(gone)) >= 2, 15)
    assert runs.items_after(gone + 1, A) == set()
    assert PATHS.shutdown(A) not in cluster.state(JOB).nodes  # consumed
    with pytest.raises(ValueError, match="no live instance"):
        cluster.shutdown(JOB, instance=A)


def test_trigger_runs_every_item_once_more(
    harness: Harness, namespace: str, made: list[Scheduler], cluster: Cluster
) -> None:
    runs = Runs()
    start(harness, made, namespace, A, config(cron=None, sharding_total_count=3), runs)
    start(harness, made, namespace, B, config(cron=None, sharding_total_count=3), runs)
    wait_for(lambda: set(owners(cluster).values()) == {A, B}, 15)
    assert cluster.trigger(JOB) == [A, B]
    wait_for(lambda: len(runs.rows) == 3, 15)
    with runs.lock:
        assert sorted(item for _, _, item in runs.rows) == [0, 1, 2]


def test_bad_input_is_refused_naming_it_and_nothing_changes(
    harness: Harness, namespace: str, made: list[Scheduler], cluster: Cluster
) -> None:
    runs = Runs()
    start(harness, made, namespace, A, config(), runs)
    wait_for(lambda: cluster.job(JOB).status is JobStatus.OK, 15)
    before = cluster.dump(JOB)["nodes"]["/job/config"]
    with pytest.raises(ValueError, match="job name 'a/b'"):
        cluster.job("a/b")
    with pytest.raises(NoSuchJob, match="'nope'"):
        cluster.disable("nope")
    with pytest.raises(NoSuchJob):
        cluster.update_config("nope", description="x")
    with pytest.raises(ValueError, match="no such configuration field: colour"):
        cluster.update_config(JOB, colour="red")
    with pytest.raises(ValueError, match="sharding_total_count 0"):
        cluster.update_config(JOB, sharding_total_count=0)
    with pytest.raises(ValueError, match="cron 'every day'"):
        cluster.update_config(JOB, cron="every day")
    with pytest.raises(ValueError, match="name: cannot be changed"):
        cluster.update_config(JOB, name="other")
    with pytest.raises(ValueError, match=r"items \[9\]"):
        cluster.disable(JOB, items=[9])
    with pytest.raises(ValueError, match=r"no server '10\.9\.9\.9'"):
        cluster.disable(JOB, server="10.9.9.9")
    assert cluster.dump(JOB)["nodes"]["/job/config"] == before
    assert not any(p.startswith("/nope") for p in cluster.registry.read_tree("/"))


def test_a_corrupt_node_is_reported_and_the_rest_still_shown(
    harness: Harness, namespace: str, made: list[Scheduler], cluster: Cluster
) -> None:
    runs = Runs()
    start(harness, made, namespace, A, config(), runs)
    wait_for(lambda: cluster.job(JOB).status is JobStatus.OK, 15)
    cluster.registry.put(PATHS.disabled_items, b"\xff not ranges")
    cluster.registry.put(PATHS.server("10.9.9.9"), b"MAYBE")
    detail = cluster.job(JOB)
    assert [i.id for i in detail.instances] == [A]
    assert any(PATHS.disabled_items in p for p in detail.problems)
    assert any("10.9.9.9" in p and "MAYBE" in p for p in detail.problems)
    dumped = cluster.dump(JOB)["nodes"]
    assert dumped[PATHS.disabled_items]["value"] == b"\xff not ranges"  # raw: not text
    assert dumped[PATHS.config]["value"]["name"] == JOB  # decoded: the layout's JSON


def test_the_leader_stamps_a_vacant_server_and_deletes_it_after_the_expiry(
    harness: Harness, namespace: str, made: list[Scheduler], cluster: Cluster
) -> None:
    runs = Runs()
    start(harness, made, namespace, A, config(reconcile_interval_minutes=0.02, server_expiry_minutes=0.05), runs)
    wait_for(lambda: cluster.job(JOB).status is JobStatus.OK, 15)
    cluster.registry.put(PATHS.server("10.9.9.9"), b"DISABLED")  # a server whose pods are gone
    stamped = wait_for(
        lambda: [s for s in cluster.servers() if s.ip == "10.9.9.9" and s.last_seen is not None], 15
    )
    assert not stamped[0].online and stamped[0].disabled_jobs == 1
    wait_for(lambda: "10.9.9.9" not in {s.ip for s in cluster.servers()}, 30)
    assert [s.ip for s in cluster.servers()] == ["10.0.0.1"]  # an occupied server stays


def test_reads_cost_one_read_of_the_registry_whatever_the_size(
    harness: Harness, namespace: str, made: list[Scheduler]
) -> None:
    runs = Runs()
    start(harness, made, namespace, A, config(sharding_total_count=50), runs)
    start(harness, made, namespace, B, config(sharding_total_count=50), runs)
    counting = CountingRegistry(harness.connect(namespace))
    with Cluster(counting) as cluster:
        wait_for(lambda: set(owners(cluster).values()) == {A, B}, 15)
        counting.reset()
        cluster.job(JOB)
        cluster.jobs()
        cluster.servers()
        assert counting.round_trips == 3
        assert dict(counting.calls) == {"read_tree": 3}
