"""The scheduler end to end, several instances in this process, on every backend."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

from scheduler import JobConfig, JobListener, JobRun, JobType, Scheduler, ShardingContext
from scheduler import runner as runner_module
from sharding import get_strategy
from sharding.layout import JobPaths
from tests.harness import Harness
from tests.waiting import holds_for, wait_for

EVERY_SECOND = "* * * * * ?"


class Recorder:
    """Every execution: (fire_time, item) -> instances that ran it."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.runs: dict[tuple[float, int], list[str]] = defaultdict(list)
        self.contexts: list[ShardingContext] = []

    def job(self, instance_id: str) -> object:
        def run(ctx: ShardingContext) -> None:
            with self.lock:
                self.runs[(ctx.fire_time, ctx.sharding_item)].append(instance_id)
                self.contexts.append(ctx)
                self.lock.notify_all()

        return run

    def fires(self) -> list[float]:
        with self.lock:
            return sorted({fire for fire, _ in self.runs})

    def by_fire(self, fire: float) -> dict[int, list[str]]:
        with self.lock:
            return {item: list(who) for (f, item), who in self.runs.items() if f == fire}

    def duplicates(self) -> list[tuple[float, int, list[str]]]:
        with self.lock:
            return [(f, i, who) for (f, i), who in self.runs.items() if len(who) > 1]


@pytest.fixture
def schedulers() -> Iterator[list[Scheduler]]:
    made: list[Scheduler] = []
    yield made
    for sched in made:
        sched.shutdown(wait=True)


def start_cluster(
    harness: Harness, made: list[Scheduler], recorder: Recorder, count: int, namespace: str, **fields: object
) -> list[Scheduler]:
    started = []
    for _ in range(count):
        sched = Scheduler(harness.url(namespace, session_timeout=harness.min_session_timeout), max_workers=4)
        sched.add_job(JobConfig(name="job", **fields), recorder.job(sched.instance_id))  # type: ignore[arg-type]
        made.append(sched)
        started.append(sched)
    for sched in started:
        sched.start()
    return started


def runners_of(recorder: Recorder, fire: float) -> set[str]:
    return {instance for who in recorder.by_fire(fire).values() for instance in who}


def complete_fires(recorder: Recorder, total: int) -> list[float]:
    return [f for f in recorder.fires() if len(recorder.by_fire(f)) == total]


def test_every_item_of_every_fire_runs_exactly_once_as_the_strategy_says(
    harness: Harness, schedulers: list[Scheduler]
) -> None:
    recorder = Recorder()
    namespace = harness.fresh_namespace()
    cluster = start_cluster(
        harness, schedulers, recorder, 3, namespace, cron=EVERY_SECOND, sharding_total_count=6
    )
    ids = sorted((s.instance_id for s in cluster), reverse=True)
    expected = get_strategy("AVG_ALLOCATION")(ids, "job", 6)
    owner = {item: instance for instance, items in expected.items() for item in items}

    def settled_fires() -> list[float]:
        return [
            f
            for f in complete_fires(recorder, 6)
            if all(w == [owner[i]] for i, w in recorder.by_fire(f).items())
        ]

    wait_for(lambda: len(settled_fires()) >= 2, 30, message="two fires spread as AVG_ALLOCATION says")
    assert recorder.duplicates() == []


def test_leaving_and_joining_move_items_at_the_next_fire(
    harness: Harness, schedulers: list[Scheduler]
) -> None:
    recorder = Recorder()
    namespace = harness.fresh_namespace()
    cluster = start_cluster(
        harness, schedulers, recorder, 2, namespace, cron=EVERY_SECOND, sharding_total_count=4
    )
    wait_for(
        lambda: any(len(runners_of(recorder, f)) == 2 for f in complete_fires(recorder, 4)),
        30,
        message="both instances running",
    )
    leaving = cluster[1]
    left_at = time.time()
    leaving.shutdown(wait=True)
    wait_for(
        lambda: any(
            f > left_at and runners_of(recorder, f) == {cluster[0].instance_id}
            for f in complete_fires(recorder, 4)
        ),
        30,
        message="the survivor runs all four items",
    )
    joiner = start_cluster(
        harness, schedulers, recorder, 1, namespace, cron=EVERY_SECOND, sharding_total_count=4
    )[0]
    joined_at = time.time()
    wait_for(
        lambda: any(
            f > joined_at and joiner.instance_id in runners_of(recorder, f)
            for f in complete_fires(recorder, 4)
        ),
        30,
        message="the newcomer gets items",
    )
    assert recorder.duplicates() == []


