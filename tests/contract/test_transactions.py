"""Contract: transactions apply every op or none, and a failure names the op that failed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from registry.backends.base import MAX_TXN_BYTES, MAX_TXN_OPS, BaseRegistry
from registry.errors import BadVersionError, NodeExistsError, NoNodeError, TransactionError
from registry.protocol import Check, Create, Delete, Node, Op, Set
from tests.harness import Harness

from . import peer


def _node(reg: BaseRegistry, path: str) -> Node:
    node = reg.get_node(path)
    assert node is not None, path
    return node


def test_every_op_kind_applies(reg: BaseRegistry) -> None:
    reg.put("/set", b"old")
    reg.put("/del/sub", b"x")
    reg.put("/chk", b"c")
    version = _node(reg, "/chk").version
    reg.transaction(
        [
            Create("/new", b"n"),
            Set("/set", b"new"),
            Delete("/del"),
            Check("/chk", version=version),
        ]
    )
    assert reg.get("/new") == b"n"
    assert reg.get("/set") == b"new"
    assert not reg.exists("/del")
    assert reg.get("/chk") == b"c"


def test_empty_transaction_is_a_no_op(reg: BaseRegistry) -> None:
    reg.transaction([])
    assert reg.children("/") == []


def test_all_or_nothing(reg: BaseRegistry) -> None:
    reg.put("/exists", b"e")
    reg.put("/set", b"old")
    ops: list[Op] = [
        Create("/a/b", b"1"),
        Set("/set", b"new"),
        Delete("/exists/none"),  # absent: may be refused or ignored, but nothing must stick
        Create("/exists", b"again"),
    ]
    with pytest.raises(TransactionError):
        reg.transaction(ops)
    assert not reg.exists("/a/b")
    assert not reg.exists("/a"), "a parent made for a failed transaction was left behind"
    assert reg.get("/set") == b"old"
    assert reg.get("/exists") == b"e"


_FAILURES: dict[str, tuple[Callable[[int], list[Op]], int, type[Exception]]] = {
    "create-exists": (lambda stale: [Create("/ok"), Create("/present")], 1, NodeExistsError),
    "check-absent": (lambda stale: [Check("/present"), Check("/absent"), Create("/ok")], 1, NoNodeError),
    "set-absent": (
        lambda stale: [Create("/ok"), Set("/present", b"x"), Set("/absent", b"v")],
        2,
        NoNodeError,
    ),
    "set-stale": (lambda stale: [Create("/ok"), Set("/present", b"x", version=stale)], 1, BadVersionError),
    "delete-stale": (lambda stale: [Delete("/present", version=stale), Create("/ok")], 0, BadVersionError),
    "check-stale": (lambda stale: [Create("/ok"), Check("/present", version=stale)], 1, BadVersionError),
    # version 0: what etcd's compares read for an absent key's revision
    "check-absent-at-0": (lambda stale: [Create("/ok"), Check("/absent", version=0)], 1, NoNodeError),
    "set-absent-at-0": (lambda stale: [Create("/ok"), Set("/absent", b"v", version=0)], 1, NoNodeError),
    "delete-absent-at-0": (lambda stale: [Delete("/absent", version=0), Create("/ok")], 0, NoNodeError),
    "check-present-at-0": (lambda stale: [Create("/ok"), Check("/present", version=0)], 1, BadVersionError),
}


@pytest.mark.parametrize("case", sorted(_FAILURES))
def test_failing_op_is_named(reg: BaseRegistry, case: str) -> None:
    make_ops, index, cause = _FAILURES[case]
    reg.put("/present", b"old")
    stale = _node(reg, "/present").version
    reg.put("/present", b"p")
    ops = make_ops(stale)
    with pytest.raises(TransactionError) as info:
        reg.transaction(ops)
    error = info.value
    assert error.index == index
    assert error.op == ops[index]
    assert isinstance(error.cause, cause)
    assert getattr(error.cause, "path", None) == ops[index].path
    assert str(index) in str(error)
    assert ops[index].path in str(error)
    assert not reg.exists("/ok")
    assert reg.get("/present") == b"p"


def test_a_check_of_an_absent_parent_at_version_0_stops_a_create_below_it(reg: BaseRegistry) -> None:
    ops: list[Op] = [Check("/a", version=0), Create("/a/b", b"v")]
    with pytest.raises(TransactionError) as info:
        reg.transaction(ops)
    assert info.value.index == 0
    assert isinstance(info.value.cause, NoNodeError)
    assert not reg.exists("/a/b")
    assert not reg.exists("/a")


def test_creates_make_missing_parents(reg: BaseRegistry) -> None:
    reg.transaction([Create("/x/y/z", b"leaf"), Create("/m", b"1"), Create("/m/n", b"2")])
    assert reg.get("/x/y/z") == b"leaf"
    assert reg.get("/x/y") == b""
    assert reg.get("/x") == b""
    assert not _node(reg, "/x/y").ephemeral
    assert reg.get("/m") == b"1"
    assert reg.get("/m/n") == b"2"


def test_two_creates_share_a_new_parent(reg: BaseRegistry) -> None:
    reg.transaction([Create("/shared/a", b"a"), Create("/shared/b", b"b")])
    assert reg.children("/shared") == ["a", "b"]


def test_ephemeral_create_in_transaction(harness: Harness, reg: BaseRegistry) -> None:
    owner = peer(harness, reg)
    owner.transaction([Create("/dir/e", b"v", ephemeral=True), Create("/dir/p", b"v")])
    assert _node(reg, "/dir/e").ephemeral is True
    assert _node(reg, "/dir/p").ephemeral is False
    owner.close()
    assert not reg.exists("/dir/e")
    assert reg.exists("/dir/p")


def test_set_keeps_node_lifetime(harness: Harness, reg: BaseRegistry) -> None:
    owner = peer(harness, reg)
    owner.create("/e", b"1", ephemeral=True)
    reg.transaction([Set("/e", b"2")])
    assert _node(reg, "/e").ephemeral is True
    owner.close()
    assert not reg.exists("/e")


def test_delete_removes_the_subtree(reg: BaseRegistry) -> None:
    for path in ("/d/a/b/c", "/d/a/x", "/d/y", "/dz"):
        reg.put(path, b"v")
    version = _node(reg, "/d").version
    reg.transaction([Delete("/d", version=version), Set("/dz", b"w")])
    for path in ("/d", "/d/a", "/d/a/b", "/d/a/b/c", "/d/a/x", "/d/y"):
        assert not reg.exists(path), path
    assert reg.get("/dz") == b"w"


def test_failed_delete_keeps_the_subtree(reg: BaseRegistry) -> None:
    for path in ("/d/a/b", "/d/c"):
        reg.put(path, b"v")
    with pytest.raises(TransactionError):
        reg.transaction([Delete("/d"), Check("/absent")])
    assert reg.exists("/d/a/b")
    assert reg.exists("/d/c")


def test_check_and_set_same_path(reg: BaseRegistry) -> None:
    reg.put("/cas", b"1")
    version = _node(reg, "/cas").version
    reg.transaction([Check("/cas", version=version), Set("/cas", b"2", version=version)])
    assert reg.get("/cas") == b"2"


def test_ops_after_a_delete_of_another_node(reg: BaseRegistry) -> None:
    reg.put("/old/child", b"v")
    reg.transaction([Delete("/old"), Create("/new/child", b"n")])
    assert not reg.exists("/old")
    assert reg.get("/new/child") == b"n"


def test_limit_of_ops_is_accepted(reg: BaseRegistry) -> None:
    reg.create("/many")
    ops: list[Op] = [Create(f"/many/n{i:03d}", b"v") for i in range(MAX_TXN_OPS)]
    reg.transaction(ops)
    assert len(reg.children("/many")) == MAX_TXN_OPS


def test_too_many_ops_fail_and_apply_nothing(reg: BaseRegistry) -> None:
    reg.create("/many")
    ops: list[Op] = [Create(f"/many/n{i:03d}", b"v") for i in range(MAX_TXN_OPS + 1)]
    with pytest.raises(TransactionError, match=str(MAX_TXN_OPS)) as info:
        reg.transaction(ops)
    assert info.value.index is None
    assert reg.children("/many") == []


def test_max_txn_ops_raises_the_limit_alike_on_every_backend(harness: Harness) -> None:
    roomy = harness.connect(max_txn_ops=256)
    assert roomy.max_txn_ops == 256
    roomy.create("/many")
    roomy.transaction([Create(f"/many/n{i:03d}", b"v") for i in range(256)])
    assert len(roomy.children("/many")) == 256
    with pytest.raises(TransactionError, match="256") as info:
        roomy.transaction([Create(f"/more/n{i:03d}", b"v") for i in range(257)])
    assert info.value.index is None
    assert not roomy.exists("/more")


def test_too_many_bytes_fail_and_apply_nothing(reg: BaseRegistry) -> None:
    chunk = MAX_TXN_BYTES // 2 + 1
    ops: list[Op] = [Create("/b1", b"x" * chunk), Create("/b2", b"y" * chunk)]
    with pytest.raises(TransactionError, match=str(MAX_TXN_BYTES)) as info:
        reg.transaction(ops)
    assert info.value.index is None
    assert not reg.exists("/b1")
    assert not reg.exists("/b2")


def test_bytes_up_to_the_limit_are_accepted(reg: BaseRegistry) -> None:
    half = MAX_TXN_BYTES // 2
    reg.transaction([Create("/b1", b"x" * half), Create("/b2", b"y" * (MAX_TXN_BYTES - half))])
    assert len(reg.get("/b1") or b"") + len(reg.get("/b2") or b"") == MAX_TXN_BYTES


@pytest.mark.parametrize(
    "ops",
    [
        [Create("/same", b"1"), Set("/same", b"2")],
        [Set("/same", b"1"), Set("/same", b"2")],
        [Create("/same"), Delete("/same")],
        [Delete("/same"), Create("/same")],
    ],
    ids=["create-set", "set-set", "create-delete", "delete-create"],
)
def test_writing_a_path_twice_is_a_value_error(reg: BaseRegistry, ops: list[Op]) -> None:
    reg.put("/other", b"o")
    with pytest.raises(ValueError, match="/same"):
        reg.transaction([Set("/other", b"changed"), *ops])
    assert reg.get("/other") == b"o"
    assert not reg.exists("/same")


@pytest.mark.parametrize(
    "ops",
    [
        [Create("/t/a/b", b"1"), Delete("/t")],
        [Delete("/t"), Create("/t/a/b", b"1")],
        [Delete("/t"), Set("/t/a", b"2")],
        # more lengths of deleted paths than the write has ancestors: its ancestors are walked
        [Delete("/uuu"), Delete("/vv"), Delete("/t"), Set("/t/a", b"2")],
    ],
    ids=["create-then-delete-above", "delete-then-create-below", "delete-then-set-below", "many-deletes"],
)
def test_writing_inside_a_subtree_the_transaction_deletes_is_a_value_error(
    reg: BaseRegistry, ops: list[Op]
) -> None:
    """etcd cannot put inside a range its transaction deletes, so no backend takes it, in
    either order; a path that merely shares the deleted one's prefix is not inside."""
    reg.put("/t/a", b"kept")
    with pytest.raises(ValueError, match="inside the subtree"):
        reg.transaction(ops)
    assert reg.get("/t/a") == b"kept"
    assert not reg.exists("/t/a/b")
    reg.transaction([Delete("/t"), Create("/tx/a", b"1")])
    assert not reg.exists("/t") and reg.get("/tx/a") == b"1"


@pytest.mark.parametrize(
    "ops",
    [
        [Create("/"), Create("/ok")],
        [Set("/", b"v")],
        [Create("/bad//path")],
        [Check("relative")],
        [Create("/v", "text")],  # type: ignore[arg-type]
        ["not an op"],
    ],
    ids=["create-root", "set-root", "empty-segment", "relative", "str-value", "not-an-op"],
)
def test_invalid_ops_are_value_errors(reg: BaseRegistry, ops: list[Any]) -> None:
    with pytest.raises(ValueError):
        reg.transaction(ops)
    assert reg.children("/") == []
