"""A job that writes the garbage collector's thresholds, as its process has them, to the
file its job parameter names: what ``shardjob worker --gc-threshold`` set.

Invariant: the file appears whole (written beside it, then renamed into place), since a
reader waits for it to exist and then reads it at once."""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path

from scheduler import ShardingContext


def record(ctx: ShardingContext) -> None:
    target = Path(ctx.job_parameter)
    staged = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    staged.write_text(json.dumps(gc.get_threshold()))
    os.replace(staged, target)
