"""A scheduler on ZooKeeper or etcd keeps its jobs' configs packed in its cache
(``scheduler.config_packing``) and reads them back as stored."""

from __future__ import annotations

import os
import uuid

import pytest

from registry.recipes.cache import TreeCache
from scheduler import JobConfig, Scheduler, ShardingContext
from scheduler.config_packing import ConfigPacking
from tests.harness import Harness

JOB_CONFIGS = [
    JobConfig(name="job-00001", cron="0 0 3 * * ?"),
    JobConfig(
        name="billing-export",
        cron="0 */5 * * * ?",
        sharding_total_count=4,
        sharding_item_parameters="0=Zürich,1=東京",
        failover=True,
        description="nightly export " * 40,
        props={"http.uri": "https://example.test/x", "retries": "3"},
    ),
]


@pytest.mark.parametrize("config", JOB_CONFIGS, ids=["default", "long"])
def test_a_config_packs_smaller_and_unpacks_to_what_was_stored(config: JobConfig) -> None:
    """Every field a default config has too is kept as a reference: a default job's
    config in under a fifth of its bytes; a config's own fields as they are."""
    packing = ConfigPacking()
    value = config.to_json()
    packed = packing.pack(f"/{config.name}/config", value)
    assert packed is not None and packing.unpack(packed) == value
    own = sum(len(piece) for piece in value.split(b',"') if piece not in packing._references)
    assert len(packed) < own + 4 * len(value.split(b',"'))
    if config is JOB_CONFIGS[0]:
        assert len(packed) < len(value) // 5


@pytest.mark.parametrize(
    "value",
    [
        JOB_CONFIGS[0].to_json().replace(b'"misfire":true,', b""),  # another release's fields
        JOB_CONFIGS[0].to_json().replace(b'"misfire":true', b'"misfire":true,"extra":",\\"x"'),
        JOB_CONFIGS[0].to_json() + b',"',  # not JSON: stored by hand, corrupt
        JOB_CONFIGS[0].to_json().replace(b"job-00001", "j\u00f6b-\u6771".encode()),
    ],
    ids=["other-fields", "extra-field", "corrupt", "non-ascii"],
)
def test_any_value_unpacks_to_itself(value: bytes) -> None:
    packing = ConfigPacking()
    packed = packing.pack("/job/config", value)
    assert packed is not None and packing.unpack(packed) == value


def test_only_a_job_config_that_packing_shrinks_is_packed() -> None:
    packing = ConfigPacking()
    value = JOB_CONFIGS[0].to_json()
    for path in ("/job/instances/i-1", "/job/config/x", "/config", "/job/sharding/assignment"):
        assert packing.pack(path, value) is None, path
    # a control byte (never in JSON text) could be taken for a marker: left as it is
    assert packing.pack("/job/config", value.replace(b"job-00001", b"job-\x01")) is None
    assert packing.pack("/job/config", os.urandom(600)) is None
    assert packing.pack("/job/config", b'{"a":1,"b":2}') is None  # saves too little


def _noop(ctx: ShardingContext) -> None:
    pass


def _kept(cache: TreeCache, path: str) -> bytes:
    entry = cache._nodes[path]
    assert not isinstance(entry, int)
    return entry if isinstance(entry, bytes) else entry[0]


@pytest.mark.parametrize("harness", ["zookeeper", "etcd"], indirect=True)
def test_a_restarted_job_adopts_its_stored_config_from_the_packed_form(harness: Harness) -> None:
    url = harness.url(harness.fresh_namespace())
    stored = JobConfig(name="restarted", cron="0 0 3 * * ?", sharding_total_count=2, failover=True)
    first = Scheduler(url)
    first.add_job(stored, _noop)
    first.start()
    first.shutdown()
    second = Scheduler(url)
    second.add_job(stored.with_changes(description="the local one", sharding_total_count=3), _noop)
    try:
        second.start()
        runner = second._runners[stored.name]
        assert runner.config == stored  # adopted: read from the cache
        runtime = second.runtime
        assert runtime is not None
        value = stored.to_json()
        assert runtime.cache.get(runner.paths.config) == value
        assert len(_kept(runtime.cache, runner.paths.config)) < len(value) // 3
    finally:
        second.shutdown()


def test_a_scheduler_on_memory_keeps_the_stores_own_config_objects() -> None:
    """On memory the cache holds the object the store holds: a packed copy would add."""
    sched = Scheduler(f"memory://config-packing-{uuid.uuid4().hex}")
    sched.add_job(JOB_CONFIGS[0], _noop)
    try:
        sched.start()
        runtime = sched.runtime
        assert runtime is not None
        path = sched._runners[JOB_CONFIGS[0].name].paths.config
        assert _kept(runtime.cache, path) is sched.registry.get(path)
    finally:
        sched.shutdown()
