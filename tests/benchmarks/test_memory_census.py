"""``benchmarks.memory_census``: what a job adds to a process, by the code that allocated
it, on each registry beside APScheduler. No size is asserted as a target (targets are
benchmark figures); these prove the census counts what it names."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import cast

import pytest

import registry
from benchmarks import memory_census
from benchmarks.memory_census import COMPONENTS, OTHER, component, floor_jobs, floor_template, per_job
from scheduler import JobConfig, Scheduler
from tests.servers.etcd import EtcdServer
from tests.servers.external import ExternalServer
from tests.servers.zookeeper import ZooKeeperServer


@pytest.mark.parametrize(
    ("filename", "label"),
    [
        ("/x/sharding/registry/paths.py", "paths"),
        ("/x/sharding/sharding/layout.py", "paths"),
        ("/x/sharding/registry/recipes/cache.py", "cache"),
        ("/x/sharding/registry/children.py", "cache"),
        ("/x/sharding/registry/backends/etcd_watch.py", "watch and backend"),
        ("/x/sharding/.venv/lib/python3.11/site-packages/kazoo/client.py", "client library"),
        ("/venv/lib/python3.11/site-packages/pyetcd/events.py", "client library"),
        ("/x/sharding/registry/recipes/election.py", "sharding"),
        ("/x/sharding/sharding/service.py", "sharding"),
        ("/x/sharding/scheduler/runner.py", "scheduler"),
        # below a checkout whose own folder is named like one of our packages
        ("/x/sharding/.venv/lib/python3.11/site-packages/apscheduler/schedulers/base.py", "apscheduler"),
        ("/usr/lib/python3.11/threading.py", OTHER),
        ("/x/sharding/tests/harness.py", OTHER),
    ],
)
def test_each_file_is_counted_under_the_part_that_owns_it(filename: str, label: str) -> None:
    assert component(filename, root=Path("/x/sharding")) == label


def test_every_label_is_distinct_and_other_is_not_one_of_them() -> None:
    labels = [label for label, _ in COMPONENTS]
    assert len(set(labels)) == len(labels)
    assert OTHER not in labels


def test_growth_per_job_is_the_difference_over_the_jobs_added() -> None:
    small = {"jobs": 100, "bytes": {"rss": 1_000_000.0, "heap": 500_000.0, "cache": None}}
    large = {"jobs": 500, "bytes": {"rss": 3_000_000.0, "heap": 2_100_000.0, "cache": 40_000.0}}
    assert per_job(small, large) == {"rss": 5000.0, "heap": 4000.0, "cache": None}
    with pytest.raises(ValueError, match="more jobs than the small one: 500 -> 100"):
        per_job(large, small)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--jobs", "100"], "two job counts"),
        (["--jobs", "500,100"], "0 < SMALL < LARGE"),
        (["--jobs", "a,b"], "two job counts"),
        (["--backends", "memory,redis"], "unknown backend"),
    ],
)
def test_bad_arguments_are_refused_by_name(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        memory_census.parse_args(argv)
    assert message in capsys.readouterr().err


def test_apscheduler_is_always_measured_as_the_anchor() -> None:
    assert memory_census.parse_args(["--backends", "memory"]).backends == ["memory", "apscheduler"]


def test_the_floor_holds_each_node_of_a_started_job_as_its_own_value_and_version() -> None:
    cron = "0 0 1 * * ?"
    heap, timer = floor_jobs(3, cron, floor_template(cron))
    assert sorted(heap) == heap and len(heap) == len(timer) == 3
    # the nodes a job started here has, read independently of the floor's template
    store = "memory://census-floor-nodes-test"
    sched = Scheduler(store)
    sched.add_job(JobConfig(name="job-x", cron=cron), lambda ctx: None)
    sched.start()
    try:
        with registry.connect(store) as reg:
            started = reg.read_tree("/job-x")
    finally:
        sched.shutdown()
    mirrors = {}
    for (name, what), (due, _, (config, schedule, mirror)) in timer.items():
        assert what == "fire" and config.name == name and schedule is not None
        assert due > time.time()
        assert len(mirror) == len(started)
        assert sum(not isinstance(entry, int) for entry in mirror) == sum(bool(n.value) for n in started.values())
        mirrors[name] = mirror
    values = {name: [entry[0] for entry in m if isinstance(entry, tuple)] for name, m in mirrors.items()}
    versions = [
        entry if isinstance(entry, int) else cast("tuple[bytes, int]", entry)[1]
        for m in mirrors.values()
        for entry in m
    ]
    # each job's values are its own: its config names it, as a started job's does
    assert all(any(b'"name":"%s"' % name.encode() in v for v in vals) for name, vals in values.items())
    # no value object or version object is shared between jobs: each is the job's own
    first, second = list(values.values())[:2]
    assert all(a is not b for a, b in zip(first, second, strict=True))
    assert len(set(versions)) == len(versions) and min(versions) > 256


@pytest.mark.slow
def test_a_quick_census_counts_every_registry_and_the_anchor(
    tmp_path: Path,
    zk_server: ZooKeeperServer | ExternalServer,
    etcd_server: EtcdServer | ExternalServer,
) -> None:
    argv = ["--quick", "--jobs", "10,60", "--out", str(tmp_path)]
    payload = memory_census.main([*argv, "--zk", zk_server.address, "--etcd", etcd_server.address])
    written = json.loads((tmp_path / "memory_census.json").read_text())
    assert written["results"] == payload["results"]
    found = {r["backend"]: r for r in payload["results"]}
    assert list(found) == ["memory", "zookeeper", "etcd", "floor", "apscheduler"]
    for backend, result in found.items():
        growth = result["bytes_per_job"]
        assert result["jobs"] == [10, 60]
        assert result["rss_mib"]["10"] > 0 and result["rss_mib"]["60"] > 0, backend
        # the heap's parts add up to it: nothing counted twice or lost by the grouping
        parts = sum(value for key, value in growth.items() if key not in ("rss", "heap") and value is not None)
        assert parts == pytest.approx(growth["heap"], abs=1.0), (backend, growth)
        assert growth["heap"] > 0, (backend, growth)
        # each scheduler's own per-job state shows under its own part, never the other's
        if backend == "apscheduler":
            assert growth["apscheduler"] > 0 and growth["scheduler"] == growth["sharding"] == 0, growth
        elif backend == "floor":  # a job's bare state: no mirror, watch or sharding objects
            machinery = ("paths", "cache", "watch and backend", "client library", "sharding", "apscheduler")
            assert all(growth[part] == 0 for part in machinery), growth
            # its configs, timer entries and node values, which the census itself makes (a
            # parsed cron is shared by the jobs of one expression, and so are empty props)
            assert growth["other"] > 0, growth
        else:
            assert growth["scheduler"] > 0 and growth["sharding"] > 0, (backend, growth)
            assert growth["apscheduler"] == 0, (backend, growth)
    # etcd's client decodes each value the cache keeps
    assert found["etcd"]["bytes_per_job"]["client library"] > 0
    # each child's jobs were deleted from its server once it ended
    for server in (f"zk://{zk_server.address}", f"etcd://{etcd_server.address}"):
        with registry.connect(server) as root:
            left = [name for name in root.children("/") if name.startswith("bench-census-")]
        assert left == [], (server, left)