def test_config_change_in_registry_takes_effect(harness: Harness, schedulers: list[Scheduler]) -> None:
    recorder = Recorder()
    namespace = harness.fresh_namespace()
    cluster = start_cluster(
        harness, schedulers, recorder, 2, namespace, cron=EVERY_SECOND, sharding_total_count=2
    )
    wait_for(lambda: len(complete_fires(recorder, 2)) >= 1, 30, message="a first complete fire")
    reg = cluster[0].registry
    raw = reg.get(JobPaths("job").config)
    assert raw is not None
    changed = JobConfig.from_json("/job/config", raw).with_changes(sharding_total_count=5, job_parameter="v2")
    reg.put(JobPaths("job").config, changed.to_json())
    wait_for(lambda: len(complete_fires(recorder, 5)) >= 1, 30, message="fires over five items")
    with recorder.lock:
        assert any(ctx.job_parameter == "v2" and ctx.sharding_total_count == 5 for ctx in recorder.contexts)
    assert recorder.duplicates() == []


def test_trigger_runs_a_one_off_job_once_across_the_cluster(
    harness: Harness, schedulers: list[Scheduler]
) -> None:
    recorder = Recorder()
    namespace = harness.fresh_namespace()
    cluster = start_cluster(
        harness,
        schedulers,
        recorder,
        2,
        namespace,
        sharding_total_count=4,
        sharding_item_parameters="0=a,3=d",
    )
    wait_for(lambda: all(s.runner("job").sharding.registered for s in cluster), 20, message="registered")
    wait_for(
        lambda: len(cluster[0].registry.children(JobPaths("job").instances)) == 2, 20, message="both online"
    )

    def settled() -> bool:
        readies = [s.runner("job").sharding.ready() for s in cluster]
        return all(r is not None and len(r.assignment.items) == 2 for r in readies)

    wait_for(settled, 20, message="one assignment over both instances")
    # one-off: nothing runs by itself, over two periods of the fastest cron
    holds_for(lambda: recorder.fires() == [], 2.0, message="a one-off job ran without a trigger")
    cluster[0].trigger("job")
    wait_for(lambda: len(complete_fires(recorder, 4)) == 1, 30, message="one triggered run of all items")
    with recorder.lock:
        params = {ctx.sharding_item: ctx.sharding_parameter for ctx in recorder.contexts}
    assert params == {0: "a", 1: None, 2: None, 3: "d"}
    assert recorder.duplicates() == []


def test_misfire_runs_once_right_after_a_long_run(harness: Harness, schedulers: list[Scheduler]) -> None:
    namespace = harness.fresh_namespace()
    started: list[float] = []
    release = threading.Event()
    lock = threading.Lock()

    def slow(ctx: ShardingContext) -> None:
        with lock:
            started.append(ctx.fire_time)
            first = len(started) == 1
        if first:
            release.wait(10)  # holds the run across several fires

    sched = Scheduler(harness.url(namespace, session_timeout=harness.min_session_timeout), max_workers=2)
    schedulers.append(sched)
    sched.add_job(JobConfig(name="slow", cron=EVERY_SECOND, sharding_total_count=1, misfire=True), slow)
    sched.start()
    wait_for(lambda: len(started) == 1, 20, message="the first run")
    first_fire = started[0]
    wait_for(lambda: time.time() > first_fire + 3.2, 10, message="three fires pass during the run")
    release.set()
    wait_for(lambda: len(started) >= 2, 10, message="the misfire runs")
    # exactly one catch-up run for the fires missed meanwhile, carrying the first missed fire time
    assert started[1] == first_fire + 1
    wait_for(lambda: len(started) >= 3, 10, message="regular fires resume")
    assert started[2] > first_fire + 3


