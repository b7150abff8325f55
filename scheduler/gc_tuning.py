"""The garbage collector's setting for a process that runs many jobs.

Hazard: every fire allocates a few dozen containers (its run, its context, its registry
ops, their callbacks) that live until its run ends: milliseconds, or a second when
thousands of jobs fire in the same second. CPython's first threshold (700 allocations)
collects the young generation so often that they outlive two young collections and reach
the oldest generation; once a quarter of the heap got there that way, a full collection
walks all of it. With 10,000 every-second jobs in one process, that took 70 % of a core,
and a fifth to a third of the fires went unrun (BENCHMARKS.md, "Many jobs").

The trick: a first threshold of 20,000 lets those containers die young, before a young
collection promotes them. It costs a few megabytes of not-yet-collected young objects and
changes nothing else. It is the process's setting, not a job's: ``shardjob worker`` owns
its process and applies it (``--gc-threshold``); an application that embeds a
``Scheduler`` with many jobs decides for itself (``tune_gc()`` before ``start()``).
"""

from __future__ import annotations

import gc

__all__ = ["WORKER_GC_THRESHOLD", "tune_gc"]

#: the first threshold ``shardjob worker`` sets (CPython's default is 700)
WORKER_GC_THRESHOLD = 20_000


def tune_gc(threshold: int = WORKER_GC_THRESHOLD) -> tuple[int, int, int]:
    """Set the collector's first threshold to ``threshold`` (0: leave it as it is), the
    other two unchanged; the thresholds now in force. ``ValueError`` for a negative one."""
    if not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 0:
        raise ValueError(f"the collector's threshold must be an int >= 0 (0: unchanged), got {threshold!r}")
    if threshold:
        _, second, third = gc.get_threshold()
        gc.set_threshold(threshold, second, third)
    first, second, third = gc.get_threshold()
    return first, second, third
