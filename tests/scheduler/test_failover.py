"""Failover in process, on every backend: an instance cut off from the registry (its
session expires, as a crashed process's would) leaves no (item, fire) unrun, and no item
ever runs on two instances at the same moment."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from registry.protocol import RegistryCenter
from scheduler import JobConfig, Scheduler, ShardingContext
from scheduler.runner import JobRunner
from sharding.job_state import instance_record
from sharding.layout import JobPaths
from tests.harness import Harness
from tests.waiting import wait_for

TOTAL = 6


@dataclass(frozen=True)
class Execution:
    instance: str
    item: int
    fire_time: float
    start: float
    end: float
    failover: bool


class Journal:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.executions: list[Execution] = []

        #: items running now, by instance
        self.active: dict[str, int] = {}

    def job(self, instance: str, hold: float) -> Callable[[ShardingContext], None]:
        def run(ctx: ShardingContext) -> None:
            start = time.time()
            with self.lock:
                self.active[instance] = self.active.get(instance, 0) + 1
            try:
                if hold:
                    threading.Event().wait(hold)  # the item's own work: it takes this long
            finally:
                with self.lock:
                    self.active[instance] -= 1
                    self.executions.append(
                        Execution(
                            instance, ctx.sharding_item, ctx.fire_time, start, time.time(), ctx.failover
                        )
                    )

        return run

    def running(self, instance: str) -> bool:
        with self.lock:
            return self.active.get(instance, 0) > 0

    def pairs(self) -> set[tuple[int, float]]:
        with self.lock:
            return {(e.item, e.fire_time) for e in self.executions}

    def overlaps(self) -> list[tuple[Execution, Execution]]:
        with self.lock:
            runs = sorted(self.executions, key=lambda e: (e.item, e.start))
        found = []
        for a, b in itertools.pairwise(runs):
            if a.item == b.item and a.instance != b.instance and b.start < a.end:
                found.append((a, b))
        return found


def inside_a_run(journal: Journal, observer: RegistryCenter, instance: str) -> Callable[[], bool]:
    """``instance`` is inside a run: its running mark is in the registry (read directly:
    caches leave marks out) and one of its items is running."""
    mark = JobPaths("job").running_of(instance)
    # an item running before and after the read of the mark: the read fell inside the run
    return lambda: journal.running(instance) and observer.exists(mark) and journal.running(instance)


@pytest.fixture
def schedulers() -> Iterator[list[Scheduler]]:
    made: list[Scheduler] = []
    yield made
    for sched in made:
        sched.shutdown(wait=True)


@pytest.mark.parametrize("failover", [True, False])
def test_cut_off_instance_leaves_no_fire_unrun(
    harness: Harness, schedulers: list[Scheduler], failover: bool
) -> None:
    journal = Journal()
    namespace = harness.fresh_namespace()
    timeout = harness.min_session_timeout
    link = harness.link()
    urls = [harness.url(namespace, session_timeout=timeout)] * 2 + [
        link.url(namespace, session_timeout=timeout)
    ]
    cluster = []
    for url in urls:
        sched = Scheduler(url, max_workers=TOTAL)
        sched.add_job(
            JobConfig(name="job", cron="* * * * * ?", sharding_total_count=TOTAL, failover=failover),
            journal.job(sched.instance_id, hold=0.3),
        )
        schedulers.append(sched)
        cluster.append(sched)
    for sched in cluster:
        sched.start()
    victim = cluster[2]

    def runs_of(instance: str) -> int:
        with journal.lock:
            return sum(1 for e in journal.executions if e.instance == instance)

    wait_for(lambda: runs_of(victim.instance_id) >= 2, 30, message="the victim runs its items")
    # cut while the victim is inside a run: its items are held for 0.3 s after each fire
    observer = harness.connect(namespace)
    wait_for(inside_a_run(journal, observer, victim.instance_id), 5, interval=0.005, message="inside a run")
    cut_at = time.time()
    link.cut()
    survivors = [s.instance_id for s in cluster[:2]]
    settle = cut_at + timeout + 4

    def covered_after(moment: float) -> bool:
        with journal.lock:
            return any(
                e.fire_time > moment
                and {x.item for x in journal.executions if x.fire_time == e.fire_time} == set(range(TOTAL))
                for e in journal.executions
                if e.instance in survivors
            )

    wait_for(
        lambda: time.time() > settle and covered_after(settle), timeout + 30, message="survivors cover all"
    )
    end = time.time() - 1.5  # fires after this may still be running
    fires = sorted({f for _, f in journal.pairs() if f < end})
    first = min(f for f in fires if f >= cut_at - 2)
    window = [f for f in fires if f >= first]
    missing = [(i, f) for f in window for i in range(TOTAL) if (i, f) not in journal.pairs()]
    assert journal.overlaps() == []
    if failover:
        assert missing == [], f"unrun (item, fire) pairs with failover on: {missing}"
        with journal.lock:
            assert any(e.failover for e in journal.executions), "nothing ran as failover"
    else:
        # without failover the departed instance's items are skipped until the resharding
        assert missing, "expected the cut-off instance's fires to go unrun without failover"
        assert all(f <= cut_at + timeout + 3 for _, f in missing)
    link.restore()


def test_a_mark_whose_removal_was_cut_off_does_not_stop_later_runs(
    harness: Harness, schedulers: list[Scheduler]
) -> None:
    """The link drops while an item runs, so the end of the run cannot remove its
    (persistent, failover) running mark; the session survives the cut. Once the link is
    back the instance removes its own stale mark and runs again, rather than refusing every
    fire 'already running' for good."""
    journal = Journal()
    namespace = harness.fresh_namespace()
    link = harness.link()
    # a request waits up to connect_timeout for the link: the removal fails 1.5 s into the
    # cut, well within the session's 5 x timeout
    url = link.url(namespace, session_timeout=harness.min_session_timeout * 5, connect_timeout=1.5)
    sched = Scheduler(url, max_workers=TOTAL)
    schedulers.append(sched)
    sched.add_job(
        JobConfig(name="job", cron="* * * * * ?", sharding_total_count=2, failover=True),
        journal.job(sched.instance_id, hold=0.6),
    )
    try:
        sched.start()
        wait_for(lambda: len(journal.pairs()) >= 4, 30, message="two fires run")
        observer = harness.connect(namespace)
        wait_for(
            inside_a_run(journal, observer, sched.instance_id), 5, interval=0.005, message="inside a run"
        )
        link.cut()
        service = sched.runner("job").sharding
        wait_for(lambda: service.mark_in_doubt, 20, message="the mark's removal failed")
        restored_at = time.time()
        link.restore()
        wait_for(
            lambda: len({f for _, f in journal.pairs() if f > restored_at + 1}) >= 2,
            30,
            message="runs go on after the cut",
        )
        assert not service.mark_in_doubt
    finally:
        # shut down over the link: closed first, the shutdown would wait out its requests
        link.restore()
        sched.shutdown(wait=True)
        link.close()


def test_a_failover_owner_that_dies_too_hands_its_entries_on(
    harness: Harness, schedulers: list[Scheduler]
) -> None:
    """C is cut off mid-run; its items and their fires go to B (their new owner), which is
    cut off in turn while it runs them as failover. Nothing stays stuck: A, the last one
    left, runs every (item, fire) B had taken, as failover, and never beside anyone."""
    journal = Journal()
    namespace = harness.fresh_namespace()
    timeout = harness.min_session_timeout
    b_link, c_link = harness.link(), harness.link()
    # ids sorted descending give c items 0-1, b 2-3, a 4-5; without c, b takes 0-2: c's items
    ids = {"a": "127.0.0.1@-@failover-a", "b": "127.0.0.1@-@failover-b", "c": "127.0.0.1@-@failover-c"}
    urls = {
        "a": harness.url(namespace, session_timeout=timeout),
        "b": b_link.url(namespace, session_timeout=timeout),
        "c": c_link.url(namespace, session_timeout=timeout),
    }
    b_failover: list[tuple[int, float]] = []  # (item, fire) b started as failover
    hold = 0.3  # regular runs; b's failover runs end before its session can expire
    cluster: dict[str, Scheduler] = {}
    for name in ("a", "b", "c"):
        record = journal.job(ids[name], hold=hold)

        def job(
            ctx: ShardingContext, name: str = name, record: Callable[[ShardingContext], None] = record
        ) -> None:
            if name == "b" and ctx.failover:
                b_failover.append((ctx.sharding_item, ctx.fire_time))
            record(ctx)

        sched = Scheduler(urls[name], instance_id=ids[name], max_workers=TOTAL)
        sched.add_job(
            JobConfig(name="job", cron="* * * * * ?", sharding_total_count=TOTAL, failover=True), job
        )
        schedulers.append(sched)
        cluster[name] = sched
    for sched in cluster.values():
        sched.start()
    try:
        wait_for(
            lambda: len({e.fire_time for e in list(journal.executions) if e.instance == ids["c"]}) >= 2,
            30,
            message="c runs its items",
        )
        observer = harness.connect(namespace)
        wait_for(inside_a_run(journal, observer, ids["c"]), 5, interval=0.005, message="inside a run")
        c_link.cut()
        wait_for(lambda: b_failover, timeout + 30, message="b runs c's items as failover")
        b_link.cut()
        taken = set(b_failover)
        a_failover: set[tuple[int, float]] = set()

        def a_ran_what_b_took() -> bool:
            with journal.lock:
                a_failover.update(
                    (e.item, e.fire_time) for e in journal.executions if e.instance == ids["a"] and e.failover
                )
            return taken <= a_failover

        wait_for(
            a_ran_what_b_took,
            timeout + 40,
            message=lambda: f"a never ran {sorted(taken - a_failover)} that b took before it was cut off",
        )
        assert journal.overlaps() == []
    finally:
        b_link.restore()
        c_link.restore()


def two_instances(
    url: str, ids: dict[str, str], journal: Journal, schedulers: list[Scheduler]
) -> dict[str, Scheduler]:
    """Schedulers ``a`` and ``b`` (not started) of one job with 2 items and failover, which
    fires only when a test calls ``fire`` (its cron is in 2099)."""
    config = JobConfig(name="job", cron="0 0 0 1 1 ? 2099", sharding_total_count=2, failover=True)
    cluster: dict[str, Scheduler] = {}
    for name in ("a", "b"):
        sched = Scheduler(url, instance_id=ids[name], max_workers=2)
        sched.add_job(config, journal.job(ids[name], hold=0.0))
        schedulers.append(sched)
        cluster[name] = sched
    return cluster


def holds(runner: JobRunner, instance: str, *items: int) -> Callable[[], bool]:
    """``runner``'s view is a READY assignment giving ``instance`` exactly ``items``."""

    def check() -> bool:
        current = runner.sharding.ready()
        return current is not None and current.assignment.items_of(instance) == items

    return check


