"""A running mark's text: written by hand on every fire, it must say exactly what the JSON
encoder would, and read back to the same trace."""

from __future__ import annotations

import json

import pytest

from sharding.failover import RunTrace, encode_trace, trace_json


@pytest.mark.parametrize(
    "trace",
    [
        RunTrace("running", (0,), 1795457667.1030145),
        RunTrace("running", (3, 1, 2, 9), 12.0, failover=True),
        RunTrace("running", (), 1e-7),
        RunTrace("left", (5,), None),
        RunTrace("left", (0, 1), 1e22),
    ],
    ids=["one item", "items out of order", "no items", "left without a time", "large time"],
)
def test_the_mark_is_the_json_of_its_fields_and_reads_back(trace: RunTrace) -> None:
    raw = trace.encode()
    assert raw == trace_json(trace.state, trace.items, trace.fire_time, trace.failover)
    # as a fire's mark writes it: the items as the assignment lists them
    assert encode_trace(trace.state, list(trace.items), trace.fire_time, trace.failover) == raw
    doc = json.loads(raw)
    assert doc["state"] == trace.state
    assert doc["fire_time"] == trace.fire_time
    assert doc["failover"] is trace.failover
    assert RunTrace.decode("/job/running/x", raw) == RunTrace(
        trace.state, tuple(sorted(trace.items)), trace.fire_time, trace.failover
    )


@pytest.mark.parametrize("odd", [RunTrace('say "hi"', (1,), 1.0), RunTrace("running", (1,), float("inf"))])
def test_fields_outside_the_plain_shape_take_the_json_encoder(odd: RunTrace) -> None:
    assert odd.encode() == trace_json(odd.state, odd.items, odd.fire_time, odd.failover)
    json.loads(odd.encode().decode().replace("Infinity", "1"))  # well-formed apart from inf
