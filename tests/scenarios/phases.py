"""Phases of a fleet's timeline: wait until a fire ran as an assignment says, wait for
given fires, and check a phase's fires were complete and spread right.

Every wait is bounded and fails with the fleet's output.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sharding import get_strategy
from tests.scenarios.checks import Record, coverage_gaps, spread_mismatches
from tests.scenarios.workers import Fleet
from tests.waiting import wait_for

__all__ = ["await_fires", "check_phase", "expected_spread", "fires_between", "settle"]


def expected_spread(instance_ids: Sequence[str], total: int, job: str = "job") -> dict[str, list[int]]:
    """What AVG_ALLOCATION gives ``instance_ids`` (handed to it sorted descending)."""
    return get_strategy("AVG_ALLOCATION")(sorted(instance_ids, reverse=True), job, total)


def fires_between(first: float, before: float) -> list[float]:
    """Whole-second fires from ``first`` up to, not including, ``before``."""
    return [float(f) for f in range(math.ceil(first), math.ceil(before))]


def settle(fleet: Fleet, assignment: dict[str, list[int]], total: int, timeout: float = 30.0) -> float:
    """The first fire that ran every item exactly once where ``assignment`` says."""

    def settled() -> float | None:
        records = fleet.records()
        for fire in sorted({r.fire_time for r in records}):
            if not coverage_gaps(records, [fire], total) and not spread_mismatches(
                records, [fire], assignment
            ):
                return fire
        return None

    found = wait_for(
        settled,
        timeout,
        interval=0.1,
        message=lambda: f"no fire spread as {assignment}:\n{fleet.describe()}",
    )
    assert found is not None
    return found


def await_fires(fleet: Fleet, fires: Sequence[float], total: int, timeout: float = 20.0) -> list[Record]:
    """Wait until every item of ``fires`` ran, or until a fire two seconds past the last
    one has run (a gap is final by then: runs last HOLD seconds); return all records."""

    def done() -> bool:
        records = fleet.records()
        return not coverage_gaps(records, fires, total) or any(r.fire_time >= fires[-1] + 2 for r in records)

    wait_for(
        done,
        timeout,
        interval=0.1,
        message=lambda: f"fires {fires} incomplete: {coverage_gaps(fleet.records(), fires, total)}",
    )
    return fleet.records()


def check_phase(
    records: list[Record], fires: Sequence[float], assignment: dict[str, list[int]], total: int
) -> None:
    assert fires, "the phase has no fire to check"
    assert coverage_gaps(records, fires, total) == []
    assert spread_mismatches(records, fires, assignment) == []