def test_a_fire_that_waited_through_a_resharding_hands_a_newcomer_its_moved_items(
    harness: Harness, schedulers: list[Scheduler]
) -> None:
    """A fire of ``a`` due before ``b`` registered is planned only after the resharding
    that gave ``b`` item 0 (a fire that waited for the new epoch). ``b`` does not fire it
    (it had not begun), and ``a`` runs only what the new epoch leaves it: with failover,
    ``a`` queues (0, fire) and ``b`` runs it, so the pair is not lost."""
    journal = Journal()
    namespace = harness.fresh_namespace()
    # ids sorted descending give b item 0 and a item 1 once both are online
    ids = {"a": "127.0.0.1@-@handover-a", "b": "127.0.0.1@-@handover-b"}
    cluster = two_instances(harness.url(namespace), ids, journal, schedulers)
    a = cluster["a"]
    a.start()
    runner = a.runner("job")

    wait_for(holds(runner, ids["a"], 0, 1), 20, message="a's first assignment")
    first = time.time() - 1.0
    runner.fire(first)
    wait_for(lambda: {(0, first), (1, first)} <= journal.pairs(), 20, message="a runs its first fire")
    late = time.time()  # a fire due now, which a's timer delivers only after the resharding
    cluster["b"].start()
    wait_for(holds(runner, ids["a"], 1), 20, message="the resharding that gives b item 0")
    runner.fire(late)
    wait_for(
        lambda: {(0, late), (1, late)} <= journal.pairs(),
        20,
        message=lambda: f"the late fire's pairs; ran: {sorted(journal.pairs())}",
    )
    with journal.lock:
        ran = {(e.item, e.instance, e.failover) for e in journal.executions if e.fire_time == late}
    assert ran == {(0, ids["b"], True), (1, ids["a"], False)}
    assert journal.overlaps() == []
    # b fires what falls due after its registration as the others read it, so a fire the
    # hand-over leaves out (due after b's "started") is one b fires itself
    node = harness.connect(namespace).get_node(JobPaths("job").instance(ids["b"]))
    assert node is not None
    started = instance_record(ids["b"], node.value).started
    assert started is not None
    assert cluster["b"].runner("job")._registered_at <= started + 0.0005


