"""Public features of ``JobConfig``, ``Scheduler`` and ``ShardingService`` that no other test
runs, each on memory, ZooKeeper and etcd, each judged by what the feature changes (so the
test fails without it): ``disabled``, ``overwrite``, ``static_sharding``,
``monitor_execution=False``, ``max_time_diff_seconds``, ``remove_job``, ``failed_jobs``,
the ``@sched.job`` decorator, item disabling and ``ShardingTimeout``.

Invariant: every "did not happen" is judged over a window closed by an event that proves
time passed (fires run by the others, refusals logged), never at a single instant.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from scheduler import JobConfig, Scheduler, ShardingContext
from sharding import ShardingTimeout
from sharding.layout import JobPaths
from tests.harness import Harness
from tests.waiting import wait_for

EVERY_SECOND = "* * * * * ?"
PATHS = JobPaths("job")
#: the two shutdown-during-a-wait tests: a registration waits out another session's node of
#: its id for twice the session timeout + 5 s. A session of this many times the shortest
#: makes that wait long enough that a shutdown ending it is told apart from the wait's own
#: end with a margin a loaded machine keeps (a shutdown takes about 0.2 s here)
_LONG_WAIT_SESSION = 2
#: s before the wait's own end by which the shutdown must have ended it
_WAIT_MARGIN = 3.0
# two servers (ips) in one process: a server is what `disabled` switches off
A, B = "10.0.0.1@-@a", "10.0.0.2@-@b"


class Runs:
    """Every item run: (instance, fire time, item, job parameter)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: list[tuple[str, float, int, str]] = []

    def job(self, instance: str) -> Any:
        def run(ctx: ShardingContext) -> None:
            with self.lock:
                self.rows.append((instance, ctx.fire_time, ctx.sharding_item, ctx.job_parameter))

        return run

    def items(self, instance: str, after: float = 0.0) -> set[int]:
        with self.lock:
            return {item for who, fire, item, _ in self.rows if who == instance and fire > after}

    def fires(self, after: float = 0.0, *, instance: str | None = None) -> list[float]:
        with self.lock:
            return sorted({f for who, f, _, _ in self.rows if f > after and instance in (None, who)})

    def parameters(self, after: float = 0.0) -> set[str]:
        with self.lock:
            return {param for _, fire, _, param in self.rows if fire > after}


@pytest.fixture
def schedulers() -> Iterator[list[Scheduler]]:
    made: list[Scheduler] = []
    yield made
    for sched in reversed(made):
        sched.shutdown(wait=False)


def start(
    harness: Harness,
    made: list[Scheduler],
    namespace: str,
    instance_id: str,
    config: JobConfig,
    job: Any,
    **options: Any,
) -> Scheduler:
    sched = Scheduler(
        harness.url(namespace, session_timeout=harness.min_session_timeout),
        instance_id=instance_id,
        max_workers=4,
        **options,
    )
    made.append(sched)
    sched.add_job(config, job)
    sched.start()
    return sched


def assigned(sched: Scheduler, name: str = "job") -> dict[str, tuple[int, ...]]:
    ready = sched.runner(name).sharding.ready()
    return {} if ready is None else dict(ready.assignment.items)


def online(sched: Scheduler, instance: str) -> bool:
    return instance in sched.runner("job").sharding.online_instances()


# -- JobConfig.disabled ---------------------------------------------------------------------
def test_disabled_server_gets_no_items_until_enabled(harness: Harness, schedulers: list[Scheduler]) -> None:
    """``disabled=True`` (in force here by ``overwrite``): B's server starts disabled, its
    items stay with A; enabling the server gives it items — so the flag was the cause."""
    namespace, runs = harness.fresh_namespace(), Runs()
    config = JobConfig(name="job", cron=EVERY_SECOND, sharding_total_count=4)
    a = start(harness, schedulers, namespace, A, config, runs.job(A))
    wait_for(lambda: runs.items(A) == {0, 1, 2, 3}, 30, message="A runs every item")
    b = start(
        harness, schedulers, namespace, B, config.with_changes(disabled=True, overwrite=True), runs.job(B)
    )
    assert a.registry.get(PATHS.server("10.0.0.2")) == b"DISABLED"
    wait_for(lambda: online(a, B), 20, message="A sees B online")
    seen = time.time()
    # three whole fires after A saw B join: a join of an enabled server reshards in less
    wait_for(lambda: len([f for f in runs.fires(seen + 1, instance=A)]) >= 3, 30, message="three fires on A")
    assert runs.items(B) == set(), "a disabled server ran items"
    assert B not in assigned(a)
    b.runner("job").sharding.set_server_enabled("10.0.0.2", True)
    wait_for(lambda: runs.items(B), 30, message="the enabled server gets items")


