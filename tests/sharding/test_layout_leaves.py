"""``layout.is_leaf`` names the nodes of a job that never have children: every cache of a
job's subtree follows them without a child watch, so a child written below one would be
hidden from every instance. The names are checked one by one, and against what a live
cluster writes (on memory: the layout is the same on every backend)."""

from __future__ import annotations

import pytest

from registry.paths import parent
from scheduler import Cluster, Scheduler
from sharding.layout import SYSTEM_ROOT, JobPaths, is_leaf
from tests.harness import Harness
from tests.scheduler.cluster_kit import JOB, PATHS, A, B, Runs, config, start
from tests.waiting import wait_for


def test_is_leaf_names_the_childless_nodes_of_any_job() -> None:
    paths = JobPaths("nightly-totals")
    term = f"{parent(paths.leader)}/term"
    leaves = [
        paths.config, paths.instance("10.0.0.1@-@a"), paths.server("10.0.0.1"), paths.leader, term,
        paths.necessary, paths.failover_items, paths.assignment, paths.disabled_items, paths.trigger("a"),
        paths.shutdown("a"),
    ]  # fmt: skip
    inner = [
        "/", paths.root, paths.instances, paths.servers, parent(paths.leader), parent(parent(paths.leader)),
        parent(paths.necessary), parent(paths.assignment), paths.running, paths.guarantee, paths.failover,
        paths.triggers, paths.shutdowns, SYSTEM_ROOT, f"{paths.config}/x",
        f"{paths.instances}/a/b",
    ]  # fmt: skip
    assert [p for p in leaves if not is_leaf(p)] == []
    assert [p for p in inner if is_leaf(p)] == []


@pytest.mark.parametrize("harness", ["memory"], indirect=True)
def test_no_node_a_live_cluster_writes_lies_below_a_leaf(
    harness: Harness, made: list[Scheduler], namespace: str, cluster: Cluster
) -> None:
    runs = Runs()
    job = config(failover=True, sharding_item_parameters="0=north")
    start(harness, made, namespace, A, job, runs)
    start(harness, made, namespace, B, job, runs)
    runs.last_fire()
    cluster.disable(JOB, items=[3])
    cluster.disable(JOB, server="10.0.0.2")
    runs.hold.clear()  # runs in progress: the running marks are there too
    # a run held now, whichever fire it is: a run already under way when the hold began
    # may be the last to start (the job's next fire waits for its end, the resharding for
    # the disabled server's run), so no later fire need come
    wait_for(lambda: runs.in_progress > 0, 15, message="no run held after the hold began")
    cluster.trigger(JOB)
    reg = made[0].registry
    tree = reg.read_tree("/")
    runs.hold.set()
    kinds = {path.split("/", 2)[2] for path in tree if path.startswith(PATHS.root + "/")}
    assert {"config", "sharding/assignment", "sharding/disabled", "leader/election/term"} <= kinds, sorted(kinds)
    assert [p for p in tree if is_leaf(p)], sorted(tree)
    assert [p for p in tree if p != "/" and is_leaf(parent(p))] == [], sorted(tree)