def test_a_newcomer_that_planned_a_fire_under_its_old_view_runs_it_once_placed(
    harness: Harness, schedulers: list[Scheduler]
) -> None:
    """``b`` plans a fire due after the fence while its view is still the assignment
    without it (the resharding that places it has not reached it): it has no item then,
    and no mark to be refused. Once placed, ``b`` queues that fire for its items and runs
    them as failover."""
    journal = Journal()
    namespace = harness.fresh_namespace()
    ids = {"a": "127.0.0.1@-@unplaced-a", "b": "127.0.0.1@-@unplaced-b"}  # b takes item 0
    cluster = two_instances(harness.url(namespace), ids, journal, schedulers)
    cluster["a"].start()
    a = cluster["a"].runner("job")
    wait_for(lambda: a.sharding.ready() is not None, 20, message="a's first assignment")
    without_b = a.sharding.ready()
    assert without_b is not None
    cluster["b"].start()
    b = cluster["b"].runner("job")

    wait_for(holds(b, ids["b"], 0), 20, message="the resharding that places b")
    stale = time.time()  # after the fence
    b._hand_over(without_b, stale, [])  # as b's plan of that fire under its old view
    later = time.time() + 0.01
    b.fire(later)  # planned under the assignment that places b
    wait_for(
        lambda: {(0, stale), (0, later)} <= journal.pairs(),
        20,
        message=lambda: f"b's runs; ran: {sorted(journal.pairs())}",
    )
    with journal.lock:
        ran = {(e.instance, e.fire_time, e.failover) for e in journal.executions if e.item == 0}
    assert ran == {(ids["b"], stale, True), (ids["b"], later, False)}