# -- JobConfig.overwrite ----------------------------------------------------------------------
def test_overwrite_replaces_the_registry_config_at_start_and_only_then(
    harness: Harness, schedulers: list[Scheduler]
) -> None:
    namespace, runs = harness.fresh_namespace(), Runs()
    operator = harness.connect(namespace)
    stored = JobConfig(name="job", cron=EVERY_SECOND, sharding_total_count=1, job_parameter="stored")
    operator.put(PATHS.config, stored.to_json())
    local = stored.with_changes(job_parameter="local")
    kept = start(harness, schedulers, namespace, A, local, runs.job(A))
    wait_for(lambda: runs.parameters(), 30, message="a run without overwrite")
    assert runs.parameters() == {"stored"}, "without overwrite the registry's config wins"
    kept.shutdown(wait=True)
    started = time.time()
    start(harness, schedulers, namespace, B, local.with_changes(overwrite=True), runs.job(B))
    wait_for(lambda: runs.parameters(started + 1), 30, message="a run with overwrite")
    assert runs.parameters(started + 1) == {"local"}
    raw = operator.get(PATHS.config)
    assert raw is not None and JobConfig.from_json(PATHS.config, raw).job_parameter == "local"
    # after the start, the registry's copy is in force again: an operator's change applies
    operator.put(PATHS.config, stored.with_changes(job_parameter="operator").to_json())
    changed = time.time()
    wait_for(lambda: "operator" in runs.parameters(changed), 30, message="the operator's change applies")


# -- JobConfig.static_sharding ------------------------------------------------------------------
def test_static_sharding_ignores_a_join_but_not_a_total_count_change(
    harness: Harness, schedulers: list[Scheduler]
) -> None:
    namespace, runs = harness.fresh_namespace(), Runs()
    config = JobConfig(name="job", cron=EVERY_SECOND, sharding_total_count=2, static_sharding=True)
    a = start(harness, schedulers, namespace, A, config, runs.job(A))
    wait_for(lambda: runs.items(A) == {0, 1}, 30, message="A runs both items")
    ready = a.runner("job").sharding.ready()
    assert ready is not None
    epoch = ready.epoch
    start(harness, schedulers, namespace, B, config, runs.job(B))
    wait_for(lambda: online(a, B), 20, message="A sees B online")
    seen = time.time()
    wait_for(lambda: len(runs.fires(seen + 1, instance=A)) >= 3, 30, message="three fires on A")
    assert runs.items(B) == set(), "a join resharded a static job"
    current = a.runner("job").sharding.ready()
    assert current is not None and current.epoch == epoch and set(current.assignment.items) == {A}
    a.registry.put(PATHS.config, config.with_changes(sharding_total_count=4).to_json())
    wait_for(lambda: runs.items(B), 30, message="a total-count change reshards over both")
    assert set(assigned(a)) == {A, B}


