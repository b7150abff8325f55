"""The protocol's value types: immutable, equal by value, and small.

A job holds its fence's two ``Check`` ops from one fire to the next, and every fire makes
and drops a handful of ops and nodes: at 10,000 jobs an attribute dict per object is
about 2 MiB held and a slower attribute read on every op of every fire (BENCHMARKS.md).
"""

from __future__ import annotations

import dataclasses

import pytest

from registry.protocol import Check, Create, Delete, Event, EventKind, Node, Set

_VALUES = [
    Check("/jobs/a/sharding", 3),
    Create("/jobs/a/running/i", b"x", ephemeral=True),
    Set("/jobs/a/config", b"{}", 2),
    Delete("/jobs/a/running/i"),
    Node(b"x", 4, ephemeral=True),
    Event(EventKind.CREATED, "/jobs/a", b"x", 1),
]


@pytest.mark.parametrize("value", _VALUES, ids=lambda value: type(value).__name__)
def test_a_protocol_value_is_frozen_equal_by_value_and_keeps_no_attribute_dict(value: object) -> None:
    assert not hasattr(value, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, dataclasses.fields(value)[0].name, None)  # type: ignore[arg-type]
    twin = dataclasses.replace(value)  # type: ignore[type-var]
    assert twin == value and twin is not value
    assert hash(twin) == hash(value)
