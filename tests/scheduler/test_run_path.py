"""What the run path does to one item, end to end on memory, ZooKeeper and etcd:
``fire_datetime``, ``async def`` jobs (one loop per scheduler, items overlapping on it),
per-attempt timeouts (an async task cancelled, a script's process group killed, a sync job
told), retries under the fence (stopped by a resharding or a shutdown) and fire jitter.

Each test is judged by what its feature changes, so that it fails without it; every "did
not happen" is judged after an event that proves it had the time to happen.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import os
import shlex
import signal
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from scheduler import (
    JobConfig,
    JobListener,
    JobRun,
    JobTimeout,
    JobType,
    PoolShutDown,
    Scheduler,
    ShardingContext,
)
from scheduler.async_loop import AsyncLoop
from scheduler.cron import parse_time_zone
from scheduler.handlers import ErrorHandler
from scheduler.history import HistoryReader
from scheduler.kinds import make_item_runner
from scheduler.observe import enable_metrics
from sharding.layout import JobPaths
from tests.harness import Harness
from tests.waiting import wait_for

EVERY_SECOND = "* * * * * ?"
PATHS = JobPaths("job")
# two servers in one process; ElasticJob's order is descending, so B comes first and a
# one-item job's item goes to B once B is there
A, B = "10.0.0.1@-@a", "10.0.0.2@-@b"


class Ends(JobListener):
    """Every run that ended, in order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: list[JobRun] = []

    def after_job(self, run: JobRun) -> None:
        with self.lock:
            self.runs.append(run)

    def count(self) -> int:
        with self.lock:
            return len(self.runs)


class Handled:
    """An error handler that records what it was given."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[ShardingContext, BaseException]] = []

    def __call__(self, ctx: ShardingContext, exc: BaseException) -> None:
        with self.lock:
            self.calls.append((ctx, exc))


def start(
    harness: Harness,
    made: list[Scheduler],
    namespace: str,
    config: JobConfig,
    job: Any = None,
    *,
    instance_id: str | None = None,
    listeners: tuple[JobListener, ...] = (),
    error_handler: ErrorHandler | None = None,
    **options: Any,
) -> Scheduler:
    sched = Scheduler(
        harness.url(namespace, session_timeout=harness.min_session_timeout),
        instance_id=instance_id,
        max_workers=4,
        **options,
    )
    made.append(sched)
    sched.add_job(config, job, listeners=listeners, error_handler=error_handler)
    sched.start()
    return sched


def trigger(sched: Scheduler, name: str = "job") -> None:
    wait_for(lambda: sched.runner(name).sharding.registered, 20, message=f"{name} registered")
    sched.trigger(name)


def history_rows(sched: Scheduler, url: str, job: str = "job") -> list[Any]:
    assert sched.history is not None and sched.history.flush()
    with HistoryReader(url) as reader:
        return reader.executions(job, limit=None)


def alive(pid: int) -> bool:
    """The process runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# -- fire_datetime ---------------------------------------------------------------------------------
def test_fire_datetime_is_the_fire_time_in_the_jobs_zone(
    harness: Harness, namespace: str, made: list[Scheduler]
) -> None:
    seen: dict[str, ShardingContext] = {}

    def job(ctx: ShardingContext) -> None:
        seen[ctx.job_name] = ctx

    sched = start(harness, made, namespace, JobConfig(name="job", time_zone="Asia/Shanghai"), job)
    sched.add_job(JobConfig(name="offset", time_zone="GMT-05:30"), job)
    trigger(sched, "job")
    trigger(sched, "offset")
    wait_for(lambda: len(seen) == 2, 20, message="both jobs ran")
    for name, offset in (("job", timedelta(hours=8)), ("offset", -timedelta(hours=5, minutes=30))):
        ctx = seen[name]
        when = ctx.fire_datetime
        assert when.utcoffset() == offset
        assert when == datetime.fromtimestamp(ctx.fire_time, timezone.utc)
        assert abs(when.timestamp() - ctx.fire_time) < 1e-6  # a datetime keeps microseconds
    assert str(seen["job"].fire_datetime.tzinfo) == "Asia/Shanghai"


