"""Targets, listeners and error handlers that the config-file tests name in their TOML files
(``tests.scheduler.file_jobs:ATTR``), in-process and in ``shardjob worker --config``
processes.

Every event is one JSON line appended to the file named by ``SHARDJOB_RECORD_FILE`` (the
variable ``tests.scenarios.workers.Worker`` sets): ``{"kind": "item", "job", "item",
"total", "job_parameter", "sharding_parameter"}`` per item run, ``{"kind": "after_job",
"job", "items", "listener"}`` per run a listener saw. The variable is read at each write,
so tests in one process can each have their own file.

Invariant: a line is written in one ``write`` under a lock and flushed, and a reader keeps
complete lines only (``read_events``).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from scheduler import JobListener, JobRun, ShardingContext
from tests.scenarios.recording_job import RECORD_FILE_ENV

__all__ = ["LISTENER", "Dataflow", "RecordingListener", "handler", "make_listener", "read_events", "record"]

_lock = threading.Lock()


def _write(event: dict[str, Any]) -> None:
    path = os.environ.get(RECORD_FILE_ENV)
    if not path:
        raise RuntimeError(f"{RECORD_FILE_ENV} is not set: nowhere to record")
    line = json.dumps(event, sort_keys=True) + "\n"
    with _lock, open(path, "a", encoding="utf-8") as out:
        out.write(line)
        out.flush()


def read_events(path: Path) -> list[dict[str, Any]]:
    """The complete lines written so far (a torn last line is skipped)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]


def record(ctx: ShardingContext) -> None:
    """A simple job: records the item and what the configuration handed it."""
    _write(
        {
            "kind": "item",
            "job": ctx.job_name,
            "item": ctx.sharding_item,
            "total": ctx.sharding_total_count,
            "job_parameter": ctx.job_parameter,
            "sharding_parameter": ctx.sharding_parameter,
        }
    )


class RecordingListener(JobListener):
    """Records each run it is told of; ``label`` tells the instances apart."""

    made = 0  # how many were made (a class named in a file is called once per job)

    def __init__(self, label: str = "class") -> None:
        RecordingListener.made += 1
        self.label = label

    def after_job(self, run: JobRun) -> None:
        _write({"kind": "after_job", "job": run.job_name, "items": list(run.items), "listener": self.label})


#: a listener instance: named in a file, used as it is
LISTENER = RecordingListener("instance")


def make_listener() -> RecordingListener:
    """A zero-argument factory of listeners."""
    return RecordingListener("factory")


class Dataflow:
    """A dataflow job (fetches nothing)."""

    def fetch_data(self, ctx: ShardingContext) -> list[Any]:
        return []

    def process_data(self, ctx: ShardingContext, data: list[Any]) -> None:
        """Never called: nothing is fetched."""


def handler(ctx: ShardingContext, exc: BaseException) -> None:
    """A callable error handler."""


#: neither a job, a listener nor a handler
NOT_CALLABLE = 5


class Unmakeable(JobListener):
    """A listener class whose constructor fails."""

    def __init__(self) -> None:
        raise RuntimeError("no listener today")
