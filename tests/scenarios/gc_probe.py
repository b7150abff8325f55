"""A job that writes the garbage collector's thresholds, as its process has them, to the
file its job parameter names: what ``shardjob worker --gc-threshold`` set."""

from __future__ import annotations

import gc
import json
from pathlib import Path

from scheduler import ShardingContext


def record(ctx: ShardingContext) -> None:
    Path(ctx.job_parameter).write_text(json.dumps(gc.get_threshold()))