@pytest.mark.parametrize("failover", [True, False], ids=["failover", "no-failover"])
def test_fires_the_timer_passed_while_late_are_owed_with_failover(
    harness: Harness, schedulers: list[Scheduler], failover: bool
) -> None:
    """The timer comes ten fires late (a process paused or overloaded for 10 s, its session
    alive): with failover every fire it passed runs (each (item, fire) at least once), in
    fire order; without, they are skipped, as ElasticJob's triggers skip misfired fires.
    The late fire itself always runs, and the schedule goes on."""
    namespace = harness.fresh_namespace()
    lock = threading.Lock()
    ran: list[float] = []

    def job(ctx: ShardingContext) -> None:
        with lock:
            ran.append(ctx.fire_time)

    sched = Scheduler(harness.url(namespace, session_timeout=harness.min_session_timeout), max_workers=2)
    schedulers.append(sched)
    sched.add_job(
        JobConfig(name="late", cron=EVERY_SECOND, sharding_total_count=1, failover=failover),
        job,
    )
    sched.start()
    wait_for(lambda: len(ran) >= 1, 20, message="a first regular fire")
    started = min(ran)
    late = float(int(started) - 10)  # ten whole seconds before any fire of this scheduler
    mark = JobPaths("late").running_of(sched.instance_id)

    def between_two_fires() -> bool:
        # this second's fire ran and its running mark is gone: no run in progress
        with lock:
            latest = max(ran)
        return latest > time.time() - 1 and not sched.registry.exists(mark)

    wait_for(between_two_fires, 5, interval=0.01, message="between two fires")
    sched.runner("late")._on_timer(late)  # the timer's callback, called as a late timer would
    passed = [late + k for k in range(1, 10)]  # the ones before this scheduler's first fire
    want = [late, *passed] if failover else [late]
    wait_for(lambda: len([f for f in ran if f < started]) >= len(want), 20, message="the late fire's runs")
    wait_for(lambda: max(ran) > time.time() - 1.5 and len(ran) > len(want) + 2, 10, message="fires go on")
    with lock:
        before = [f for f in ran if f < started]
    assert before == want


