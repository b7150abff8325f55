"""The built-in sharding strategies: ElasticJob's three, byte-for-byte, and STICKY.

Every strategy maps an ordered instance list, a job name and an item count to
``{instance: [items]}``. Invariants: every given instance is a key (possibly with ``[]``);
each item ``0..total-1`` appears exactly once; an empty instance list gives ``{}``; the
caller's list is never mutated. ElasticJob's results depend on the order of the list it is
given — the sharding service hands instances over sorted descending as strings, as
ElasticJob does — and on Java's ``String.hashCode`` of the job name, never Python's
(salted per process) ``hash()``.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

__all__ = [
    "avg_allocation",
    "java_string_hash",
    "odevity",
    "round_robin",
    "sticky",
]

Assignment = dict[str, list[int]]


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode``: over UTF-16 code units, signed 32-bit overflow."""
    data = text.encode("utf-16-be", errors="surrogatepass")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def _check_args(instances: Sequence[str], total: int) -> list[str]:
    units = list(instances)
    if len(set(units)) != len(units):
        duplicated = sorted({u for u in units if units.count(u) > 1})
        raise ValueError(f"sharding instances must be distinct; repeated: {duplicated}")
    if isinstance(total, bool) or not isinstance(total, int) or total < 0:
        raise ValueError(f"sharding total count must be an int >= 0, got {total!r}")
    return units


def _average(units: list[str], total: int) -> Assignment:
    """ElasticJob's AverageAllocationJobShardingStrategy on an already ordered list.

    Instance k gets ``[k*q, (k+1)*q)`` with ``q = total // n``; the remainder items go one
    each to the first instances (3 instances, 8 items -> [0,1,6] [2,3,7] [4,5]).
    """
    if not units:
        return {}
    n = len(units)
    per = total // n
    result: Assignment = {unit: list(range(k * per, (k + 1) * per)) for k, unit in enumerate(units)}
    for k in range(total % n):
        result[units[k]].append(per * n + k)
    return result


def avg_allocation(instances: Sequence[str], job_name: str, total: int) -> Assignment:
    """AVG_ALLOCATION (ElasticJob's default)."""
    return _average(_check_args(instances, total), total)


def odevity(instances: Sequence[str], job_name: str, total: int) -> Assignment:
    """ODEVITY: reverse the list when the job name's Java hash is even, then AVG."""
    units = _check_args(instances, total)
    if java_string_hash(job_name) % 2 == 0:
        units.reverse()
    return _average(units, total)


def round_robin(instances: Sequence[str], job_name: str, total: int) -> Assignment:
    """ROUND_ROBIN: rotate the list left by ``|hash| mod n``, then AVG.

    Java's ``Math.abs(Integer.MIN_VALUE)`` stays negative and ElasticJob then indexes the
    list with a negative number and fails; here ``|hash|`` is the true absolute value
    (2**31 for that one name), so the rotation is defined for every name.
    """
    units = _check_args(instances, total)
    if not units:
        return {}
    offset = abs(java_string_hash(job_name)) % len(units)
    return _average(units[offset:] + units[:offset], total)


def sticky(
    instances: Sequence[str],
    job_name: str,
    total: int,
    previous: Mapping[str, Sequence[int]] | None = None,
) -> Assignment:
    """STICKY: move as few items as possible when instances come and go.

    Every item stays with its previous owner while that owner is still given and holds no
    more than its fair share, ``ceil(total / n)`` (an owner above it keeps its lowest
    items). Items without an owner — of departed instances, above a share, or new — go one
    by one, lowest first, to the least loaded instance (ties: list order). With no previous
    assignment it is AVG_ALLOCATION, so a job starts out exactly as ElasticJob would.
    Deterministic: the same inputs give the same result.
    """
    units = _check_args(instances, total)
    if not units:
        return {}
    if not previous:
        return _average(units, total)
    share = -(-total // len(units))
    result: Assignment = {unit: [] for unit in units}
    taken: set[int] = set()
    for unit in units:
        kept = sorted({i for i in previous.get(unit, ()) if 0 <= i < total and i not in taken})[:share]
        result[unit] = kept
        taken.update(kept)
    load = [(len(result[unit]), k, unit) for k, unit in enumerate(units)]
    heapq.heapify(load)
    for item in range(total):
        if item in taken:
            continue
        count, k, target = heapq.heappop(load)
        result[target].append(item)
        heapq.heappush(load, (count + 1, k, target))
    for unit in units:
        result[unit].sort()
    return result

