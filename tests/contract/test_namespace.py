"""Contract: a namespace is a chroot; clients in different namespaces never see each other,
and the namespace never shows in paths, events or errors."""

from __future__ import annotations

import pytest

from registry.backends.base import BaseRegistry
from registry.errors import LockTimeout, NodeExistsError, RegistryError, TransactionError
from registry.protocol import Check, Create, EventKind, Set
from tests.harness import Harness

from . import EventLog, namespace_of, wait_marker


def test_two_namespaces_are_isolated(harness: Harness) -> None:
    a = harness.connect()
    b = harness.connect()
    assert namespace_of(a) != namespace_of(b)
    a.put("/x", b"a")
    b.put("/x", b"b")
    a.create("/only-a/deep", b"")
    assert a.get("/x") == b"a"
    assert b.get("/x") == b"b"
    assert not b.exists("/only-a")
    b.create("/only-a", b"mine")  # no NodeExistsError from the other namespace
    assert a.children("/") == ["only-a", "x"]
    assert b.children("/") == ["only-a", "x"]
    a.delete("/x")
    assert b.get("/x") == b"b"
    assert b.get("/only-a") == b"mine"


def test_watches_see_only_their_namespace(harness: Harness) -> None:
    a = harness.connect()
    b = harness.connect()
    log = EventLog()
    a.watch("/", log)
    b.put("/x", b"b")
    b.put("/y/z", b"b")
    b.delete("/x")
    wait_marker(a, log, a, "/marker")
    assert {e.path for e in log.events} <= {"/", "/marker"}, log.events


def test_nested_namespaces_share_a_subtree(harness: Harness) -> None:
    outer_ns = harness.fresh_namespace()
    outer = harness.connect(outer_ns)
    inner = harness.connect(outer_ns + "/sub")
    inner.put("/y", b"v")
    assert outer.get("/sub/y") == b"v"
    assert outer.children("/sub") == ["y"]
    assert inner.children("/") == ["y"]
    outer_log, inner_log = EventLog(), EventLog()
    outer.watch("/sub", outer_log)
    inner.watch("/", inner_log)
    inner.put("/from-inner", b"i")
    outer.put("/sub/from-outer", b"o")
    outer_log.wait(EventKind.CREATED, "/sub/from-inner", b"i")
    inner_log.wait(EventKind.CREATED, "/from-outer", b"o")
    assert inner.create_sequential("/q-").startswith("/q-")


def test_paths_in_events_and_errors_never_show_the_namespace(harness: Harness, reg: BaseRegistry) -> None:
    namespace = namespace_of(reg)
    token = namespace.strip("/")
    log = EventLog()
    reg.watch("/w", log, initial=True)
    reg.put("/w/a", b"1")
    # seen before it goes: a node that lives only between two looks of a ZooKeeper watch
    # is never reported (coalesced away), and then neither is its deletion
    log.wait(EventKind.CREATED, "/w/a")
    reg.put("/w/a", b"2")
    reg.delete("/w/a")
    log.wait(EventKind.DELETED, "/w/a")
    for event in log.events:
        assert token not in event.path, event

    failures: list[RegistryError] = []
    reg.create("/dup")
    with pytest.raises(NodeExistsError) as exists:
        reg.create("/dup")
    assert exists.value.path == "/dup"
    failures.append(exists.value)
    reg.put("/v", b"1")
    stale = reg.get_node("/v")
    assert stale is not None
    reg.put("/v", b"2")
    for ops in ([Check("/absent")], [Set("/v", b"3", version=stale.version)], [Create("/dup")]):
        with pytest.raises(TransactionError) as txn:
            reg.transaction(ops)
        assert txn.value.cause is not None
        assert txn.value.cause.path == ops[0].path  # type: ignore[attr-defined]
        assert txn.value.op == ops[0]
        failures.append(txn.value)
        failures.append(txn.value.cause)
    holder = harness.connect(namespace)
    with holder.lock("/locks/l"), pytest.raises(LockTimeout) as timed_out, reg.lock("/locks/l", timeout=0.2):
        pass
    failures.append(timed_out.value)
    for error in failures:
        assert token not in str(error), f"{type(error).__name__}: {error}"
        assert token not in repr(error), repr(error)

    assert reg.create_sequential("/seq-").startswith("/seq-")
    assert token not in repr(reg.watch("/w", log))
