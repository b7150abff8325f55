"""What a started job keeps in its process, counted in objects (issue #14: at 10,000 jobs
a process must hold at most 1.5 x APScheduler's memory; the bytes are measured by
``benchmarks.memory_census``, these tests pin the shapes that keep them down)."""

from __future__ import annotations

import collections
import functools
import gc
import types
import uuid

from registry import shared_values
from registry.paths import is_below
from scheduler import JobConfig, Scheduler, ShardingContext
from scheduler.runner import JobRunner
from sharding.service import ShardingService
from tests.harness import Harness
from tests.waiting import wait_for

JOBS = 40
#: jobs of the tests run on every backend (a start on ZooKeeper or etcd costs round trips)
BACKEND_JOBS = 10
#: the bound methods a job's objects hand out as callbacks: its runner's timer callback and
#: its service's election callback and ``cancelled`` for its membership (and its runner's
#: assignment callback with failover only). Each is an 80-byte object per job. The run
#: marks ask the service itself (``MarksOwner``) and the resharding the runner
#: (``JobHooks``), where a bound method per question held five more; the election hears of
#: its node and the session through the service (``follow=False``), and the service and
#: the runner through the process's one listener of each kind (``scheduler.job_events``),
#: where their own held five more; the runner is its reconcile's owner (``CoarseTimer``),
#: where its timer entry held one more
BOUND_METHODS_PER_JOB = 3


def _noop(ctx: ShardingContext) -> None:
    pass


def test_a_started_job_holds_no_more_bound_methods_than_its_callbacks_need() -> None:
    sched = Scheduler(f"memory://footprint-{uuid.uuid4().hex}")
    for n in range(JOBS):
        sched.add_job(JobConfig(name=f"job-{n:03d}", cron="0 0 0 1 1 ?"), _noop)
    try:
        sched.start()
        gc.collect()
        runners = list(sched._runners.values())
        services = [runner.sharding for runner in runners]
        assert len(services) == JOBS and all(isinstance(s, ShardingService) for s in services)
        # the objects of the jobs, one each per job
        parts = [(s, s.marks, s.membership, s._election, s._resharding) for s in services]
        owners = {id(o) for part in parts for o in part} | {id(r) for r in runners}
        methods = [
            m for m in gc.get_objects() if isinstance(m, types.MethodType) and id(m.__self__) in owners
        ]
        kinds = collections.Counter(m.__func__.__qualname__ for m in methods)
        # a callback every job holds, not one in flight (an evaluation a few jobs queued)
        held = sorted(name for name, count in kinds.items() if count >= JOBS)
        assert len(held) <= BOUND_METHODS_PER_JOB, held
        for service in services:
            assert service.marks._owner is service
        # no list per job for what most jobs never hold or hold one of
        assert all(runner._owed is None and runner._listeners == () for runner in runners)
        assert all(type(service._assignment_listeners) is tuple for service in services)
        # jobs with equal settings share one settings object; a fire's timer key is its runner
        assert len({id(service.settings) for service in services}) == 1
        # and equal assignments' items one read-only map
        current = [service.current() for service in services]
        assert len({id(assignment.items) for assignment in current if assignment is not None}) == 1
        assert all(runner._rt.timer.pending(runner) is not None for runner in runners)
    finally:
        sched.shutdown()


def test_the_jobs_of_a_process_add_no_listener_each() -> None:
    """The cache's and the registry's listener tables hold the process's listeners only:
    every job's changes and session news reach it through ``scheduler.job_events``."""
    sched = Scheduler(f"memory://footprint-{uuid.uuid4().hex}")
    for n in range(JOBS):
        sched.add_job(JobConfig(name=f"job-{n:03d}", cron="0 0 0 1 1 ?", failover=n % 2 == 0), _noop)
    try:
        sched.start()
        runtime = sched.runtime
        assert runtime is not None and len(sched._runners) == JOBS
        roots = {runner.paths.root for runner in sched._runners.values()}
        followed = [path for path in runtime.cache._listeners if any(is_below(path, root) for root in roots)]
        assert followed == []
        assert len(runtime.cache._listeners) == 1
        session_listeners = sched.registry._listeners  # type: ignore[attr-defined]
        assert len(session_listeners) < 5, session_listeners
    finally:
        sched.shutdown()


def test_a_job_that_adopts_a_stored_config_equal_to_its_own_keeps_its_own() -> None:
    """Every instance but the first finds its jobs' configs stored and adopts them: when
    the stored one says what the local one does, the job keeps the local object, not a
    second config of its own; and configs without props share one empty props map."""
    url = f"memory://footprint-{uuid.uuid4().hex}"
    first, second = Scheduler(url), Scheduler(url)
    for sched in (first, second):
        for n in range(3):
            sched.add_job(JobConfig(name=f"job-{n}", cron="0 0 0 1 1 ?"), _noop)
    try:
        first.start()
        second.start()
        runners = list(second._runners.values())
        assert len(runners) == 3
        for runner in runners:
            assert runner._config is runner.local_config
        assert len({id(runner.local_config.props) for runner in runners}) == 1
        assert JobConfig(name="x", props={"a": "b"}).props == {"a": "b"}
    finally:
        second.shutdown()
        first.shutdown()


