"""``LiveView`` (the console's watch-fed read model) reports exactly what ``Cluster``
reports, on every backend: the same briefs, details and servers once the watch has caught
up, and it follows changes (operator writes, a job removed, a node that does not decode)."""

from __future__ import annotations

from typing import Any

from scheduler import Cluster, JobConfig, Scheduler
from scheduler.cluster_json import brief_json, detail_json, server_json
from scheduler.console.live_view import LiveView
from sharding.layout import JobPaths
from tests.harness import Harness
from tests.scheduler.cluster_kit import A, B, Runs, start
from tests.waiting import wait_for

#: one-off jobs: nothing fires, so the views hold still and can be compared whole
JOBS = ("alpha", "beta", "gamma")


def snapshot(source: Cluster | LiveView) -> dict[str, Any]:
    servers = [server_json(s) for s in source.servers()]
    for server in servers:  # an online server is "seen now": the time of the call
        if server["online"]:
            server["last_seen"] = None
    return {
        "jobs": [brief_json(b) for b in source.jobs()],
        "details": {b.name: detail_json(source.job(b.name)) for b in source.jobs()},
        "servers": servers,
    }


def test_live_view_reports_what_cluster_reports(
    harness: Harness, namespace: str, made: list[Scheduler], cluster: Cluster
) -> None:
    runs = Runs()
    for name in JOBS:
        job = JobConfig(name=name, sharding_total_count=3, sharding_item_parameters="0=a,1=b,2=c", description=name)
        start(harness, made, namespace, A, job, runs)
        start(harness, made, namespace, B, job, runs)
    reg = harness.connect(namespace)
    with LiveView(reg) as view:
        wait_for(lambda: len(cluster.job("gamma").instances) == 2, 20)
        wait_for(lambda: snapshot(view) == snapshot(cluster), 10, message=lambda: f"{snapshot(view)}\n!=\n{snapshot(cluster)}")

        cluster.disable("alpha", items=[1])
        cluster.disable("beta", server="10.0.0.2")
        cluster.update_config("gamma", description="changed")
        wait_for(lambda: snapshot(view) == snapshot(cluster), 10, message=lambda: f"{snapshot(view)}\n!=\n{snapshot(cluster)}")
        assert view.job("alpha").items[1].status.name == "DISABLED"
        assert view.job("gamma").brief.description == "changed"

        # a node that does not decode is a problem of its job, reported alike
        paths = JobPaths("beta")
        reg.put(paths.disabled_items, b"not-items")
        # a subtree that is not a job (no configuration) is no job for either
        reg.put("/stray/x", b"1")
        wait_for(lambda: snapshot(view) == snapshot(cluster), 10, message=lambda: f"{snapshot(view)}\n!=\n{snapshot(cluster)}")
        assert view.job("beta").problems

        for sched in made:
            sched.shutdown(wait=True)
        cluster.remove("alpha")
        wait_for(lambda: [b.name for b in view.jobs()] == ["beta", "gamma"], 20, message=lambda: repr(view.jobs()))
        wait_for(lambda: snapshot(view) == snapshot(cluster), 10, message=lambda: f"{snapshot(view)}\n!=\n{snapshot(cluster)}")
