"""Which pairs a fire that waited through a resharding hands to failover: the items its
instance lost to an instance registered at or after the fire, and no others."""

from __future__ import annotations

from sharding.assignment import Assignment, AssignmentState
from sharding.failover import FailoverEntry, unfired_hand_over

FIRE = 1_000.0


def assignment(epoch: int, items: dict[str, tuple[int, ...]]) -> Assignment:
    return Assignment(epoch, AssignmentState.READY, sum(len(i) for i in items.values()), items)


BEFORE = assignment(1, {"x": (0, 1, 2, 3)})
AFTER = assignment(2, {"x": (2,), "old": (3,), "new": (0, 1)})


def test_items_moved_to_an_instance_registered_after_the_fire_are_handed_over() -> None:
    started = {"old": FIRE - 60.0, "new": FIRE + 0.2}.get
    assert unfired_hand_over(BEFORE, AFTER, "x", FIRE, started) == [
        FailoverEntry(FIRE, 0, "x"),
        FailoverEntry(FIRE, 1, "x"),
    ]


def test_items_moved_to_an_instance_that_fires_this_fire_itself_are_not() -> None:
    # registered before the fire: it fires it, and runs the items the new epoch gives it
    started = {"old": FIRE - 60.0, "new": FIRE - 0.01}.get
    assert unfired_hand_over(BEFORE, AFTER, "x", FIRE, started) == []


def test_a_registration_time_rounded_to_the_millisecond_counts_as_after_the_fire() -> None:
    started = {"old": FIRE - 60.0, "new": FIRE - 0.0004}.get
    assert [e.item for e in unfired_hand_over(BEFORE, AFTER, "x", FIRE, started)] == [0, 1]


def test_nothing_is_handed_over_for_an_unknown_owner_or_an_item_kept() -> None:
    assert unfired_hand_over(BEFORE, AFTER, "x", FIRE, lambda _: None) == []
    assert unfired_hand_over(BEFORE, BEFORE, "x", FIRE, lambda _: FIRE + 1) == []
