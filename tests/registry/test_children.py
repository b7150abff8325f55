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
