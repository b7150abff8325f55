"""``registry.children.ChildIndex``: the children of each parent, in the order added, a
parent present exactly while it has some, and one child held without a container."""

from __future__ import annotations

import sys

from registry.children import ChildIndex


def test_children_in_the_order_added_and_a_parent_only_while_it_has_some() -> None:
    index = ChildIndex()
    assert index.of("/a") == () and "/a" not in index
    index.add("/a", "/a/x")
    index.add("/a", "/a/x")  # twice: still once
    assert index.of("/a") == ("/a/x",)
    index.add_all("/a", ["/a/y", "/a/z"])
    assert index.of("/a") == ("/a/x", "/a/y", "/a/z")
    index.discard("/a", "/a/y")
    index.discard("/a", "/a/missing")
    assert index.of("/a") == ("/a/x", "/a/z")
    index.discard("/a", "/a/x")
    assert index.of("/a") == ("/a/z",)
    index.add("/a", "/a/w")
    assert index.of("/a") == ("/a/z", "/a/w")
    index.discard("/a", "/a/z")
    index.discard("/a", "/a/w")
    assert index.of("/a") == () and "/a" not in index and len(index) == 0


def test_pop_and_clear_forget_children() -> None:
    index = ChildIndex()
    index.add_all("/a", ["/a/1", "/a/2"])
    index.add("/b", "/b/1")
    index.pop("/a")
    index.pop("/never")
    assert index.of("/a") == () and index.of("/b") == ("/b/1",) and len(index) == 1
    index.clear()
    assert len(index) == 0 and index.of("/b") == ()


def test_the_copy_handed_out_survives_changes_to_the_index() -> None:
    index = ChildIndex()
    index.add_all("/a", [f"/a/{i}" for i in range(5)])
    seen = []
    for child in index.of("/a"):
        index.discard("/a", child)
        seen.append(child)
    assert seen == [f"/a/{i}" for i in range(5)] and "/a" not in index


def test_paths_are_kept_as_the_shared_str() -> None:
    index = ChildIndex()
    parent, child = "".join(["/p", "q"]), "".join(["/pq/", "c"])
    index.add(parent, child)
    (kept,) = index.of("/pq")
    assert kept is sys.intern("/pq/c")


def _shape(index: ChildIndex, parent: str) -> str:
    return type(index._by_parent[parent]).__name__


def test_each_parent_holds_its_children_in_the_smallest_shape_in_the_order_added() -> None:
    """One child is its path, up to sixteen a tuple, more a dict (O(1) for a namespace
    root of 10,000 jobs); a dict shrunk to eight becomes a tuple again. Whatever the shape,
    the children come in the order added, each once."""
    index = ChildIndex()
    children = [f"/a/{i:02d}" for i in range(20)]
    shapes = []
    for count, child in enumerate(children, start=1):
        index.add("/a", child)
        index.add("/a", children[0])  # already there, in every shape
        shapes.append(_shape(index, "/a"))
        assert index.of("/a") == tuple(children[:count])
    assert shapes == ["str"] + ["tuple"] * 15 + ["dict"] * 4
    for count in range(20, 1, -1):
        index.discard("/a", children[count - 1])
        index.discard("/a", "/a/missing")
        assert index.of("/a") == tuple(children[: count - 1])
        expected = "str" if count == 2 else "dict" if count - 1 > 8 else "tuple"
        assert _shape(index, "/a") == expected, count
    index.add("/a", "/a/back")
    index.discard("/a", children[0])
    assert index.of("/a") == ("/a/back",) and _shape(index, "/a") == "str"
