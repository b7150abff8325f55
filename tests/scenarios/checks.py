"""Invariant checkers over the executions that worker processes recorded.

Each checker returns the violations it found (an empty list when the invariant holds), as
readable strings, so a test can ``assert check(...) == []`` and a failure shows exactly
which (item, fire) went wrong and who ran it. They read records only: what the job's code
saw, never the registry's own account of itself.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Record",
    "by_fire",
    "coverage_gaps",
    "doubled_beyond_failover",
    "doubled_runs",
    "failover_reruns",
    "fires_after",
    "missed_pairs",
    "overlapping_runs",
    "recovery_point",
    "spread_mismatches",
    "stale_epoch_runs",
]


@dataclass(frozen=True)
class Record:
    """One execution of one item, as ``tests/scenarios/recording_job.py`` wrote it."""

    job: str
    item: int
    fire_time: float
    epoch: int
    instance: str
    start: float
    end: float
    total: int = 0
    failover: bool = False
    pid: int = 0

    @classmethod
    def from_json(cls, line: str) -> Record:
        doc: dict[str, Any] = json.loads(line)
        return cls(
            job=str(doc["job"]),
            item=int(doc["item"]),
            fire_time=float(doc["fire_time"]),
            epoch=int(doc["epoch"]),
            instance=str(doc["instance"]),
            start=float(doc["start"]),
            end=float(doc["end"]),
            total=int(doc.get("total", 0)),
            failover=bool(doc.get("failover", False)),
            pid=int(doc.get("pid", 0)),
        )


def by_fire(records: Iterable[Record]) -> dict[float, dict[int, list[str]]]:
    """fire time -> item -> the instances that ran it (in record order)."""
    table: dict[float, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    for rec in records:
        table[rec.fire_time][rec.item].append(rec.instance)
    return {fire: dict(items) for fire, items in table.items()}


def fires_after(moment: float, count: int, period: float = 1.0) -> list[float]:
    """The ``count`` fire times of a schedule firing every ``period`` seconds (on whole
    multiples of it) strictly after ``moment``."""
    first = (math.floor(moment / period) + 1) * period
    return [first + k * period for k in range(count)]


def doubled_runs(records: Iterable[Record]) -> list[str]:
    """Invariant 1, per fire: no (job, item, fire time) ran more than once, by anyone."""
    runs: dict[tuple[str, int, float], list[Record]] = defaultdict(list)
    for rec in records:
        runs[(rec.job, rec.item, rec.fire_time)].append(rec)
    return [
        f"{job} item {item} fire {fire:.3f} ran {len(recs)} times: "
        + ", ".join(f"{r.instance} (epoch {r.epoch})" for r in recs)
        for (job, item, fire), recs in sorted(runs.items())
        if len(recs) > 1
    ]


def overlapping_runs(records: Iterable[Record]) -> list[str]:
    """Invariant 1, in time: no two executions of the same item by different instances
    overlapped. One process's clock serves every worker on this host, so start/end of
    different processes compare directly."""
    per_item: dict[tuple[str, int], list[Record]] = defaultdict(list)
    for rec in records:
        per_item[(rec.job, rec.item)].append(rec)
    found: list[str] = []
    for (job, item), recs in sorted(per_item.items()):
        ordered = sorted(recs, key=lambda r: r.start)
        for i, first in enumerate(ordered):
            for second in ordered[i + 1 :]:
                if second.start >= first.end:
                    break
                if second.instance != first.instance:
                    found.append(
                        f"{job} item {item}: {first.instance} ran fire {first.fire_time:.3f} "
                        f"[{first.start:.3f}, {first.end:.3f}] while {second.instance} ran fire "
                        f"{second.fire_time:.3f} [{second.start:.3f}, {second.end:.3f}]"
                    )
    return found


def stale_epoch_runs(records: Iterable[Record]) -> list[str]:
    """With ``monitor_execution`` (the default) a resharding waits for the running items:
    no execution under an older assignment epoch may still run when one under a newer
    epoch starts, on any instance."""
    per_job: dict[str, list[Record]] = defaultdict(list)
    for rec in records:
        per_job[rec.job].append(rec)
    found: list[str] = []
    for job, recs in sorted(per_job.items()):
        latest_older: Record | None = None  # the latest-ending run of all lower epochs
        for epoch in sorted({r.epoch for r in recs}):
            current = [r for r in recs if r.epoch == epoch]
            if latest_older is not None:
                for rec in current:
                    if rec.start < latest_older.end:
                        found.append(
                            f"{job}: {rec.instance} started item {rec.item} (epoch {epoch}) at "
                            f"{rec.start:.3f} while {latest_older.instance} still ran item "
                            f"{latest_older.item} (epoch {latest_older.epoch}) until {latest_older.end:.3f}"
                        )
            ending = max(current, key=lambda r: r.end)
            if latest_older is None or ending.end > latest_older.end:
                latest_older = ending
    return found


def coverage_gaps(records: Iterable[Record], fires: Iterable[float], total: int) -> list[str]:
    """For each of ``fires``, every item in ``range(total)`` ran exactly once (and no
    other item ran)."""
    table = by_fire(records)
    gaps: list[str] = []
    for fire in fires:
        ran = table.get(fire, {})
        missing = sorted(set(range(total)) - set(ran))
        extra = sorted(set(ran) - set(range(total)))
        doubled = {item: who for item, who in ran.items() if len(who) > 1}
        if missing or extra or doubled:
            gaps.append(f"fire {fire:.3f}: missing {missing}, unexpected {extra}, doubled {doubled}")
    return gaps


def spread_mismatches(
    records: Iterable[Record], fires: Iterable[float], assignment: Mapping[str, Sequence[int]]
) -> list[str]:
    """For each of ``fires``, every item that ran was run by the instance ``assignment``
    (instance -> items) gives it to. Coverage is ``coverage_gaps``' business."""
    owner = {item: instance for instance, items in assignment.items() for item in items}
    table = by_fire(records)
    wrong: list[str] = []
    for fire in fires:
        for item, who in sorted(table.get(fire, {}).items()):
            expected = owner.get(item)
            if who != [expected]:
                wrong.append(f"fire {fire:.3f} item {item}: ran on {who}, assigned to {expected}")
    return wrong