def test_a_fire_the_old_owner_ran_before_the_fence_is_not_run_again_by_the_new_owner(
    harness: Harness, schedulers: list[Scheduler]
) -> None:
    """``a`` runs fire F of both items before ``b`` joins; ``b``'s own fire F comes only
    after the resharding that gave it item 0 (a fire that waited for it). F is no later
    than the fence, so item 0 of F is ``a``'s: ``b`` skips it, and runs the next fire."""
    journal = Journal()
    namespace = harness.fresh_namespace()
    ids = {"a": "127.0.0.1@-@ran-a", "b": "127.0.0.1@-@ran-b"}  # b takes item 0
    cluster = two_instances(harness.url(namespace), ids, journal, schedulers)
    cluster["a"].start()
    a = cluster["a"].runner("job")
    wait_for(lambda: a.sharding.ready() is not None, 20, message="a's first assignment")
    fire = time.time()
    a.fire(fire)
    wait_for(lambda: {(0, fire), (1, fire)} <= journal.pairs(), 20, message="a runs the fire")
    cluster["b"].start()
    b = cluster["b"].runner("job")

    wait_for(holds(b, ids["b"], 0), 20, message="the resharding that places b")
    b.fire(fire)  # b's fire F, planned only now
    later = time.time() + 0.01
    b.fire(later)
    wait_for(lambda: (0, later) in journal.pairs(), 20, message="b runs the next fire")
    b.wait_idle(10)
    with journal.lock:
        ran = sorted((e.instance, e.fire_time) for e in journal.executions if e.item == 0)
    assert ran == [(ids["a"], fire), (ids["b"], later)]