# -- JobConfig.monitor_execution=False -----------------------------------------------------
@pytest.mark.parametrize("monitor", [True, False], ids=["monitor", "no-monitor"])
def test_resharding_waits_for_running_items_only_with_monitor_execution(
    harness: Harness, schedulers: list[Scheduler], monitor: bool
) -> None:
    """A's run is held; B joins. Without ``monitor_execution`` the new assignment is
    written while A's run is still in progress; with it, only after the run ends. (The
    running mark is written either way: it is the fence of every run.)"""
    namespace = harness.fresh_namespace()
    release, running = threading.Event(), threading.Event()

    def held(ctx: ShardingContext) -> None:
        running.set()
        release.wait(20)

    config = JobConfig(
        name="job", cron="0 0 0 1 1 ? 2099", sharding_total_count=2, monitor_execution=monitor, misfire=False
    )
    a = start(harness, schedulers, namespace, A, config, held)
    wait_for(lambda: assigned(a), 20, message="a first assignment")
    try:
        a.trigger("job")
        assert running.wait(20), "the held run did not start"
        assert a.registry.children(PATHS.running) == [A], "the run's mark is not there"
        start(harness, schedulers, namespace, B, config, lambda ctx: None)
        wait_for(lambda: online(a, B), 20, message="A sees B online")
        if not monitor:
            wait_for(lambda: B in assigned(a), 20, message="a new assignment while A's run is held")
            assert a.registry.children(PATHS.running) == [A], "the run ended before the resharding"
        else:
            # the resharding is under way (flagged or fenced) and waits for the held run
            wait_for(lambda: a.runner("job").sharding.resharding_pending(), 20, message="a resharding begins")
            deadline = time.monotonic() + 2 * harness.min_session_timeout
            while time.monotonic() < deadline:
                assert B not in assigned(a), "the resharding did not wait for the running item"
                time.sleep(0.05)
    finally:
        release.set()
    wait_for(lambda: B in assigned(a), 20, message="the resharding completes once the run ends")