def test_context_without_a_zone_and_its_json() -> None:
    ctx = ShardingContext(
        job_name="j", task_id="t", sharding_total_count=2, job_parameter="p", sharding_item=1,
        sharding_parameter="x", fire_time=1_700_000_000.0, epoch=3, attempt=2,
    )  # fmt: skip
    # its hand-written __init__ sets every field, in the class's order
    assert list(vars(ctx)) == [f.name for f in dataclasses.fields(ShardingContext)]
    assert dataclasses.replace(ctx, attempt=3).attempt == 3 and ctx == dataclasses.replace(ctx)
    assert ctx.fire_datetime.tzinfo is parse_time_zone(None)
    assert ctx.fire_datetime.timestamp() == ctx.fire_time
    assert not ctx.cancelled
    ctx.raise_if_cancelled()  # no deadline: never cancelled
    document = json.loads(ctx.to_json())
    assert document == {
        "jobName": "j", "taskId": "t", "shardingTotalCount": 2, "jobParameter": "p", "shardingItem": 1,
        "shardingParameter": "x", "fireTime": 1_700_000_000.0, "epoch": 3, "failover": False, "attempt": 2,
    }  # fmt: skip


# -- async jobs ---------------------------------------------------------------------------------------
def test_async_items_overlap_on_the_schedulers_one_loop(
    harness: Harness, namespace: str, made: list[Scheduler]
) -> None:
    spans: dict[tuple[str, int], tuple[float, float, str]] = {}

    async def job(ctx: ShardingContext) -> None:
        began = time.monotonic()
        await asyncio.sleep(0.3)
        spans[(ctx.job_name, ctx.sharding_item)] = (began, time.monotonic(), threading.current_thread().name)

    class Job:  # ElasticJob's SimpleJob shape, with an async execute
        async def execute(self, ctx: ShardingContext) -> None:
            await job(ctx)

    ends = Ends()
    sched = start(
        harness, made, namespace, JobConfig(name="job", sharding_total_count=2), job, listeners=(ends,)
    )
    sched.add_job(JobConfig(name="other", sharding_total_count=2), Job(), listeners=[ends])
    trigger(sched, "job")
    trigger(sched, "other")
    wait_for(lambda: ends.count() == 2, 20, message="both runs end")
    assert all(run.succeeded for run in ends.runs)
    first, second = spans[("job", 0)], spans[("job", 1)]
    assert max(first[0], second[0]) < min(first[1], second[1]), "the two items of one run did not overlap"
    loop = sched.async_loop.thread
    assert loop is not None and {span[2] for span in spans.values()} == {loop.name}
    assert len(spans) == 4
    sched.shutdown(wait=True)
    assert not loop.is_alive(), "the loop's thread outlived its scheduler"


def test_an_async_dataflow_job_streams_until_a_fetch_is_empty(
    harness: Harness, namespace: str, made: list[Scheduler]
) -> None:
    class Feed:
        def __init__(self) -> None:
            self.batches = {0: [[1, 2], [3], []], 1: [[10], []]}
            self.processed: list[tuple[int, list[int], str]] = []

        async def fetch_data(self, ctx: ShardingContext) -> list[int]:
            await asyncio.sleep(0)
            return self.batches[ctx.sharding_item].pop(0)

        async def process_data(self, ctx: ShardingContext, data: list[int]) -> None:
            await asyncio.sleep(0)
            self.processed.append((ctx.sharding_item, data, threading.current_thread().name))

    feed, ends = Feed(), Ends()
    config = JobConfig(name="job", sharding_total_count=2, job_type=JobType.DATAFLOW, streaming_process=True)
    sched = start(harness, made, namespace, config, feed, listeners=(ends,))
    trigger(sched)
    wait_for(lambda: ends.count() == 1, 20, message="the run ends")
    assert ends.runs[0].succeeded
    assert sorted((item, data) for item, data, _ in feed.processed) == [(0, [1, 2]), (0, [3]), (1, [10])]
    loop = sched.async_loop.thread
    assert loop is not None and {name for _, _, name in feed.processed} == {loop.name}


def test_async_targets_are_checked_when_added() -> None:
    sched = Scheduler("memory://async-checks/ns")

    class Mixed:
        async def fetch_data(self, ctx: ShardingContext) -> list[int]:
            return []

        def process_data(self, ctx: ShardingContext, data: list[int]) -> None:
            pass

    with pytest.raises(ValueError, match="fetch_data is async def but process_data is a plain function"):
        mixed: Any = Mixed()
        sched.add_job(JobConfig(name="mixed", job_type=JobType.DATAFLOW), mixed)

    async def job(ctx: ShardingContext) -> None:
        pass

    checked = make_item_runner(JobConfig(name="loopless"), job)  # as a config file is checked
    with pytest.raises(TypeError, match="AsyncLoop; this runner was made without one"):
        checked(ShardingContext("loopless", "t", 1, "", 0, None, 1.0, 1), lambda: True)
    assert sched.jobs == []
    assert sched.async_loop.thread is None, "a loop started before any async item ran"


