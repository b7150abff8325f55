"""Contract: ``read_tree`` returns a node and everything below it, values and versions as
``get_node`` gives them, ``{}`` when absent, the implicit root left out."""

from __future__ import annotations

from registry.backends.base import BaseRegistry
from registry.protocol import Set


def test_a_subtree_with_values_versions_and_lifetimes(reg: BaseRegistry) -> None:
    reg.put("/job/config", b"{}")
    reg.put("/job/servers/10.0.0.1", b"ENABLED")
    reg.put("/job/instances/a", b"A", ephemeral=True)
    reg.put("/job/sharding/assignment", b"v1")
    first = reg.get_node("/job/sharding/assignment")
    assert first is not None
    reg.transaction([Set("/job/sharding/assignment", b"v2", version=first.version)])
    tree = reg.read_tree("/job")
    assert set(tree) == {
        "/job",
        "/job/config",
        "/job/servers",
        "/job/servers/10.0.0.1",
        "/job/instances",
        "/job/instances/a",
        "/job/sharding",
        "/job/sharding/assignment",
    }
    for path, node in tree.items():
        assert reg.get_node(path) == node, path
    assert tree["/job/sharding/assignment"].value == b"v2"
    assert tree["/job/sharding/assignment"].version > first.version
    assert tree["/job/instances/a"].ephemeral
    assert not tree["/job/config"].ephemeral


def test_prefix_siblings_are_not_below(reg: BaseRegistry) -> None:
    reg.put("/job/a", b"")
    reg.put("/jobx/b", b"")
    reg.put("/job-y", b"")
    assert set(reg.read_tree("/job")) == {"/job", "/job/a"}


def test_a_leaf_is_its_own_tree(reg: BaseRegistry) -> None:
    reg.put("/leaf", b"v")
    assert reg.read_tree("/leaf") == {"/leaf": reg.get_node("/leaf")}


def test_absent_is_empty(reg: BaseRegistry) -> None:
    assert reg.read_tree("/absent") == {}
    assert reg.read_tree("/absent/deeper") == {}


def test_the_root_lists_everything_but_itself(reg: BaseRegistry) -> None:
    reg.put("/x/y", b"1")
    reg.put("/z", b"2")
    tree = reg.read_tree("/")
    assert "/" not in tree
    assert {"/x", "/x/y", "/z"} <= set(tree)
    assert tree["/x/y"].value == b"1"


def test_deleted_nodes_are_gone(reg: BaseRegistry) -> None:
    reg.put("/t/a/b", b"")
    reg.put("/t/c", b"")
    reg.delete("/t/a")
    assert set(reg.read_tree("/t")) == {"/t", "/t/c"}


def test_a_wide_tree(reg: BaseRegistry) -> None:
    names = [f"n{i:03d}" for i in range(150)]
    for name in names:
        reg.put(f"/wide/{name}", name.encode())
    tree = reg.read_tree("/wide")
    assert {p.rsplit("/", 1)[1]: n.value.decode() for p, n in tree.items() if p != "/wide"} == {
        n: n for n in names
    }
