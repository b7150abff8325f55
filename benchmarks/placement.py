"""Where a benchmark's measured scheduler process runs: kept off one core of the machine.

Hazard: a scheduler process runs Python on one core at a time (the GIL), and here the
registry servers run on the same machine. Left to the kernel, the process's threads move
onto the core a busy server is using: the thread holding the GIL is preempted by the
server, and the GIL is handed to threads waiting on the other core. On 2 cores, with
10,000 every-second jobs on etcd, that cost 8-14 % of the fires due, and each fire took
14-20 % less CPU once the process kept off one core (BENCHMARKS.md, "Kept off the
server's core"). In a deployment the registry has machines of its own.

The trick: the measured process is pinned to every CPU it may use but one (``APART``).
The servers may still run anywhere, but the process keeps off that one, so a busy server
has a core where it preempts nobody's GIL. On a
machine with one CPU, or with ``SHARED``, nothing is pinned. Each child pins itself
before it starts a thread (threads inherit the set), and so does each anchor, so
APScheduler is measured on the same CPUs as shardjob.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Collection
from typing import Any

__all__ = ["APART", "PLACEMENTS", "SHARED", "add_placement", "describe", "measured_cpus", "pin", "placement_fields", "placement_sentence"]

#: the measured process on all CPUs but the last one, left to the registry servers
APART = "apart"
#: the measured process and the servers on every CPU, as the kernel places them
SHARED = "shared"
PLACEMENTS = (APART, SHARED)


def measured_cpus(placement: str) -> list[int]:
    """The CPUs the measured process is pinned to; empty when it is not pinned."""
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; known: {', '.join(PLACEMENTS)}")
    cpus = sorted(os.sched_getaffinity(0))
    if placement == SHARED or len(cpus) < 2:
        return []
    return cpus[:-1]


def add_placement(parser: argparse.ArgumentParser) -> None:
    """``--placement apart|shared`` for a benchmark that runs measured children."""
    parser.add_argument(
        "--placement",
        choices=PLACEMENTS,
        default=APART,
        help=f"{APART} (default): pin each child to all CPUs but one, left to the registry servers; "
        f"{SHARED}: pin nothing (see benchmarks/placement.py)",
    )


def placement_fields(placement: str, cpus: Collection[int]) -> dict[str, Any]:
    """What a benchmark's document records of its placement (``placement_sentence`` reads it)."""
    return {
        "placement": placement,
        "measured_cpus": sorted(cpus),
        "machine_cpus": len(os.sched_getaffinity(0)),  # those this run may use
    }


def placement_sentence(document: dict[str, Any]) -> str:
    """``describe`` of a document with ``placement_fields``, after a space; empty for a run
    from before the option (nothing was pinned, nothing is said)."""
    placement = document.get("placement")
    if placement is None:
        return ""
    return " " + describe(placement, document["measured_cpus"], document["machine_cpus"])


def pin(cpus: Collection[int]) -> None:
    """Pin this process (and the threads it starts from now on) to ``cpus``; none: no-op."""
    if cpus:
        os.sched_setaffinity(0, set(cpus))


def describe(placement: str, cpus: Collection[int], machine_cpus: int) -> str:
    """How the measured processes were placed, as a sentence for the report."""
    if not cpus:
        return f"The measured processes and the registry servers share all {machine_cpus} CPUs."
    listed = ", ".join(str(c) for c in sorted(cpus))
    return (
        f"Each measured process is pinned to CPU{'s' if len(cpus) > 1 else ''} {listed} of the machine's "
        f"{machine_cpus} (`--placement {placement}`), which keeps it off a core the registry servers "
        "may use, as their own machines would in a deployment."
    )