def test_owed_fires_stay_in_fire_order_and_keep_the_newest(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fires owed with failover are replayed oldest first, a late one sorted among them,
    and beyond ``MAX_MISSED_FIRES`` the oldest give way (an outage of days owes the
    newest fires, not a backlog without end)."""
    monkeypatch.setattr(runner_module, "MAX_MISSED_FIRES", 3)
    sched = Scheduler("memory://owed-bound/ns")
    sched.add_job(JobConfig(name="owing", cron="0 0 0 1 1 ? 2099", failover=True), lambda ctx: None)
    sched.start()
    try:
        runner = sched.runner("owing")
        with runner._lock:
            for fire_time in (10.0, 30.0, 20.0, 20.0):
                runner._owe(fire_time, session_down=True)
            assert runner._owed == [10.0, 20.0, 30.0]  # sorted, each fire once
            runner._owe(40.0, session_down=True)
            runner._owe(5.0, session_down=True)
            assert runner._owed == [20.0, 30.0, 40.0]  # the two oldest gave way
        runner.forget_owed()
        assert not runner._owed  # none owed (the list goes until a fire is owed again)
    finally:
        sched.shutdown()


class _Counting(JobListener):
    def __init__(self) -> None:
        self.before: list[JobRun] = []
        self.after: list[JobRun] = []

    def before_job(self, run: JobRun) -> None:
        self.before.append(run)

    def after_job(self, run: JobRun) -> None:
        self.after.append(run)


def test_listeners_and_error_handlers(harness: Harness, schedulers: list[Scheduler]) -> None:
    namespace = harness.fresh_namespace()
    handled: list[tuple[int, str]] = []
    listener = _Counting()
    sched = Scheduler(harness.url(namespace, session_timeout=harness.min_session_timeout), max_workers=2)
    schedulers.append(sched)

    def flaky(ctx: ShardingContext) -> None:
        if ctx.sharding_item == 1:
            raise RuntimeError("item one fails")

    sched.add_job(
        JobConfig(name="flaky", sharding_total_count=2),
        flaky,
        listeners=[listener],
        error_handler=lambda ctx, exc: handled.append((ctx.sharding_item, str(exc))),
    )
    sched.start()
    wait_for(lambda: sched.runner("flaky").sharding.registered, 20, message="registered")
    sched.trigger("flaky")
    wait_for(lambda: len(listener.after) == 1, 20, message="one run")
    assert listener.after[0].items == (0, 1)
    holds_for(
        lambda: len(listener.before) == len(listener.after) == 1, 1.0, message="a one-off job ran twice"
    )
    assert handled == [(1, "item one fails")]
    assert set(listener.after[0].errors) == {1} and not listener.after[0].succeeded


def test_a_run_ends_even_when_an_item_cannot_be_started(
    harness: Harness, schedulers: list[Scheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure outside the job's code (here: making an item's context) is logged, the
    run's other items still run and the run ends: the job is not left 'running' for good."""
    from scheduler.runner import JobRunner

    make_context = JobRunner._context

    def failing_for_item_zero(self: JobRunner, run: JobRun, item: int, task_id: str) -> ShardingContext:
        if item == 0:
            raise RuntimeError("no context for item 0")
        return make_context(self, run, item, task_id)

    monkeypatch.setattr(JobRunner, "_context", failing_for_item_zero)
    ran: list[int] = []
    listener = _Counting()
    # one worker: the task that meets the failure is the one that runs every item
    sched = Scheduler(
        harness.url(harness.fresh_namespace(), session_timeout=harness.min_session_timeout), max_workers=1
    )
    schedulers.append(sched)
    sched.add_job(
        JobConfig(name="partial", sharding_total_count=3),
        lambda ctx: ran.append(ctx.sharding_item),
        listeners=[listener],
    )
    sched.start()
    wait_for(lambda: sched.runner("partial").sharding.registered, 20, message="registered")
    sched.trigger("partial")
    wait_for(lambda: len(listener.after) == 1, 20, message="the first run ends")
    sched.trigger("partial")
    wait_for(lambda: len(listener.after) == 2, 20, message="a second run starts and ends")
    assert sorted(ran) == [1, 1, 2, 2]


class _Feed:
    def __init__(self) -> None:
        self.batches = {0: [[1, 2], [3], []], 1: [[10], []]}
        self.processed: list[tuple[int, list[int]]] = []

    def fetch_data(self, ctx: ShardingContext) -> list[int]:
        return self.batches[ctx.sharding_item].pop(0)

    def process_data(self, ctx: ShardingContext, data: list[int]) -> None:
        self.processed.append((ctx.sharding_item, data))


def test_dataflow_streaming_until_fetch_is_empty(harness: Harness, schedulers: list[Scheduler]) -> None:
    feed = _Feed()
    listener = _Counting()
    sched = Scheduler(harness.url(harness.fresh_namespace(), session_timeout=harness.min_session_timeout))
    schedulers.append(sched)
    sched.add_job(
        JobConfig(name="feed", sharding_total_count=2, job_type=JobType.DATAFLOW, streaming_process=True),
        feed,
        listeners=[listener],
    )
    sched.start()
    wait_for(lambda: sched.runner("feed").sharding.registered, 20, message="registered")
    sched.trigger("feed")
    wait_for(lambda: listener.after, 20, message="the run ends")
    assert sorted(feed.processed) == [(0, [1, 2]), (0, [3]), (1, [10])]


def test_script_job_gets_context_as_json_and_reports_exit_status(
    harness: Harness, schedulers: list[Scheduler], tmp_path: object
) -> None:
    import sys
    from pathlib import Path

    out = Path(str(tmp_path)) / "out"
    script = (
        "import json,sys; c=json.loads(sys.argv[-1]); "
        f"open({str(out)!r}+str(c['shardingItem']),'w').write(c['jobName']+' '+str(c['shardingParameter']));"
        "sys.exit(3 if c['shardingItem']==1 else 0)"
    )
    import shlex

    sched = Scheduler(harness.url(harness.fresh_namespace(), session_timeout=harness.min_session_timeout))
    schedulers.append(sched)
    listener = _Counting()
    sched.add_job(
        JobConfig(
            name="script",
            sharding_total_count=2,
            sharding_item_parameters="0=zero,1=one",
            job_type=JobType.SCRIPT,
            script_command_line=f"{shlex.quote(sys.executable)} -c {shlex.quote(script)}",
            error_handler="IGNORE",
        ),
        listeners=[listener],
    )
    sched.start()
    wait_for(lambda: sched.runner("script").sharding.registered, 20, message="registered")
    sched.trigger("script")
    wait_for(lambda: len(listener.after) == 1, 30, message="the script run ends")
    assert (out.parent / "out0").read_text() == "script zero"
    assert (out.parent / "out1").read_text() == "script one"
    assert set(listener.after[0].errors) == {1}
    assert "exited with status 3" in str(listener.after[0].errors[1])


def test_bad_config_rejected_at_add_job_before_anything_is_written(harness: Harness) -> None:
    namespace = harness.fresh_namespace()
    sched = Scheduler(harness.url(namespace))
    with pytest.raises(ValueError, match="sharding_total_count"):
        sched.add_job(JobConfig(name="bad", sharding_total_count=0), lambda ctx: None)
    with pytest.raises(ValueError, match="cron"):
        sched.add_job(JobConfig(name="bad", cron="61 * * * *"), lambda ctx: None)
    with pytest.raises(ValueError, match="sharding_strategy"):
        sched.add_job(JobConfig(name="bad", sharding_strategy="NOPE"), lambda ctx: None)
    with pytest.raises(ValueError, match="callable"):
        not_a_job: Any = object()  # what a user may pass all the same
        sched.add_job(JobConfig(name="bad"), not_a_job)
    reader = harness.connect(namespace)
    assert reader.children("/") == []


def test_thousand_jobs_use_a_fixed_number_of_threads(schedulers: list[Scheduler]) -> None:
    """Thread accounting on memory (the server backends add a fixed few per client)."""
    ran: Counter[str] = Counter()
    lock = threading.Lock()

    def job(ctx: ShardingContext) -> None:
        with lock:
            ran[ctx.job_name] += 1

    baseline = threading.active_count()
    sched = Scheduler("memory://thousand-jobs/ns", max_workers=8, coordinator_threads=4)
    schedulers.append(sched)
    for n in range(1000):
        sched.add_job(JobConfig(name=f"job{n}", cron=EVERY_SECOND, sharding_total_count=1), job)
    sched.start()
    wait_for(lambda: len(ran) == 1000, 60, message="every one of 1,000 jobs ran")
    # at rest: the start's burst of first reshardings had threads of its own, which leave
    # once idle (``scheduler.burst_pool``); a thread per job never would
    bound = 8 + 4 + 1 + 4
    wait_for(
        lambda: threading.active_count() - baseline <= bound,
        10,
        message=lambda: f"{threading.active_count() - baseline} threads for 1,000 jobs",
    )


def test_a_shutdown_request_left_for_an_earlier_process_of_this_id_is_consumed_at_start() -> None:
    """An instance that restarts with its id finds the request an operator made of the
    process before it: the job starts and fires, and the stale request is deleted."""
    url = f"memory://job-events-{uuid.uuid4().hex}"
    instance_id = "10.0.0.7@-@1"
    fired = threading.Event()
    with Scheduler(url, instance_id="10.0.0.8@-@1") as other:
        stale = JobPaths("job").shutdown(instance_id)
        other.registry.put(stale, b"1.0")
        sched = Scheduler(url, instance_id=instance_id)
        sched.add_job(JobConfig(name="job", cron=None), lambda ctx: fired.set())
        try:
            sched.start()
            assert sched.registry.get(stale) is None
            assert "job" not in sched.shut_down_jobs
            sched.trigger("job")
            assert fired.wait(10)
        finally:
            sched.shutdown()