def test_a_sync_function_returning_a_coroutine_is_a_clear_failure() -> None:
    async def work(ctx: ShardingContext) -> None:
        pass

    handled, ends = Handled(), Ends()
    with Scheduler("memory://coroutine-returned/ns", max_workers=2) as sched:
        sched.add_job(JobConfig(name="job"), lambda ctx: work(ctx), listeners=[ends], error_handler=handled)
        trigger(sched)
        wait_for(lambda: ends.count() == 1, 20, message="the run ends")
    [(_, error)] = handled.calls
    assert isinstance(error, TypeError) and "returned a coroutine; declare it async def" in str(error)


def test_a_stopped_loop_refuses_coroutines() -> None:
    loop = AsyncLoop("test-loop")

    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    assert loop.run(answer()) == 42
    thread = loop.thread
    assert thread is not None and thread.is_alive()
    loop.stop()
    assert not thread.is_alive()
    coro = answer()
    with pytest.raises(PoolShutDown):
        loop.run(coro)
    assert inspect.getcoroutinestate(coro) == "CORO_CLOSED", "the refused coroutine was left open"


# -- timeouts -------------------------------------------------------------------------------------
def test_a_timed_out_async_item_is_cancelled_and_the_next_fire_runs(
    harness: Harness, namespace: str, made: list[Scheduler], tmp_path: Path
) -> None:
    seen: list[str] = []
    calls = [0]

    async def job(ctx: ShardingContext) -> None:
        calls[0] += 1
        try:
            await asyncio.sleep(30 if calls[0] == 1 else 0)  # the first run outlasts its timeout
            seen.append("done")
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        finally:
            seen.append("finally")

    ends, handled, url = Ends(), Handled(), f"sqlite:///{tmp_path / 'h.db'}"
    config = JobConfig(name="job", timeout_seconds=0.5)
    sched = start(
        harness, made, namespace, config, job, listeners=(ends,), error_handler=handled, history=url
    )
    trigger(sched)
    wait_for(lambda: ends.count() == 1, 20, message="the timed-out run ends")
    run = ends.runs[0]
    assert run.finished is not None and 0.5 <= run.finished - run.started < 5, "not cut at its timeout"
    assert seen == ["cancelled", "finally"]
    error = run.errors[0]
    assert isinstance(error, JobTimeout) and "ran past timeout_seconds=0.5" in str(error)
    assert [exc for _, exc in handled.calls] == [error]
    assert sched.registry.children(PATHS.running) == [], "the running mark outlived the run"
    trigger(sched)
    wait_for(lambda: ends.count() == 2, 20, message="the next run ends")
    assert ends.runs[1].succeeded and seen[2:] == ["done", "finally"]
    failed, succeeded = sorted(history_rows(sched, url), key=lambda r: r.start_time)
    assert not failed.success and (failed.failure_cause or "").startswith(
        "JobTimeout: job job item 0 ran past"
    )
    assert succeeded.success


