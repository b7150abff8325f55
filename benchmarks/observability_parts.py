"""What each part of observability costs per fire, measured apart in one thread: the run
events' observers (metrics, the history recorder, both) as the runner calls them for a
fire of one item, and the history writer's drain of the rows one fire leaves, per
database, on a fresh table and after minutes of rows. Added to a bare fire's CPU, they give
the least a fire with them can cost, the floor under ``observability_overhead``'s ratios
(which run 30 s on fresh tables): the same parts, with the collector switched off and no
other thread about.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["measure"]

#: fires per measurement: 30 s of 1,000 every-second jobs
_FIRES = 30_000


def _fires(jobs: int, count: int = _FIRES, first: int = 0) -> Iterator[tuple[Any, Any]]:
    """``count`` fires of one item each, ``jobs`` a second, from fire number ``first``."""
    from scheduler.context import ShardingContext
    from scheduler.handlers import JobRun

    for i in range(first, first + count):
        name = f"job-{i % jobs:05d}"
        fire_time = 1.7e9 + i // jobs
        run = JobRun(name, "bench", fire_time, 1, (0,), started=fire_time + 0.01)
        ctx = ShardingContext(name, f"{name}@-@0@-@READY@-@bench@-@1", 1, "", 0, None, fire_time, 1)
        yield run, ctx


def _drive(observers: Any, fires: list[tuple[Any, Any]]) -> float:
    """CPU µs per fire of the events one fire of one item raises, in the runner's order."""
    began = time.thread_time()
    for run, ctx in fires:
        observers.fire_due(run.job_name, run.fire_time, "NORMAL")
        observers.run_started(run, "NORMAL", ctx.task_id)
        observers.item_started(run, ctx)
        observers.item_ended(run, ctx, None)
        observers.run_ended(run)
    return (time.thread_time() - began) / len(fires) * 1e6


def _drain(url: str, jobs: int, seconds: int, recorder_for: Any) -> dict[str, float]:
    """CPU µs per fire of the history writer on ``url`` (its defaults), fed ``jobs`` fires a
    second for ``seconds`` simulated seconds: a batch falls due every ``flush_interval``,
    as on its thread. Reported for the first and the last 30 s: a table's cost per row
    grows with it."""
    from scheduler.history.writer import HistoryWriter

    writer = HistoryWriter(url)  # never started: drained here, on this thread
    recorder = recorder_for(writer)
    interval = max(1, round(writer._flush_interval))
    spent: list[float] = []
    try:
        for second in range(seconds):
            _drive(recorder, list(_fires(jobs, count=jobs, first=second * jobs)))
            if second % interval != interval - 1:
                continue
            writer._next_batch = 0.0  # the interval has passed
            began = time.thread_time()
            while writer._write_once():
                pass
            spent.append((time.thread_time() - began) / (jobs * interval) * 1e6)
    finally:
        writer.close()
    window = max(1, 30 // interval)
    first = spent[1 : window + 1] or spent  # the first batch aside: it created the schema
    last = spent[-window:]
    return {"first_30s": round(sum(first) / len(first), 2), "last_30s": round(sum(last) / len(last), 2)}


def measure(jobs: int, databases: dict[str, str], seconds: int = 150) -> dict[str, Any]:
    """What each part costs, ``jobs`` every-second jobs, the drain over ``seconds`` (at
    least 4): ``{"producers": {part: µs/fire}, "drain": {database: {"first_30s", "last_30s"}},
    "rows_per_fire": n, "seconds": seconds}``; ``databases`` maps a label to a history URL
    (an empty database)."""
    from scheduler import Scheduler
    from scheduler.events import Observers
    from scheduler.history.recorder import HistoryRecorder
    from scheduler.history.writer import HistoryWriter
    from scheduler.metrics import MetricsObserver

    if seconds < 4:
        raise ValueError(f"the drain needs at least 4 simulated seconds, got {seconds}")
    fires = list(_fires(jobs))
    sched = Scheduler("memory://observability-parts")
    metrics = MetricsObserver(sched)
    enabled = gc.isenabled()
    gc.disable()
    try:
        writer = HistoryWriter("sqlite://")  # an in-memory database, never written
        recorder = HistoryRecorder(writer, sched.identity)
        producers: dict[str, float] = {}
        for part, observers in (
            ("none", Observers([])),
            ("metrics", Observers([metrics])),
            ("history", Observers([recorder])),
            ("metrics + history", Observers([metrics, recorder])),
        ):
            writer._buffer.clear()
            producers[part] = round(_drive(observers, fires), 2)
        rows_per_fire = len(writer._buffer) / len(fires)
        writer.close()
        drain = {
            label: _drain(url, jobs, seconds, lambda w: Observers([HistoryRecorder(w, sched.identity)]))
            for label, url in databases.items()
        }
    finally:
        if enabled:
            gc.enable()
    return {"producers": producers, "drain": drain, "rows_per_fire": round(rows_per_fire, 2), "seconds": seconds}
