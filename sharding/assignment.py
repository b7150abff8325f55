"""The assignment of a job's items to instances: ONE registry node, JSON, with an epoch.

ElasticJob writes one ``sharding/{i}/instance`` node per item in one multi-op, which breaks
etcd's 128-op limit past ~60 items; here the whole assignment is one value (items as
ranges, so 10,000 items over 200 instances stay a few kilobytes), written in one
transaction whatever the counts.

Invariants: an assignment covers each item exactly once (checked on encode and decode);
``epoch`` only grows; a node that does not decode raises :class:`CorruptNodeError`
naming the path and the fault, never a bare exception.
"""

from __future__ import annotations

import enum
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from registry.errors import ShardJobError

__all__ = ["Assignment", "AssignmentState", "CorruptNodeError", "decode_items", "encode_items"]


class CorruptNodeError(ShardJobError, ValueError):
    """A node in the registry holds a value this version cannot read (written by someone
    else, or by a version with another layout); a ``ValueError`` too, as it always was."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"corrupt registry node {path}: {problem}")
        self.path = path
        self.problem = problem


class AssignmentState(enum.Enum):
    READY = "ready"
    #: the leader is resharding: no new run may start until the next READY epoch
    RESHARDING = "resharding"


def encode_items(items: Iterable[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2,5,7-8"``."""
    if isinstance(items, (tuple, list)) and len(items) == 1:  # most runs of most jobs
        return str(int(items[0]))
    ordered = sorted(set(items))
    parts: list[str] = []
    start = prev = None
    for item in ordered:
        if start is None:
            start = prev = item
        elif item == prev + 1:  # type: ignore[operator]
            prev = item
        else:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = prev = item
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts)


def decode_items(text: str) -> list[int]:
    """Inverse of :func:`encode_items`; ``ValueError`` on anything else."""
    if not isinstance(text, str):
        raise ValueError(f"items must be a string of ranges, got {type(text).__name__}")
    items: list[int] = []
    if not text:
        return items
    for part in text.split(","):
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"bad item range {part!r}")
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise ValueError(f"bad item range {part!r}")
        items.extend(range(first, last + 1))
    return items


#: an assignment's ``ran`` when no run was cut off: one for every job
_NO_RUNS: Mapping[int, tuple[float, str]] = MappingProxyType({})
_NOT_MOVED: Mapping[int, str] = MappingProxyType({})
#: decoded items by their content (``_shared_items``); cleared past its bound
_ITEMS: dict[tuple[tuple[str, tuple[int, ...]], ...], Mapping[str, tuple[int, ...]]] = {}
_ITEMS_BOUND = 4096


def _shared_items(items: dict[str, tuple[int, ...]]) -> Mapping[str, tuple[int, ...]]:
    """One read-only map for every assignment that gives the same items to the same
    instances. Hazard: a process's jobs mostly have one or a few items on the same few
    instances, and each job's decoded assignment held a dict and tuples of its own (about
    200 bytes a job at 10,000 jobs). Not locked: a race makes one map more, never a wrong one."""
    key = tuple(items.items())
    shared = _ITEMS.get(key)
    if shared is None:
        if len(_ITEMS) >= _ITEMS_BOUND:
            _ITEMS.clear()
        shared = _ITEMS[key] = MappingProxyType(items)
    return shared


