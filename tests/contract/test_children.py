"""Contract: ``children`` lists direct child names in ascending order, ``[]`` when absent."""

from __future__ import annotations

from registry.backends.base import BaseRegistry


def test_direct_children_ascending(reg: BaseRegistry) -> None:
    for name in ("b", "a", "c", "B", "10", "9"):
        reg.put(f"/p/{name}", b"")
    reg.put("/p/a/grandchild", b"")
    reg.put("/p/c/x/y", b"")
    assert reg.children("/p") == sorted(["b", "a", "c", "B", "10", "9"])
    assert reg.children("/p/a") == ["grandchild"]
    assert reg.children("/p/c") == ["x"]


def test_children_do_not_include_prefix_siblings(reg: BaseRegistry) -> None:
    reg.put("/p/a", b"")
    reg.put("/px/b", b"")
    reg.put("/p-y", b"")
    assert reg.children("/p") == ["a"]
    assert reg.children("/") == ["p", "p-y", "px"]


def test_children_of_absent_node_is_empty(reg: BaseRegistry) -> None:
    assert reg.children("/absent") == []
    assert reg.children("/absent/deeper") == []


def test_children_of_leaf_is_empty(reg: BaseRegistry) -> None:
    reg.put("/leaf", b"v")
    assert reg.children("/leaf") == []


def test_children_follow_deletes(reg: BaseRegistry) -> None:
    reg.put("/p/a", b"")
    reg.put("/p/b/c", b"")
    reg.delete("/p/b")
    assert reg.children("/p") == ["a"]
    reg.delete("/p/a")
    assert reg.children("/p") == []
    assert reg.exists("/p")


def test_many_children(reg: BaseRegistry) -> None:
    names = [f"n{i:03d}" for i in range(150)]
    for name in names:
        reg.put(f"/many/{name}", b"")
    assert reg.children("/many") == names
