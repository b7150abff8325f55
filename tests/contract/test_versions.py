"""Contract: versions are ints that grow with every write of the node (so a reader can tell
"at or past my write" by comparing), and are what ``Set``/``Delete``/``Check`` compare
against."""

from __future__ import annotations

import itertools

import pytest

from registry.backends.base import BaseRegistry
from registry.errors import BadVersionError, NoNodeError, TransactionError
from registry.protocol import Check, Delete, Event, Node, Set
from tests.harness import Harness

from . import peer, wait_for


def _node(reg: BaseRegistry, path: str) -> Node:
    node = reg.get_node(path)
    assert node is not None, path
    return node


def test_version_grows_on_every_write(reg: BaseRegistry) -> None:
    reg.create("/v", b"a")
    seen = [_node(reg, "/v").version]
    for value in (b"b", b"b", b"", b"c"):  # rewriting the same value is a write too
        reg.put("/v", value)
        seen.append(_node(reg, "/v").version)
    reg.transaction([Set("/v", b"d")])
    seen.append(_node(reg, "/v").version)
    assert all(isinstance(v, int) for v in seen)
    assert all(a < b for a, b in itertools.pairwise(seen)), seen


def test_a_watch_event_carries_the_version_a_read_returns(reg: BaseRegistry) -> None:
    """Caches hold what events carry; comparing them with versions read directly (the
    sharding leader waits for its cache to pass its own write) needs the same numbering."""
    events: list[Event] = []
    reg.watch("/v", events.append)
    reg.put("/v", b"a")
    reg.put("/v", b"b")  # ZooKeeper may report only the latest state: wait for that one
    wait_for(lambda: any(e.value == b"b" for e in events), 10, message="the event of the second write")
    assert events[-1].value == b"b"
    assert events[-1].version == _node(reg, "/v").version


def test_version_is_stable_without_writes(reg: BaseRegistry) -> None:
    reg.put("/v", b"a")
    first = _node(reg, "/v").version
    reg.put("/other", b"x")  # a write elsewhere does not change this node's version
    reg.put("/v/child", b"x")  # nor does a write below it
    assert _node(reg, "/v").version == first


def test_versions_agree_between_clients(harness: Harness, reg: BaseRegistry) -> None:
    other = peer(harness, reg)
    reg.put("/v", b"a")
    assert _node(other, "/v").version == _node(reg, "/v").version
    other.put("/v", b"b")
    assert _node(reg, "/v") == _node(other, "/v")


def test_set_with_current_version_succeeds(reg: BaseRegistry) -> None:
    reg.put("/v", b"a")
    version = _node(reg, "/v").version
    reg.transaction([Set("/v", b"b", version=version)])
    node = _node(reg, "/v")
    assert node.value == b"b"
    assert node.version != version


def test_set_with_stale_version_fails(reg: BaseRegistry) -> None:
    reg.put("/v", b"a")
    stale = _node(reg, "/v").version
    reg.put("/v", b"b")
    with pytest.raises(TransactionError) as info:
        reg.transaction([Set("/v", b"c", version=stale)])
    assert isinstance(info.value.cause, BadVersionError)
    assert info.value.cause.path == "/v"
    assert info.value.index == 0
    assert reg.get("/v") == b"b"


def test_delete_with_stale_version_fails(reg: BaseRegistry) -> None:
    reg.put("/v", b"a")
    stale = _node(reg, "/v").version
    reg.put("/v", b"b")
    reg.put("/v/child", b"c")
    with pytest.raises(TransactionError) as info:
        reg.transaction([Delete("/v", version=stale)])
    assert isinstance(info.value.cause, BadVersionError)
    assert reg.get("/v") == b"b"
    assert reg.get("/v/child") == b"c"
    reg.transaction([Delete("/v", version=_node(reg, "/v").version)])
    assert not reg.exists("/v")
    assert not reg.exists("/v/child")


def test_check_with_stale_version_fails(reg: BaseRegistry) -> None:
    reg.put("/v", b"a")
    version = _node(reg, "/v").version
    reg.transaction([Check("/v", version=version)])
    reg.transaction([Check("/v")])
    reg.put("/v", b"b")
    with pytest.raises(TransactionError) as info:
        reg.transaction([Check("/v", version=version), Set("/w", b"x")])
    assert isinstance(info.value.cause, BadVersionError)
    assert info.value.index == 0


def test_check_absent_node_fails_with_no_node(reg: BaseRegistry) -> None:
    with pytest.raises(TransactionError) as info:
        reg.transaction([Check("/nothing")])
    assert isinstance(info.value.cause, NoNodeError)
    assert info.value.cause.path == "/nothing"


def test_set_absent_node_fails_with_no_node(reg: BaseRegistry) -> None:
    with pytest.raises(TransactionError) as info:
        reg.transaction([Set("/nothing", b"v")])
    assert isinstance(info.value.cause, NoNodeError)
    assert not reg.exists("/nothing")


def test_version_of_a_recreated_node_does_not_match_the_old_one(reg: BaseRegistry) -> None:
    reg.put("/v", b"a")
    reg.put("/v", b"b")  # move it past its first version, so a fresh node cannot reuse it
    middle = _node(reg, "/v").version
    reg.delete("/v")
    reg.create("/v", b"c")
    with pytest.raises(TransactionError):
        reg.transaction([Set("/v", b"d", version=middle)])
    assert reg.get("/v") == b"c"