def doubled_beyond_failover(records: Iterable[Record]) -> list[str]:
    """Invariant 1 with failover's at-least-once allowance: a (job, item, fire) may be run
    again by a failover run (``failover`` true) of a pair that already ran, but it has at
    most ONE regular run. Concurrency of any two runs is ``overlapping_runs``' business."""
    runs: dict[tuple[str, int, float], list[Record]] = defaultdict(list)
    for rec in records:
        runs[(rec.job, rec.item, rec.fire_time)].append(rec)
    found: list[str] = []
    for (job, item, fire), recs in sorted(runs.items()):
        regular = [r for r in recs if not r.failover]
        if len(regular) > 1:
            found.append(
                f"{job} item {item} fire {fire:.3f} had {len(regular)} regular runs: "
                + ", ".join(f"{r.instance} (epoch {r.epoch}, start {r.start:.3f})" for r in regular)
            )
    return found


def failover_reruns(records: Iterable[Record]) -> list[str]:
    """The (item, fire) pairs run more than once where every extra run is a failover run:
    allowed (at least once), reported so that a report can say how often it happens."""
    runs: dict[tuple[str, int, float], list[Record]] = defaultdict(list)
    for rec in records:
        runs[(rec.job, rec.item, rec.fire_time)].append(rec)
    return [
        f"{job} item {item} fire {fire:.3f} ran {len(recs)} times: "
        + ", ".join(f"{r.instance}{' (failover)' if r.failover else ''}" for r in recs)
        for (job, item, fire), recs in sorted(runs.items())
        if len(recs) > 1 and sum(not r.failover for r in recs) <= 1
    ]


def missed_pairs(records: Iterable[Record], fires: Iterable[float], total: int) -> list[tuple[int, float]]:
    """Invariant 2: the (item, fire) pairs of ``fires`` x ``range(total)`` that never ran,
    by anyone, in any kind of run."""
    table = by_fire(records)
    return [(item, fire) for fire in fires for item in range(total) if item not in table.get(fire, {})]


def recovery_point(
    records: Iterable[Record],
    after: float,
    total: int,
    *,
    exclude: Iterable[str] = (),
    regular_only: bool = False,
) -> tuple[float, float] | None:
    """When full coverage came back after the moment ``after`` (a fault): over the fires
    later than ``after``, the one whose every item had been started soonest by instances
    not in ``exclude`` (the dead ones); returns (that fire, the moment its last item
    started), or None when no later fire has run every item yet. ``regular_only`` counts
    regular runs only (service back to normal, not failover catching up)."""
    skip = set(exclude)
    first_start: dict[float, dict[int, float]] = defaultdict(dict)
    for rec in records:
        if rec.fire_time <= after or rec.instance in skip or (regular_only and rec.failover):
            continue
        if not 0 <= rec.item < total:
            continue
        started = first_start[rec.fire_time]
        started[rec.item] = min(started.get(rec.item, rec.start), rec.start)
    complete = [(max(starts.values()), fire) for fire, starts in first_start.items() if len(starts) == total]
    if not complete:
        return None
    moment, fire = min(complete)
    return fire, moment
