"""What the run path does to one item, end to end on memory, ZooKeeper and etcd:
``fire_datetime``.

Each test is judged by what its feature changes, so that it fails without it; every "did
not happen" is judged after an event that proves it had the time to happen.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from scheduler import (
    JobConfig,
    JobListener,
    JobRun,
    Scheduler,
    ShardingContext,
)
from scheduler.cron import parse_time_zone
from scheduler.handlers import ErrorHandler
from scheduler.history import HistoryReader
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
