"""A registry call leaves no reference cycle behind for the garbage collector.

Hazard: an exception kept past its ``except`` clause (an outcome, the last failure of a
loop) holds its traceback, which holds the frame that caught it, whose locals hold the
exception: a cycle, and everything those frames hold goes with it, to be found by the
next collection. On ZooKeeper a transaction planned again for its missing parents left its
whole request behind that way, and every refused request its kazoo result: a start of N
jobs does both for every job."""

from __future__ import annotations

import gc
import types
from collections.abc import Iterator

import pytest

from registry.backends.base import BaseRegistry
from registry.protocol import Check, Create, Delete

#: what a leak of our own shows up as in ``gc.garbage``: our objects, or our frames
_OURS = ("registry.", "sharding.", "scheduler.")


def _ours(leftover: object) -> bool:
    if isinstance(leftover, types.FrameType):
        return "/registry/" in leftover.f_code.co_filename
    return type(leftover).__module__.startswith(_OURS)


@pytest.fixture
def saved_garbage() -> Iterator[list[object]]:
    """``gc.garbage`` filled with what the collector finds unreachable, from a clean start."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield gc.garbage
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def test_a_transaction_planned_again_for_its_parents_leaves_no_cycle(
    reg: BaseRegistry, saved_garbage: list[object]
) -> None:
    reg.put("/cyc/kept", b"")
    kept = reg.get_node("/cyc/kept")
    assert kept is not None
    # the new parents are missing: ZooKeeper's first plan assumes them and is refused
    reg.transaction([Check("/cyc/kept", kept.version), *(Create(f"/cyc/{i}/a/b", b"1") for i in range(20))])
    reg.transaction([Delete(f"/cyc/{i}") for i in range(20)])  # subtrees: planned again too
    assert reg.children("/cyc") == ["kept"]
    gc.collect()
    leftovers = [leftover for leftover in saved_garbage if _ours(leftover)]
    assert not leftovers, f"{len(leftovers)} objects of ours left in cycles, e.g. {leftovers[:5]}"