@dataclass(frozen=True, slots=True)
class Assignment:
    epoch: int
    state: AssignmentState
    total: int
    items: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    strategy: str = ""
    leader: str = ""
    #: version of the leader node under which the leader wrote this (its term)
    leader_version: int = 0
    #: item -> (fire time, instance): the runs still going under the previous epoch when
    #: this one's resharding fenced it. Hazard: a fire that waited for this assignment may
    #: be one the item's previous owner already ran; the new owner skips it (fire <= the
    #: fire recorded here, on another instance) instead of running it a second time.
    ran: Mapping[int, tuple[float, str]] = field(default_factory=dict)
    #: when the leader's fence of the previous epoch had been applied (its clock, read
    #: after the fence's transaction returned; None for a job's first assignment): a run
    #: under the previous epoch was marked before it, so its fire is no later
    fenced_at: float | None = None
    #: item -> the instance that held it in the previous epoch, for the items this one
    #: gives to another: while that instance is still registered, or with failover (the
    #: leader queued a departed holder's fires up to the fence)
    moved: Mapping[int, str] = field(default_factory=dict)

    def items_of(self, instance_id: str) -> tuple[int, ...]:
        return self.items.get(instance_id, ())

    @property
    def instances(self) -> list[str]:
        return sorted(self.items, reverse=True)

    def with_state(self, state: AssignmentState, leader: str, leader_version: int) -> Assignment:
        return Assignment(self.epoch, state, self.total, self.items, self.strategy, leader, leader_version)

    def ran_elsewhere(self, item: int, fire_time: float, instance_id: str) -> bool:
        """Fire ``fire_time`` of ``item`` is another instance's under the previous epoch:
        a run of it the resharding waited for, or a fire no later than the fence of an
        item moved here (``moved``). An instance still registered ran the fire (its mark
        came before the fence) or was fenced out of it, and then queues it for failover
        itself (``moved_away``); one that left ran it, or the leader queued it with the
        new epoch: either way not this instance's to run but as a failover entry."""
        ran = self.ran.get(item)
        if ran is not None and ran[1] != instance_id and fire_time <= ran[0]:
            return True
        fenced_at = self.fenced_at
        if fenced_at is None or fire_time > fenced_at:
            return False
        holder = self.moved.get(item)
        return holder is not None and holder != instance_id

    def moved_away(self, fire_time: float, instance_id: str) -> list[int]:
        """The items ``instance_id`` held in the previous epoch and this one gives away,
        if ``fire_time`` is no later than the fence: a fire it plans only now, under
        this epoch, it was fenced out of, and their new owners skip it (``ran_elsewhere``)."""
        if self.fenced_at is None or fire_time > self.fenced_at:
            return []
        return [item for item, holder in self.moved.items() if holder == instance_id]

    def as_lists(self) -> dict[str, list[int]]:
        return {instance: list(items) for instance, items in self.items.items()}

    def encode(self) -> bytes:
        _check_cover(self.items, self.total, "assignment")
        doc: dict[str, object] = {}
        if self.ran:  # absent when empty: the node reads as it always did
            doc["ran"] = {str(item): [fire, who] for item, (fire, who) in sorted(self.ran.items())}
        if self.fenced_at is not None:
            doc["fenced_at"] = self.fenced_at
        if self.moved:  # by the instance that held them, as ``items``
            held: dict[str, list[int]] = {}
            for item, holder in sorted(self.moved.items()):
                held.setdefault(holder, []).append(item)
            doc["moved"] = {holder: encode_items(items) for holder, items in sorted(held.items())}
        return json.dumps(
            {
                **doc,
                "epoch": self.epoch,
                "state": self.state.value,
                "total": self.total,
                "strategy": self.strategy,
                "leader": self.leader,
                "leader_version": self.leader_version,
                "items": {instance: encode_items(items) for instance, items in sorted(self.items.items())},
            },
            sort_keys=True,
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, path: str, raw: bytes) -> Assignment:
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CorruptNodeError(path, f"not JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise CorruptNodeError(path, "not a JSON object")
        try:
            epoch = doc["epoch"]
            total = doc["total"]
            if not isinstance(epoch, int) or epoch < 0 or not isinstance(total, int) or total < 0:
                raise ValueError("epoch and total must be ints >= 0")
            state = AssignmentState(doc["state"])
            raw_items = doc["items"]
            if not isinstance(raw_items, dict):
                raise ValueError("items must be an object")
            # interned: the same few instance ids (and strategy) recur in every job's
            # assignment, a string of their own each from the JSON decoder
            items = {sys.intern(str(k)): tuple(decode_items(v)) for k, v in raw_items.items()}
            _check_cover(items, total, "assignment")
            raw_ran = doc.get("ran", {})
            if not isinstance(raw_ran, dict):
                raise ValueError("ran must be an object")
            ran = {int(k): (float(v[0]), str(v[1])) for k, v in raw_ran.items()} if raw_ran else _NO_RUNS
            raw_fenced = doc.get("fenced_at")
            if raw_fenced is not None and (isinstance(raw_fenced, bool) or not isinstance(raw_fenced, int | float)):
                raise ValueError("fenced_at must be a number")
            raw_moved = doc.get("moved", {})
            if not isinstance(raw_moved, dict):
                raise ValueError("moved must be an object")
            moved = (
                {item: sys.intern(str(holder)) for holder, held in raw_moved.items() for item in decode_items(held)}
                if raw_moved
                else _NOT_MOVED
            )
            return cls(
                epoch=epoch,
                state=state,
                total=total,
                items=_shared_items(items),
                strategy=sys.intern(str(doc.get("strategy", ""))),
                leader=sys.intern(str(doc.get("leader", ""))),
                leader_version=int(doc.get("leader_version", 0)),
                ran=ran,
                fenced_at=None if raw_fenced is None else float(raw_fenced),
                moved=moved,
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise CorruptNodeError(
                path, str(exc) if not isinstance(exc, KeyError) else f"missing {exc}"
            ) from None


def _check_cover(items: Mapping[str, Sequence[int]], total: int, what: str) -> None:
    """Each item 0..total-1 exactly once (an assignment with no instances covers nothing)."""
    if not items:
        return
    seen: set[int] = set()
    for instance, owned in items.items():
        for item in owned:
            if not 0 <= item < total:
                raise ValueError(f"{what} gives {instance!r} item {item} outside 0..{total - 1}")
            if item in seen:
                raise ValueError(f"{what} gives item {item} twice")
            seen.add(item)
    if len(seen) != total:
        raise ValueError(f"{what} leaves {total - len(seen)} item(s) unassigned")