def test_a_timed_out_script_is_ended_with_the_children_it_started(
    harness: Harness, namespace: str, made: list[Scheduler], tmp_path: Path
) -> None:
    """The script dies of SIGTERM; its child ignores SIGTERM and holds the script's output
    pipe, so only the SIGKILL to the whole group, after the grace, ends it."""
    script_pid, child_pid = tmp_path / "script.pid", tmp_path / "child.pid"
    body = f'echo $$ > {script_pid}; (trap "" TERM; exec sleep 60) & echo $! > {child_pid}; wait'
    config = JobConfig(
        name="job",
        job_type=JobType.SCRIPT,
        script_command_line=f"sh -c {shlex.quote(body)}",
        timeout_seconds=0.5,
        error_handler="IGNORE",
    )
    ends = Ends()
    sched = start(harness, made, namespace, config, listeners=(ends,))
    trigger(sched)
    pids: list[int] = []
    try:
        wait_for(
            lambda: script_pid.exists() and child_pid.exists() and child_pid.read_text().strip(),
            20,
            message="the script and its child started",
        )
        pids = [int(script_pid.read_text()), int(child_pid.read_text())]
        assert ends.count() == 0 and all(alive(pid) for pid in pids), "both run until the timeout"
        wait_for(lambda: ends.count() == 1, 20, message="the script's run ends")
        run = ends.runs[0]
        assert isinstance(run.errors[0], JobTimeout)
        assert [pid for pid in pids if alive(pid)] == [], "a process of the script's group outlived it"
        assert run.finished is not None and run.finished - run.started < 10
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_sync_job_is_told_at_its_deadline(harness: Harness, namespace: str, made: list[Scheduler]) -> None:
    """A sync call cannot be stopped from outside: item 0 looks at ``ctx.cancelled`` and
    returns, item 1 calls ``raise_if_cancelled``; both fail with JobTimeout."""
    at_start: dict[int, bool] = {}
    noticed: list[int] = []

    def job(ctx: ShardingContext) -> None:
        at_start[ctx.sharding_item] = ctx.cancelled
        pause = threading.Event()
        while True:
            if ctx.sharding_item == 0 and ctx.cancelled:
                noticed.append(0)
                return  # returning normally after the deadline is still a timeout
            ctx.raise_if_cancelled()
            pause.wait(0.01)  # one step of the job's own work

    ends = Ends()
    config = JobConfig(name="job", sharding_total_count=2, timeout_seconds=0.5, error_handler="IGNORE")
    sched = start(harness, made, namespace, config, job, listeners=(ends,))
    trigger(sched)
    wait_for(lambda: ends.count() == 1, 20, message="the run ends")
    run = ends.runs[0]
    assert at_start == {0: False, 1: False} and noticed == [0]
    assert set(run.errors) == {0, 1} and all(isinstance(e, JobTimeout) for e in run.errors.values())
    assert run.finished is not None and 0.5 <= run.finished - run.started < 5


# -- retries --------------------------------------------------------------------------------------------
def test_a_failing_item_is_retried_and_each_attempt_recorded(
    harness: Harness, namespace: str, made: list[Scheduler], tmp_path: Path
) -> None:
    """``job`` fails twice then succeeds: three attempts, no error handler call. ``doomed``
    always fails: three attempts, the handler sees the last failure only."""
    attempts: dict[str, list[int]] = {"job": [], "doomed": []}

    def job(ctx: ShardingContext) -> None:
        attempts[ctx.job_name].append(ctx.attempt)
        if ctx.job_name == "doomed" or ctx.attempt < 3:
            raise ValueError(f"attempt {ctx.attempt} fails")

    ends, handled, url = Ends(), Handled(), f"sqlite:///{tmp_path / 'h.db'}"
    config = JobConfig(name="job", retries=2, retry_backoff_seconds=0.05)
    sched = start(
        harness, made, namespace, config, job, listeners=(ends,), error_handler=handled, history=url
    )
    metrics = enable_metrics(sched)
    sched.add_job(config.with_changes(name="doomed"), job, listeners=[ends], error_handler=handled)
    trigger(sched, "job")
    trigger(sched, "doomed")
    wait_for(lambda: ends.count() == 2, 20, message="both runs end")
    assert attempts == {"job": [1, 2, 3], "doomed": [1, 2, 3]}
    runs = {run.job_name: run for run in ends.runs}
    assert runs["job"].succeeded
    [(ctx, error)] = handled.calls
    assert (ctx.job_name, ctx.attempt, str(error)) == ("doomed", 3, "attempt 3 fails")
    assert runs["doomed"].errors == {0: error}
    rows = sorted(history_rows(sched, url), key=lambda r: r.attempt)
    assert [(r.attempt, r.success, r.failure_cause) for r in rows] == [
        (1, False, "ValueError: attempt 1 fails"),
        (2, False, "ValueError: attempt 2 fails"),
        (3, True, None),
    ]
    assert len({(r.fire_time, r.task_id, r.epoch) for r in rows}) == 1, "the attempts are one fire's"
    for job_name in ("job", "doomed"):
        labels = {"job": job_name, "instance": sched.instance_id}
        assert metrics.registry.get_sample_value("shardjob_item_retries_total", labels) == 2


