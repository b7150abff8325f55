"""Contract: reads and single-node writes (get/get_node/exists/create/put/delete)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from registry.backends.base import MAX_VALUE_BYTES, BaseRegistry
from registry.errors import NodeExistsError, RegistryError
from registry.protocol import Node
from tests.harness import Harness

from . import peer

BAD_PATHS = ["", "a", "a/b", "/a/", "/a//b", "//", "/a/./b", "/a/../b", "/a\x00b"]


def test_absent_node_reads_as_none(reg: BaseRegistry) -> None:
    assert reg.get("/missing") is None
    assert reg.get_node("/missing") is None
    assert reg.exists("/missing") is False
    assert reg.get("/missing/deeper/still") is None


def test_create_then_read(reg: BaseRegistry) -> None:
    reg.create("/a", b"hello")
    assert reg.get("/a") == b"hello"
    assert reg.exists("/a")
    node = reg.get_node("/a")
    assert isinstance(node, Node)
    assert node.value == b"hello"
    assert isinstance(node.version, int)
    assert node.ephemeral is False


def test_create_defaults_to_empty_value(reg: BaseRegistry) -> None:
    reg.create("/empty")
    assert reg.get("/empty") == b""
    assert reg.exists("/empty")


def test_create_makes_missing_parents_persistent_and_empty(harness: Harness, reg: BaseRegistry) -> None:
    reg.create("/p/q/r", b"leaf", ephemeral=True)
    for parent in ("/p", "/p/q"):
        node = reg.get_node(parent)
        assert node is not None, parent
        assert node.value == b""
        assert node.ephemeral is False
    other = peer(harness, reg)
    reg.close()
    # the ephemeral leaf went with its session; the parents it needed stay
    assert not other.exists("/p/q/r")
    assert other.exists("/p/q")
    assert other.exists("/p")


def test_create_existing_raises_node_exists(reg: BaseRegistry) -> None:
    reg.create("/dup", b"first")
    with pytest.raises(NodeExistsError) as info:
        reg.create("/dup", b"second")
    assert info.value.path == "/dup"
    assert reg.get("/dup") == b"first"


def test_create_over_implicit_parent_raises_node_exists(reg: BaseRegistry) -> None:
    reg.create("/x/y")
    with pytest.raises(NodeExistsError):
        reg.create("/x")


def test_put_creates_then_overwrites(reg: BaseRegistry) -> None:
    reg.put("/k", b"1")
    assert reg.get("/k") == b"1"
    reg.put("/k", b"2")
    assert reg.get("/k") == b"2"
    reg.put("/deep/er/k", b"3")
    assert reg.get("/deep/er/k") == b"3"
    assert reg.get("/deep/er") == b""


def test_delete_is_recursive(reg: BaseRegistry) -> None:
    for path in ("/d/a/b/c", "/d/a/x", "/d/y", "/keep"):
        reg.put(path, b"v")
    reg.delete("/d")
    for path in ("/d", "/d/a", "/d/a/b", "/d/a/b/c", "/d/a/x", "/d/y"):
        assert not reg.exists(path), path
    assert reg.children("/d") == []
    assert reg.get("/keep") == b"v"


def test_delete_does_not_touch_siblings_sharing_a_prefix(reg: BaseRegistry) -> None:
    reg.put("/ab", b"1")
    reg.put("/ab/c", b"2")
    reg.put("/abc", b"3")
    reg.put("/ab-x/c", b"4")
    reg.delete("/ab")
    assert reg.get("/abc") == b"3"
    assert reg.get("/ab-x/c") == b"4"


def test_delete_absent_is_silent(reg: BaseRegistry) -> None:
    reg.delete("/never")
    reg.delete("/never/deeper/still")
    reg.put("/once", b"v")
    reg.delete("/once")
    reg.delete("/once")
    assert not reg.exists("/once")


def test_recreate_after_delete(reg: BaseRegistry) -> None:
    reg.create("/again", b"1")
    reg.delete("/again")
    reg.create("/again", b"2")
    assert reg.get("/again") == b"2"


def test_root_is_readable(reg: BaseRegistry) -> None:
    assert reg.exists("/") is True
    assert reg.children("/") == []
    reg.put("/top", b"v")
    assert reg.children("/") == ["top"]


@pytest.mark.parametrize(
    "write",
    [
        lambda r: r.create("/"),
        lambda r: r.create("/", b"v"),
        lambda r: r.put("/", b"v"),
        lambda r: r.delete("/"),
        lambda r: r.create_sequential("/"),
    ],
    ids=["create", "create-value", "put", "delete", "create_sequential"],
)
def test_root_is_not_writable(reg: BaseRegistry, write: Any) -> None:
    reg.put("/survivor", b"v")
    with pytest.raises(ValueError, match="root"):
        write(reg)
    assert reg.get("/survivor") == b"v"


@pytest.mark.parametrize("value", ["text", 1, None, ["b"]], ids=["str", "int", "none", "list"])
def test_value_must_be_bytes(reg: BaseRegistry, value: Any) -> None:
    with pytest.raises(ValueError, match="bytes"):
        reg.put("/v", value)
    with pytest.raises(ValueError, match="bytes"):
        reg.create("/v", value)
    assert not reg.exists("/v")


def test_bytes_like_values_are_stored_as_bytes(reg: BaseRegistry) -> None:
    # the protocol says bytes; bytes-like values are accepted and stored as bytes
    array: Any = bytearray(b"ab")
    view: Any = memoryview(b"cd")
    reg.put("/ba", array)
    reg.put("/mv", view)
    assert reg.get("/ba") == b"ab"
    assert reg.get("/mv") == b"cd"
    assert type(reg.get("/ba")) is bytes


def test_binary_values_round_trip(reg: BaseRegistry) -> None:
    value = bytes(range(256)) * 4
    reg.put("/bin", value)
    assert reg.get("/bin") == value


def test_value_at_the_limit_is_stored(reg: BaseRegistry) -> None:
    value = b"x" * MAX_VALUE_BYTES
    reg.put("/big", value)
    assert reg.get("/big") == value


def test_value_over_the_limit_is_a_clear_value_error(reg: BaseRegistry) -> None:
    with pytest.raises(ValueError, match=str(MAX_VALUE_BYTES)) as info:
        reg.put("/huge", b"x" * (MAX_VALUE_BYTES + 1))
    assert "/huge" in str(info.value)
    with pytest.raises(ValueError, match=str(MAX_VALUE_BYTES)):
        reg.create("/huge", b"x" * (MAX_VALUE_BYTES + 1))
    assert not reg.exists("/huge")
    reg.put("/small", b"v")
    with pytest.raises(ValueError):
        reg.put("/small", b"x" * (MAX_VALUE_BYTES + 1))
    assert reg.get("/small") == b"v"


@pytest.mark.parametrize("path", BAD_PATHS)
def test_bad_paths_are_value_errors(reg: BaseRegistry, path: str) -> None:
    calls: list[Callable[[], object]] = [
        lambda: reg.get(path),
        lambda: reg.get_node(path),
        lambda: reg.exists(path),
        lambda: reg.children(path),
        lambda: reg.create(path, b"v"),
        lambda: reg.put(path, b"v"),
        lambda: reg.delete(path),
    ]
    for call in calls:
        with pytest.raises(ValueError):
            call()


def test_closed_client_refuses_calls(harness: Harness) -> None:
    with harness.connect() as reg:
        reg.put("/x", b"v")
    with pytest.raises(RegistryError):
        reg.get("/x")
    with pytest.raises(RegistryError):
        reg.put("/x", b"w")
    reg.close()  # idempotent