# -- JobConfig.max_time_diff_seconds ----------------------------------------------------------
class _Refusals(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def skewed(self) -> int:
        return sum("local clock differs from the registry's" in m for m in self.messages)


def test_a_skewed_clock_refuses_to_run_until_back_within_bounds(
    harness: Harness, schedulers: list[Scheduler]
) -> None:
    namespace, runs = harness.fresh_namespace(), Runs()
    offset = [30.0]  # seconds the local clock is ahead of the registry's

    def clock() -> float:
        return time.time() + offset[0]

    refusals = _Refusals()
    logger = logging.getLogger("scheduler")
    logger.addHandler(refusals)
    try:
        config = JobConfig(name="job", cron=EVERY_SECOND, sharding_total_count=1, max_time_diff_seconds=5)
        start(harness, schedulers, namespace, A, config, runs.job(A), clock=clock)
        wait_for(
            lambda: refusals.skewed() >= 3, 30, message=lambda: f"three refused fires: {refusals.messages}"
        )
        assert runs.items(A) == set(), "a fire ran with the clock 30 s off"
        # the skew named is the clock source's offset, give or take the reading of the
        # registry's own clock over the network
        skews = [
            float(found.group(1)) for m in refusals.messages if (found := re.search(r"by ([-+]?\d+\.\d)s", m))
        ]
        assert skews and all(abs(skew + 30) < 1.5 for skew in skews), refusals.messages
        offset[0] = 2.0  # within the 5 s allowed
        back = time.time()
        wait_for(lambda: runs.fires(back), 30, message="runs again within bounds")
    finally:
        logger.removeHandler(refusals)


# -- Scheduler.remove_job, Scheduler.failed_jobs, @sched.job -------------------------------
def test_remove_job_hands_its_items_over_and_the_other_jobs_go_on(
    harness: Harness, schedulers: list[Scheduler]
) -> None:
    namespace, runs, others = harness.fresh_namespace(), Runs(), Runs()
    config = JobConfig(name="job", cron=EVERY_SECOND, sharding_total_count=4)
    a = start(harness, schedulers, namespace, A, config, runs.job(A))
    a.add_job(JobConfig(name="other", cron=EVERY_SECOND), others.job(A))
    b = start(harness, schedulers, namespace, B, config, runs.job(B))
    wait_for(lambda: runs.items(A) and runs.items(B), 30, message="both run items")
    a.remove_job("job")
    removed = time.time()
    assert a.jobs == ["other"]
    with pytest.raises(KeyError):
        a.runner("job")
    wait_for(lambda: A not in b.runner("job").sharding.online_instances(), 20, message="A's node is gone")
    wait_for(lambda: runs.items(B, removed) == {0, 1, 2, 3}, 30, message="B runs every item")
    assert runs.items(A, removed) == set()
    wait_for(lambda: others.fires(removed), 20, message="the other job goes on")


def test_failed_jobs_names_a_job_that_could_not_start_and_the_others_run(
    harness: Harness, schedulers: list[Scheduler]
) -> None:
    """Another session holds this instance's node: the job cannot register and is reported
    in ``failed_jobs`` (after the bounded wait for a stale node); the other job runs."""
    namespace, runs = harness.fresh_namespace(), Runs()
    squatter = harness.connect(namespace)
    squatter.create(PATHS.instance(A), b'{"id": "someone else"}', ephemeral=True)
    sched = Scheduler(
        harness.url(namespace, session_timeout=harness.min_session_timeout), instance_id=A, max_workers=4
    )
    schedulers.append(sched)
    sched.add_job(JobConfig(name="job", cron=EVERY_SECOND), runs.job(A))
    sched.add_job(JobConfig(name="ok", cron=EVERY_SECOND), runs.job("ok"))
    assert sched.failed_jobs == {}
    sched.start()
    assert set(sched.failed_jobs) == {"job"}
    assert "held by another session" in str(sched.failed_jobs["job"])
    wait_for(lambda: runs.fires(instance="ok"), 20, message="the other job runs")
    assert runs.fires(instance=A) == []


def test_a_shutdown_during_the_start_leaves_another_sessions_node_of_its_id(
    harness: Harness, schedulers: list[Scheduler]
) -> None:
    """``start()`` waits out a node of its id held by another session; a ``shutdown()``
    meanwhile ends the start, and leaving removes only a node this instance wrote: the
    other session's is left as it was."""
    namespace = harness.fresh_namespace()
    squatter = harness.connect(namespace)
    squatter.create(PATHS.instance(A), b'{"id": "someone else"}', ephemeral=True)
    timeout = _LONG_WAIT_SESSION * harness.min_session_timeout
    sched = Scheduler(harness.url(namespace, session_timeout=timeout), instance_id=A, max_workers=4)
    schedulers.append(sched)
    sched.add_job(JobConfig(name="job", cron=EVERY_SECOND), lambda ctx: None)
    starter = threading.Thread(target=sched.start, daemon=True)
    starter.start()
    wait_for(lambda: sched.running, 10, message="start() under way")
    stopper = threading.Thread(target=sched.shutdown, daemon=True)
    stopper.start()
    bound = 2 * timeout + 5  # the registration's own wait for a stale node
    wait_for(
        lambda: not starter.is_alive() and not stopper.is_alive(),
        bound - _WAIT_MARGIN,
        message=f"start() and shutdown() ended by the shutdown, not after the {bound:g} s wait",
    )
    assert "job" in sched.failed_jobs  # it never registered
    assert squatter.get(PATHS.instance(A)) == b'{"id": "someone else"}'


def test_shutdown_ends_a_re_registration_waiting_out_another_sessions_node(
    harness: Harness, schedulers: list[Scheduler], caplog: pytest.LogCaptureFixture
) -> None:
    """The session ends while the link is cut, and another session takes this instance's
    id: once back, the re-registration waits out that node (up to twice the session
    timeout + 5 s). A ``shutdown()`` then ends the wait rather than sitting it out, and
    leaves the other session's node as it was."""
    namespace = harness.fresh_namespace()
    timeout = _LONG_WAIT_SESSION * harness.min_session_timeout
    link = harness.link()
    sched = Scheduler(link.url(namespace, session_timeout=timeout), instance_id=A, max_workers=4)
    schedulers.append(sched)
    sched.add_job(JobConfig(name="job", cron=EVERY_SECOND), lambda ctx: None)
    sched.start()
    observer = harness.connect(namespace)
    assert observer.exists(PATHS.instance(A))
    link.cut()
    wait_for(lambda: not observer.exists(PATHS.instance(A)), timeout + 10, message="the cut session's node gone")
    observer.create(PATHS.instance(A), b'{"id": "someone else"}', ephemeral=True)
    caplog.set_level(logging.WARNING, logger="sharding")

    def waiting() -> bool:
        return any("held by another session" in r.getMessage() for r in caplog.records)

    link.restore()
    wait_for(waiting, 20, message="the re-registration waits out the other session's node")
    stopper = threading.Thread(target=sched.shutdown, daemon=True)
    stopper.start()
    bound = 2 * timeout + 5
    wait_for(
        lambda: not stopper.is_alive(),
        bound - _WAIT_MARGIN,
        message=f"shutdown() sat out the {bound:g} s wait",
    )
    assert observer.get(PATHS.instance(A)) == b'{"id": "someone else"}'


def test_job_decorator_registers_the_function_with_its_config(
    harness: Harness, schedulers: list[Scheduler]
) -> None:
    namespace = harness.fresh_namespace()
    sched = Scheduler(harness.url(namespace, session_timeout=harness.min_session_timeout), max_workers=4)
    schedulers.append(sched)
    seen: list[tuple[int, str | None, str]] = []

    def sync_orders(ctx: ShardingContext) -> None:
        seen.append((ctx.sharding_item, ctx.sharding_parameter, ctx.job_name))

    decorated = sched.job(cron=EVERY_SECOND, sharding_total_count=2, sharding_item_parameters="0=a,1=b")(
        sync_orders
    )
    assert decorated is sync_orders  # the function stays callable as written
    assert sched.jobs == ["sync_orders"]  # named after the function
    sched.start()
    wait_for(lambda: {s[0] for s in seen} == {0, 1}, 30, message="both items run")
    assert set(seen) >= {(0, "a", "sync_orders"), (1, "b", "sync_orders")}
    raw = sched.registry.get(JobPaths("sync_orders").config)
    assert raw is not None
    stored = JobConfig.from_json("/sync_orders/config", raw)
    assert (stored.cron, stored.sharding_total_count) == (EVERY_SECOND, 2)


# -- ShardingService item disabling and ShardingTimeout -------------------------------------
def test_disabled_items_do_not_run_until_enabled_again(harness: Harness, schedulers: list[Scheduler]) -> None:
    namespace, runs = harness.fresh_namespace(), Runs()
    config = JobConfig(name="job", cron=EVERY_SECOND, sharding_total_count=3)
    a = start(harness, schedulers, namespace, A, config, runs.job(A))
    wait_for(lambda: runs.items(A) == {0, 1, 2}, 30, message="every item runs")
    sharding = a.runner("job").sharding
    sharding.set_items_disabled([1], True)
    wait_for(lambda: sharding.disabled_items() == {1}, 10, message="item 1 disabled in the cache")
    disabled = time.time()
    wait_for(lambda: len(runs.fires(disabled + 1)) >= 3, 30, message="three fires")
    assert runs.items(A, disabled + 1) == {0, 2}, "a disabled item ran"
    sharding.set_items_disabled([1], False)
    wait_for(lambda: sharding.disabled_items() == set(), 10, message="item 1 enabled in the cache")
    enabled = time.time()
    wait_for(lambda: 1 in runs.items(A, enabled + 1), 30, message="item 1 runs again")


def test_no_assignment_within_the_bound_is_a_sharding_timeout(
    harness: Harness, schedulers: list[Scheduler]
) -> None:
    """The only server is disabled, so nobody leads and no assignment is ever written."""
    namespace = harness.fresh_namespace()
    config = JobConfig(name="job", sharding_total_count=2, disabled=True)
    sched = start(harness, schedulers, namespace, A, config, lambda ctx: None)
    sharding = sched.runner("job").sharding
    began = time.monotonic()
    with pytest.raises(ShardingTimeout, match=r"no ready assignment within 1s \(leader: none\)"):
        sharding.ensure_ready(timeout=1.0)
    assert time.monotonic() - began >= 1.0
    with pytest.raises(ShardingTimeout, match="cancelled"):
        sharding.ensure_ready(timeout=30.0, cancelled=lambda: True)


def test_item_disabling_by_two_operators_at_once_loses_neither(
    harness: Harness, schedulers: list[Scheduler]
) -> None:
    """Each call is one write at the version it read: two instances disabling items at the
    same moment keep each other's; an item outside the job is refused, naming it, with
    nothing stored changed."""
    namespace = harness.fresh_namespace()
    config = JobConfig(name="job", sharding_total_count=10)
    services = [
        start(harness, schedulers, namespace, instance, config, lambda ctx: None).runner("job").sharding
        for instance in (A, B)
    ]
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def disable(index: int) -> None:
        try:
            barrier.wait(10)
            for item in range(index * 5, index * 5 + 5):
                services[index].set_items_disabled([item], True)
        except BaseException as exc:  # judged below
            errors.append(exc)

    threads = [threading.Thread(target=disable, args=(index,)) for index in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    reader = harness.connect(namespace)
    assert reader.get(PATHS.disabled_items) == b"0-9"
    with pytest.raises(ValueError, match=r"items \[10\] are not in 0..9"):
        services[0].set_items_disabled([10], False)
    assert reader.get(PATHS.disabled_items) == b"0-9"
