"""Unit tests of ``registry.paths``: the path rules and the namespace mapping."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from registry.paths import (
    Namespace,
    ancestors,
    basename,
    excluded_below,
    excluded_subtree,
    is_below,
    join,
    parent,
    validate_path,
)

_SEGMENT = st.text(st.characters(codec="utf-8", blacklist_characters="/\x00"), min_size=1, max_size=8).filter(
    lambda s: s not in {".", ".."}
)
_SEGMENTS = st.lists(_SEGMENT, min_size=1, max_size=5)


def _path(segments: list[str]) -> str:
    return "".join("/" + s for s in segments)


@pytest.mark.parametrize("path", ["/", "/a", "/a/b", "/a b/c-d_e.f", "/é/∂", "/a/.b", "/a/..."])
def test_valid_paths_are_returned_unchanged(path: str) -> None:
    assert validate_path(path) == path


@pytest.mark.parametrize(
    ("path", "named"),
    [
        ("", "absolute"),
        ("a", "absolute"),
        ("a/b", "absolute"),
        ("/a/", "end with"),
        ("//", "end with"),
        ("/a//b", "empty segment"),
        ("//a", "empty segment"),
        ("/a/./b", "relative"),
        ("/a/..", "relative"),
        ("/.", "relative"),
        ("/a\x00b", "NUL"),
    ],
)
def test_invalid_paths_are_named(path: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        validate_path(path)


@pytest.mark.parametrize("value", [None, 1, b"/a", ["/a"]])
def test_path_must_be_a_str(value: object) -> None:
    with pytest.raises(ValueError, match="str"):
        validate_path(value)


def test_helpers() -> None:
    assert join("/", "a", "b") == "/a/b"
    assert join("/a", "b") == "/a/b"
    assert join("/") == "/"
    assert parent("/a/b") == "/a"
    assert parent("/a") == "/"
    assert basename("/a/b") == "b"
    assert ancestors("/a/b/c") == ("/a", "/a/b")
    assert ancestors("/a") == ()
    assert is_below("/a/b", "/a")
    assert is_below("/a", "/a")
    assert is_below("/anything", "/")
    assert not is_below("/ab", "/a")
    assert not is_below("/a", "/a/b")


def test_namespace_mapping() -> None:
    ns = Namespace("/app")
    assert ns.to_server("/") == "/app"
    assert ns.to_server("/x/y") == "/app/x/y"
    assert ns.to_client("/app") == "/"
    assert ns.to_client("/app/x/y") == "/x/y"
    assert Namespace("").to_server("/x") == "/x"
    assert Namespace("/").to_server("/x") == "/x"
    assert "app" in repr(ns)


@pytest.mark.parametrize("prefix", ["app", "/app/", "/a//b"])
def test_bad_namespace_is_a_value_error(prefix: str) -> None:
    with pytest.raises(ValueError):
        Namespace(prefix)


def test_namespace_rejects_bad_caller_paths() -> None:
    with pytest.raises(ValueError):
        Namespace("/app").to_server("x")


# -- properties ----------------------------------------------------------------------------
@given(_SEGMENTS)
def test_any_well_formed_path_is_valid(segments: list[str]) -> None:
    path = _path(segments)
    assert validate_path(path) == path
    assert parent(path) == (_path(segments[:-1]) or "/")
    assert basename(path) == segments[-1]
    assert join(parent(path), basename(path)) == path
    assert ancestors(path) == tuple(_path(segments[:i]) for i in range(1, len(segments)))


@given(_SEGMENTS, st.data())
def test_any_path_with_an_empty_segment_is_rejected(segments: list[str], data: st.DataObject) -> None:
    at = data.draw(st.integers(min_value=0, max_value=len(segments)))
    broken = _path(segments[:at]) + "/" + _path(segments[at:])
    with pytest.raises(ValueError):
        validate_path(broken)


@given(st.lists(_SEGMENT, max_size=5))
def test_any_path_with_a_trailing_slash_is_rejected(segments: list[str]) -> None:
    broken = _path(segments) + "/"
    if broken == "/":
        return  # the root itself is the one path that ends with '/'
    with pytest.raises(ValueError):
        validate_path(broken)


@given(st.lists(_SEGMENT, max_size=3), st.lists(_SEGMENT, max_size=5))
def test_namespace_round_trips(prefix: list[str], segments: list[str]) -> None:
    ns = Namespace(_path(prefix))
    path = _path(segments) or "/"
    stored = ns.to_server(path)
    assert stored.startswith(_path(prefix))
    assert validate_path(stored) == stored
    assert ns.to_client(stored) == path


def test_excluded_below_looks_at_the_path_and_its_ancestors_under_the_root_only() -> None:
    def hot(p: str) -> bool:
        return p.endswith("/hot")

    assert excluded_below("/r/hot/a/b", "/r", hot)
    assert excluded_below("/r/hot", "/r", hot)
    assert not excluded_below("/r/hotter/a", "/r", hot)
    assert not excluded_below("/hot/a", "/hot", hot)  # the root itself is never excluded
    assert excluded_below("/x/hot/a", "/", hot)


def test_excluded_subtree_names_the_shallowest_excluded_ancestor_under_the_root() -> None:
    def hot(p: str) -> bool:
        return p.endswith("/hot")

    assert excluded_subtree("/r/hot/a/hot/b", "/r", hot) == "/r/hot"  # the outer one
    assert excluded_subtree("/r/hot", "/r", hot) == "/r/hot"
    assert excluded_subtree("/r/a/hot/b", "/r", hot) == "/r/a/hot"
    assert excluded_subtree("/r/hotter/a", "/r", hot) is None
    assert excluded_subtree("/hot/a", "/hot", hot) is None  # the root itself is never excluded
    assert excluded_subtree("/hot/a", "/", hot) == "/hot"