@pytest.mark.parametrize("monitor", [True, False], ids=["monitor", "no-monitor"])
def test_a_retry_stops_once_the_item_moves_to_another_instance(
    harness: Harness, namespace: str, made: list[Scheduler], monitor: bool
) -> None:
    """A's first attempt fails; during its backoff (10 s and more) B joins and the item
    moves to B (flagged, or at once without monitor_execution): A's backoff ends early,
    it makes no second attempt, and its error handler sees the failure once."""
    failed_at: list[float] = []
    attempts: list[tuple[str, int]] = []

    def on_a(ctx: ShardingContext) -> None:
        attempts.append((A, ctx.attempt))
        failed_at.append(time.monotonic())
        raise ValueError("fails on A")

    def on_b(ctx: ShardingContext) -> None:
        attempts.append((B, ctx.attempt))

    config = JobConfig(
        name="job", retries=5, retry_backoff_seconds=10, monitor_execution=monitor, sharding_total_count=1
    )
    ends, handled = Ends(), Handled()
    a = start(harness, made, namespace, config, on_a, instance_id=A, listeners=(ends,), error_handler=handled)
    trigger(a)
    wait_for(lambda: failed_at, 20, message="A's first attempt fails")
    b = start(harness, made, namespace, config, on_b, instance_id=B)
    wait_for(lambda: ends.count() == 1, 20, message="A's run ends")
    assert time.monotonic() - failed_at[0] < 10, "A waited out its backoff instead of seeing the item go"
    assert attempts == [(A, 1)] and len(handled.calls) == 1
    wait_for(lambda: b.runner("job").sharding.ready() is not None, 20, message="B sees an assignment")

    def owner() -> list[str]:
        ready = a.runner("job").sharding.ready()
        return [] if ready is None else [who for who, items in ready.assignment.items.items() if 0 in items]

    wait_for(lambda: owner() == [B], 20, message="item 0 moves to B")
    trigger(b)
    wait_for(lambda: (B, 1) in attempts, 20, message="B runs item 0")
    assert attempts == [(A, 1), (B, 1)]


def test_shutdown_ends_a_retry_backoff(harness: Harness, namespace: str, made: list[Scheduler]) -> None:
    attempts: list[int] = []

    def job(ctx: ShardingContext) -> None:
        attempts.append(ctx.attempt)
        raise ValueError("always fails")

    handled = Handled()
    config = JobConfig(name="job", retries=3, retry_backoff_seconds=30)
    sched = start(harness, made, namespace, config, job, error_handler=handled)
    trigger(sched)
    wait_for(lambda: attempts, 20, message="the first attempt fails")
    began = time.monotonic()
    sched.shutdown(wait=True)
    assert time.monotonic() - began < 10, "shutdown waited for a 30 s backoff"
    assert attempts == [1] and len(handled.calls) == 1


# -- jitter ------------------------------------------------------------------------------------------
def test_jitter_spreads_fire_starts_and_keeps_the_scheduled_fire_time(
    harness: Harness, namespace: str, made: list[Scheduler]
) -> None:
    """Eight every-second jobs with ``jitter_seconds=0.8``: each fire starts 0-0.8 s after
    its scheduled time, spread over that range; the context still says the scheduled
    time; the lateness metric leaves the jitter out."""
    jitter, jobs = 0.8, 8
    starts: list[tuple[float, float]] = []  # (ctx.fire_time, when the item started)
    lock = threading.Lock()

    def job(ctx: ShardingContext) -> None:
        with lock:
            starts.append((ctx.fire_time, time.time()))

    ends = Ends()
    config = JobConfig(name="job0", cron=EVERY_SECOND, jitter_seconds=jitter)
    sched = start(harness, made, namespace, config, job, listeners=(ends,))
    metrics = enable_metrics(sched)
    for n in range(1, jobs):
        sched.add_job(config.with_changes(name=f"job{n}"), job, listeners=[ends])
    wait_for(lambda: ends.count() >= 3 * jobs, 30, message="three fires per job")
    with lock:
        sample = list(starts)
    assert all(fire == int(fire) for fire, _ in sample), "a fire time is not the scheduled whole second"
    delays = [began - fire for fire, began in sample]
    assert all(0 <= d < jitter + 0.5 for d in delays), delays
    assert min(delays) < 0.3 and max(delays) > 0.5, f"starts not spread over [0, {jitter}): {delays}"
    with ends.lock:
        runs = list(ends.runs)
    assert all(0 <= run.delay < jitter for run in runs)
    assert len({run.delay for run in runs}) > len(runs) // 2, "one delay shared by every fire"
    labels = {"instance": sched.instance_id}
    count = metrics.registry.get_sample_value("shardjob_fire_lateness_seconds_count", labels) or 0
    total = metrics.registry.get_sample_value("shardjob_fire_lateness_seconds_sum", labels) or 0
    assert count > 0 and total / count < 0.2, f"mean lateness {total / max(count, 1):.3f}s counts the jitter"
