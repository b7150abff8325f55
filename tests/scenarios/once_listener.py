"""The once-per-cluster listener ``shardjob worker`` processes run in the scenarios
(``--listener tests.scenarios.once_listener:RecordingOnce``).

Each ``before_all`` / ``after_all`` appends one JSON line (kind, fire, instance, start,
end) to ``$SHARDJOB_RECORD_FILE.once``, written whole and flushed, as the recording job's
lines. ``SHARDJOB_ONCE_COMPLETED_TIMEOUT`` sets the completed timeout (seconds).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from scheduler import DistributeOnceListener, JobRun
from tests.scenarios.recording_job import INSTANCE_ENV, RECORD_FILE_ENV

__all__ = ["COMPLETED_TIMEOUT_ENV", "OnceCall", "RecordingOnce", "read_once_calls"]

COMPLETED_TIMEOUT_ENV = "SHARDJOB_ONCE_COMPLETED_TIMEOUT"
_lock = threading.Lock()


@dataclass(frozen=True)
class OnceCall:
    kind: str
    fire_time: float
    instance: str
    start: float
    end: float


def once_file(record_file: str | Path) -> Path:
    return Path(f"{record_file}.once")


def read_once_calls(record_file: Path) -> list[OnceCall]:
    try:
        text = once_file(record_file).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [OnceCall(**json.loads(line)) for line in text.split("\n")[:-1] if line.strip()]


class RecordingOnce(DistributeOnceListener):
    def __init__(self) -> None:
        super().__init__(started_timeout=5, completed_timeout=float(os.environ.get(COMPLETED_TIMEOUT_ENV) or 5))

    def _record(self, kind: str, run: JobRun) -> None:
        start = time.time()
        line = json.dumps(
            {
                "kind": kind,
                "fire_time": run.fire_time,
                "instance": os.environ.get(INSTANCE_ENV) or str(os.getpid()),
                "start": start,
                "end": time.time(),
            }
        )
        with _lock, once_file(os.environ[RECORD_FILE_ENV]).open("a", encoding="utf-8") as out:
            out.write(line + "\n")

    def before_all(self, run: JobRun) -> None:
        self._record("before", run)

    def after_all(self, run: JobRun) -> None:
        self._record("after", run)
