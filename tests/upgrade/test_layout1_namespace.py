"""This release on a namespace that release 0.1.0 (layout 1, no layout node) wrote and left.

``data/layout1-namespace.json`` is the whole namespace as 0.1.0 (commit 25fe7ee, tag
v0.1.0) left it after running two jobs on ``memory://`` and stopping: job ``settle-orders``
(4 items with parameters, failover on, item 3 disabled by an operator, the persistent
running mark of its departed instance) and ``nightly-report``. It is stored as data, not
produced by this release, so that a change of layout that forgets the old one fails here.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from registry.backends.base import BaseRegistry
from scheduler import Scheduler, ShardingContext
from scheduler.cluster import Cluster
from sharding.layout_version import LAYOUT, LAYOUT_NODE
from tests.harness import Harness
from tests.waiting import wait_for

FIXTURE = Path(__file__).parent / "data" / "layout1-namespace.json"
JOB = "settle-orders"


def load_namespace(reg: BaseRegistry, fixture: Path = FIXTURE) -> dict[str, bytes]:
    """Write the fixture's nodes (parents first); returns path -> value as stored."""
    nodes = json.loads(fixture.read_text(encoding="utf-8"))
    assert not any(node["ephemeral"] for node in nodes.values()), "a stopped fleet leaves no ephemeral node"
    values = {path: node["value"].encode() for path, node in nodes.items()}
    for path in sorted(values, key=lambda p: p.count("/")):
        if reg.exists(path):
            reg.put(path, values[path])
        else:
            reg.create(path, values[path])
    return values


def test_this_release_takes_over_a_layout1_namespace(
    harness: Harness, namespace: str, made: list[Scheduler]
) -> None:
    reg = harness.connect(namespace)
    stored = load_namespace(reg)
    assert reg.get_node(LAYOUT_NODE) is None
    ran: list[tuple[int, str | None, int, float]] = []
    lock = threading.Lock()

    sched = Scheduler(harness.url(namespace), instance_id="new-1")
    made.append(sched)

    # the stored configuration (4 items, parameters) wins over this local one
    @sched.job(name=JOB, cron="* * * * * ?", sharding_total_count=2)
    def settle(ctx: ShardingContext) -> None:
        with lock:
            ran.append((ctx.sharding_item, ctx.sharding_parameter, ctx.epoch, ctx.fire_time))

    sched.start()

    def two_complete_fires() -> list[float]:
        with lock:
            by_fire: dict[float, set[int]] = {}
            for item, _, _, fire in ran:
                by_fire.setdefault(fire, set()).add(item)
        return [fire for fire, items in sorted(by_fire.items()) if items >= {0, 1, 2}][:2]

    wait_for(lambda: len(two_complete_fires()) == 2, 20, message=lambda: f"ran {ran}")
    with lock:
        runs = list(ran)
    assert {item for item, *_ in runs} == {0, 1, 2}, "item 3 stays disabled"
    assert {(item, parameter) for item, parameter, *_ in runs} == {(0, "north"), (1, "south"), (2, "east")}
    assert min(epoch for _, _, epoch, _ in runs) > 1, "the epoch goes on from the stored one"
    wait_for(lambda: reg.get_node(LAYOUT_NODE) is not None, 10, message="the layout was never recorded")
    layout_node = reg.get_node(LAYOUT_NODE)
    assert layout_node is not None and json.loads(layout_node.value)["layout"] == LAYOUT

    # the job this release does not run is untouched, and both are listed as jobs
    assert reg.get("/nightly-report/config") == stored["/nightly-report/config"]
    assert reg.get("/nightly-report/sharding/assignment") == stored["/nightly-report/sharding/assignment"]
    with Cluster(reg) as cluster:
        assert [job.name for job in cluster.jobs()] == ["nightly-report", JOB]