def test_the_values_every_job_writes_alike_are_one_object() -> None:
    """Every job's servers node holds ``ENABLED`` and its election node this instance's
    id: the store and the cache keep one object of each for all the jobs, and every
    job's election its one id (``registry.shared_values``)."""
    # the tables are the process's: one that earlier tests left nearly full would be
    # cleared while this start fills it, and keep a second equal object (as it may)
    for table in (shared_values._values, shared_values._numbers, shared_values._pairs):
        table.clear()
    sched = Scheduler(f"memory://footprint-{uuid.uuid4().hex}")
    for n in range(JOBS):
        sched.add_job(JobConfig(name=f"job-{n:03d}", cron="0 0 0 1 1 ?"), _noop)
    try:
        sched.start()
        services = [runner.sharding for runner in sched._runners.values()]
        runtime = sched.runtime
        assert runtime is not None
        cache, store = runtime.cache, sched.registry
        ip = services[0].identity.ip
        for read in (cache.get, store.get):
            elected = {id(read(service.paths.leader)) for service in services}
            enabled = {id(read(service.paths.server(ip))) for service in services}
            assert len(elected) == 1 and len(enabled) == 1
        assert len({id(service._election._identifier) for service in services}) == 1
        assert cache.get(services[0].paths.leader) == sched.instance_id.encode()
    finally:
        sched.shutdown()


def _adopted(runner: JobRunner, config: JobConfig) -> bool:
    return runner.config == config


def test_only_a_job_with_failover_follows_its_assignment() -> None:
    """A job follows its assignment for the failover work a new one may hand it: one
    without failover (the default) holds no listener for it, one with failover holds
    one, and a job whose stored config turns failover on starts following then, once."""
    sched = Scheduler(f"memory://footprint-{uuid.uuid4().hex}")
    sched.add_job(JobConfig(name="plain", cron="0 0 0 1 1 ?"), _noop)
    sched.add_job(JobConfig(name="failover", cron="0 0 0 1 1 ?", failover=True), _noop)
    try:
        sched.start()
        plain, failover = sched._runners["plain"], sched._runners["failover"]
        assert plain.sharding._assignment_listeners == ()
        assert len(failover.sharding._assignment_listeners) == 1
        for description in ("failover turned on", "a second change, failover still on"):
            stored = sched.registry.get_node(plain.paths.config)
            assert stored is not None
            changed = JobConfig.from_json(plain.paths.config, stored.value).with_changes(
                failover=True, description=description
            )
            sched.registry.put(plain.paths.config, changed.to_json())
            wait_for(functools.partial(_adopted, plain, changed), 10, message="the stored config adopted")
            assert len(plain.sharding._assignment_listeners) == 1
    finally:
        sched.shutdown()


def test_a_job_holds_its_election_term_path_and_timer_entry_once(harness: Harness) -> None:
    """A job's election holds the term node's path as the ``str`` the cache keys it by, not
    a copy of its own; and its timer entry is one tuple, the one in the timer's heap."""
    sched = Scheduler(harness.url(harness.fresh_namespace()))
    for n in range(BACKEND_JOBS):
        sched.add_job(JobConfig(name=f"job-{n:03d}", cron="0 0 0 1 1 ?"), _noop)
    try:
        sched.start()
        runtime = sched.runtime
        assert runtime is not None
        runners = list(sched._runners.values())
        terms = [runner.sharding._election._term_path for runner in runners]
        wait_for(lambda: all(runtime.cache.exists(term) for term in terms), timeout=5)
        keys = {path: path for path in runtime.cache._nodes}
        assert all(keys[term] is term for term in terms)
        timer = runtime.timer
        heap = {id(entry) for entry in timer._heap}
        assert all(id(timer._entries[runner]) in heap for runner in runners)
    finally:
        sched.shutdown()


def test_a_firing_job_leaves_no_path_checked_and_no_parameters_kept(harness: Harness) -> None:
    """A fire asks whether its job's resharding is flagged, mostly absent: the answer
    leaves nothing behind per job in the cache's memo of checked absent paths; nor does a
    job without item parameters keep parsed ones."""
    sched = Scheduler(harness.url(harness.fresh_namespace()))
    fired: set[str] = set()
    for n in range(BACKEND_JOBS):
        sched.add_job(JobConfig(name=f"job-{n:03d}", cron="* * * * * ?"), lambda ctx: fired.add(ctx.job_name))
    try:
        sched.start()
        runtime = sched.runtime
        assert runtime is not None
        wait_for(lambda: len(fired) == BACKEND_JOBS, timeout=10)
        necessary = {runner.sharding.paths.necessary for runner in sched._runners.values()}
        assert not necessary & runtime.cache._checked
        assert all(runner._parameters is None for runner in sched._runners.values())
    finally:
        sched.shutdown()
