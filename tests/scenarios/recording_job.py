"""The job that ``shardjob worker`` processes run in the multi-process scenarios.

``record(ctx)`` appends one JSON line per execution (job, item, fire_time, epoch, instance,
start, end, plus total, failover and pid for diagnosis) to the file named by
``SHARDJOB_RECORD_FILE``. ``SHARDJOB_RECORD_INSTANCE`` names the instance (the pid when
unset); ``SHARDJOB_RECORD_HOLD`` (seconds) keeps each item busy so runs span hand-overs.

Invariant: a line is written and flushed only once its execution has ended, in one
``write`` under a lock, so a reader sees whole executions only — at worst a torn last
line of a process killed mid-write, which ``tests.scenarios.workers.read_records`` skips.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import IO

from scheduler import ShardingContext

__all__ = ["HOLD_ENV", "INSTANCE_ENV", "RECORD_FILE_ENV", "record"]

RECORD_FILE_ENV = "SHARDJOB_RECORD_FILE"
INSTANCE_ENV = "SHARDJOB_RECORD_INSTANCE"
HOLD_ENV = "SHARDJOB_RECORD_HOLD"

_lock = threading.Lock()
_out: IO[str] | None = None


def _file() -> IO[str]:
    global _out
    if _out is None:
        path = os.environ.get(RECORD_FILE_ENV)
        if not path:
            raise RuntimeError(f"{RECORD_FILE_ENV} is not set: nowhere to record executions")
        # held for the process's life: one open per process, not per execution
        _out = open(path, "a", encoding="utf-8")  # noqa: SIM115
    return _out


def record(ctx: ShardingContext) -> None:
    start = time.time()
    hold = float(os.environ.get(HOLD_ENV) or 0)
    if hold > 0:
        time.sleep(hold)  # the job's simulated work, not a wait for a condition
    end = time.time()
    line = json.dumps(
        {
            "job": ctx.job_name,
            "item": ctx.sharding_item,
            "fire_time": ctx.fire_time,
            "epoch": ctx.epoch,
            "instance": os.environ.get(INSTANCE_ENV) or str(os.getpid()),
            "start": start,
            "end": end,
            "total": ctx.sharding_total_count,
            "failover": ctx.failover,
            "pid": os.getpid(),
        },
        sort_keys=True,
    )
    with _lock:
        out = _file()
        out.write(line + "\n")
        out.flush()
