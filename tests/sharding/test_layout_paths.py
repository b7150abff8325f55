"""A job's paths are stored once in the process: ``JobPaths`` hands out the same ``str``
(``registry.paths.shared``) that the scheduler's cache keys the job's nodes by, so the
dozen paths of each of thousands of jobs are not held a second time by the job's objects."""

from __future__ import annotations

from scheduler import Scheduler
from sharding.layout import JobPaths
from tests.harness import Harness
from tests.scheduler.cluster_kit import JOB, A, Runs, config, start
from tests.waiting import wait_for


def test_a_job_and_the_cache_hold_the_same_path_objects(
    harness: Harness, made: list[Scheduler], namespace: str
) -> None:
    sched = start(harness, made, namespace, A, config(), Runs())
    runner = sched.runner(JOB)
    assert sched.runtime is not None
    cache = sched.runtime.cache
    membership = runner.sharding.membership
    held = {
        "config": runner.paths.config,
        "assignment": runner.paths.assignment,
        "instance": membership.path,
        "server": membership.server_path,
    }
    wait_for(lambda: all(cache.exists(path) for path in held.values()), 15, message="the job's nodes cached")
    keys = {key: key for key in cache._nodes}
    for name, path in held.items():
        assert keys[path] is path, f"{name}: the cache keeps a copy of {path!r}"
    fresh = JobPaths(JOB)  # a second JobPaths (another job object, a Cluster) shares them too
    assert fresh.config is runner.paths.config and fresh.instance(A) is membership.path
