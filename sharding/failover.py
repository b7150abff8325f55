"""Failover: what a departed instance left undone, queued for the items' new owners.

An instance marks each run in ``running/{id}`` (persistent when failover is on, so a crash
leaves it behind) and, when it stops cleanly, leaves ``{"state": "left", "last_fire": F}``
there. When the leader reshards without an instance that is gone, it turns that trace into
queue entries ``(item, fire_time)``:

- a run in progress at death: its items at its fire time;
- every fire the instance's items missed afterwards, up to the resharding's fence: its
  assigned items at each fire time of the schedule since its last known fire (the run's
  fire, its ``last_fire`` when it left cleanly, or — when it died between runs and left no
  trace — the session timeout before the death was seen, the earliest it can have
  stopped). A later fire is the items' new owners' own: the fence held it back, and they
  plan it under the new epoch. The new epoch lists the departed holder's items in
  ``moved``, so an owner that plans a fire up to the fence only then (it waited for the
  epoch) skips it as queued (``Assignment.ran_elsewhere``).

Another source, not the leader's: a fire that raced a resharding moving an item between
two live instances, which neither ran, is queued by the instance that planned it
(``JobRunner._hand_over``).

The queue is ONE node, every change to it a versioned write: the leader's in the same
fenced transaction as the new assignment (together with the removal of the stale marks),
so nothing is lost or queued twice. Each
entry is run by the item's owner in the new assignment — never by an idle bystander — so
an item is still run by one instance at a time: the owner runs its failover entries and its
regular fires one after the other. Duplicates are possible (at least once); overlaps are not,
except by a process paused in the middle of an item, which no registry can stop (the epoch
in its context is the fencing token for that case).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from sharding.assignment import Assignment, CorruptNodeError, decode_items, encode_items

__all__ = ["FailoverEntry", "FailoverQueue", "RunTrace", "encode_trace", "plan_entries", "trace_json"]

#: one encoder for the mark written on every fire (``json.dumps`` with separators builds
#: a new encoder per call)
_COMPACT = json.JSONEncoder(separators=(",", ":"))
#: the states a trace records (RunTrace.state)
_STATES = frozenset({"running", "left"})

#: a bound on the queue so that it stays a small node (about 40 bytes per entry)
MAX_ENTRIES = 5_000

MissedFires = Callable[[float, float], list[float]]


@dataclass(frozen=True, order=True)
class FailoverEntry:
    fire_time: float
    item: int
    origin: str = ""


@dataclass(frozen=True)
class FailoverQueue:
    entries: tuple[FailoverEntry, ...] = ()

    def encode(self) -> bytes:
        return json.dumps(
            [[e.item, e.fire_time, e.origin] for e in sorted(self.entries)], separators=(",", ":")
        ).encode()

    @classmethod
    def decode(cls, path: str, raw: bytes | None) -> FailoverQueue:
        if not raw:
            return cls()
        try:
            doc = json.loads(raw.decode("utf-8"))
            entries = tuple(FailoverEntry(float(fire), int(item), str(origin)) for item, fire, origin in doc)
        except (UnicodeDecodeError, ValueError, TypeError) as exc:
            raise CorruptNodeError(path, f"not a failover queue ({exc})") from None
        return cls(entries)

    def merged(self, more: Iterable[FailoverEntry], total: int) -> FailoverQueue:
        """Union with ``more``, items beyond ``total`` dropped, bounded to the newest."""
        seen = {(e.item, e.fire_time): e for e in (*self.entries, *more) if 0 <= e.item < total}
        entries = sorted(seen.values())
        return FailoverQueue(tuple(entries[-MAX_ENTRIES:]))

    def without(self, done: Iterable[FailoverEntry]) -> FailoverQueue:
        taken = {(e.item, e.fire_time) for e in done}
        return FailoverQueue(tuple(e for e in self.entries if (e.item, e.fire_time) not in taken))

    def for_items(self, items: Iterable[int]) -> list[FailoverEntry]:
        mine = set(items)
        return sorted(e for e in self.entries if e.item in mine)


def encode_trace(state: str, items: Sequence[int], fire_time: float | None, failover: bool = False) -> bytes:
    """``RunTrace(state, items, fire_time, failover).encode()`` without the object: every
    fire's mark holds one, and a frozen dataclass costs a call per field to make."""
    # Written on every fire, so formatted by hand rather than through json's encoder.
    # Hazard: hand-made JSON is only right for plain fields. The trick holds because the
    # state is a known word, the items are digits, commas and dashes, and the time is
    # finite; anything else goes through json, giving the same text.
    if state not in _STATES or (fire_time is not None and not math.isfinite(fire_time)):
        return trace_json(state, items, fire_time, failover)
    return (
        f'{{"state":"{state}","items":"{encode_items(items)}",'
        f'"fire_time":{"null" if fire_time is None else repr(float(fire_time))},'
        f'"failover":{"true" if failover else "false"}}}'
    ).encode()


def trace_json(state: str, items: Sequence[int], fire_time: float | None, failover: bool) -> bytes:
    """A trace through json's encoder: what ``encode_trace`` writes by hand must equal."""
    return _COMPACT.encode(
        {"state": state, "items": encode_items(items), "fire_time": fire_time, "failover": failover}
    ).encode()


@dataclass(frozen=True, slots=True)
class RunTrace:
    """What ``running/{id}`` says about an instance."""

    state: str  # "running" | "left"
    items: tuple[int, ...]
    fire_time: float | None
    failover: bool = False

    def encode(self) -> bytes:
        return encode_trace(self.state, self.items, self.fire_time, self.failover)

    @classmethod
    def decode(cls, path: str, raw: bytes) -> RunTrace:
        try:
            doc = json.loads(raw.decode("utf-8"))
            fire = doc.get("fire_time")
            return cls(
                state=str(doc.get("state", "running")),
                items=tuple(decode_items(doc.get("items", ""))),
                fire_time=None if fire is None else float(fire),
                failover=bool(doc.get("failover", False)),
            )
        except (UnicodeDecodeError, ValueError, TypeError, AttributeError) as exc:
            raise CorruptNodeError(path, f"not a running mark ({exc})") from None


def plan_entries(
    previous: Assignment | None,
    departed: Mapping[str, RunTrace | None],
    *,
    now: float,
    session_timeout: float,
    missed_fires: MissedFires | None,
    disabled: set[int],
) -> list[FailoverEntry]:
    """Queue entries for ``departed`` instances (id -> its trace, None when it left none)."""
    entries: list[FailoverEntry] = []
    for instance, trace in departed.items():
        since = now - session_timeout - 1.0  # died between runs: the earliest it can have stopped
        if trace is not None:
            if trace.state == "running" and trace.fire_time is not None:
                entries.extend(FailoverEntry(trace.fire_time, item, instance) for item in trace.items)
                since = trace.fire_time
            elif trace.state == "left":
                since = trace.fire_time if trace.fire_time is not None else now
        if missed_fires is None or previous is None:
            continue
        owned = [item for item in previous.items_of(instance) if item not in disabled]
        if not owned:
            continue
        for fire in missed_fires(since, now):
            entries.extend(FailoverEntry(fire, item, instance) for item in owned)
    return entries

