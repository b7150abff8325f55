"""ZooKeeper digest auth: nodes a ``zk://user:password@`` client creates can be read by
anyone but changed only by that identity; a refusal is a clear ``RegistryError``."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import registry
from registry.backends.base import BaseRegistry
from registry.errors import RegistryError, TransactionError
from registry.protocol import Create, Set

ALICE_PASSWORD = "alice-Pw-91e3"
BOB_PASSWORD = "bob-Pw-77c2"


@pytest.fixture
def clients(zk_server: Any) -> Iterator[dict[str, BaseRegistry]]:
    namespace = "/auth" + uuid.uuid4().hex[:10]
    opened: dict[str, BaseRegistry] = {}
    try:
        opened["alice"] = registry.connect(f"zk://alice:{ALICE_PASSWORD}@{zk_server.address}{namespace}")
        opened["alice"].put("/secret/child", b"c")
        opened["alice"].put("/secret", b"v")
        opened["bob"] = registry.connect(f"zk://bob:{BOB_PASSWORD}@{zk_server.address}{namespace}")
        opened["anonymous"] = registry.connect(f"zk://{zk_server.address}{namespace}")
        yield opened
    finally:
        for client in opened.values():
            client.close()


def _assert_clear_refusal(error: BaseException, path: str) -> None:
    assert isinstance(error, RegistryError)
    assert type(error).__module__.startswith("registry"), type(error)
    text = str(error)
    assert path in text, text
    assert any(word in text.lower() for word in ("auth", "acl", "permission", "denied")), text
    for secret in (ALICE_PASSWORD, BOB_PASSWORD):
        assert secret not in text


@pytest.mark.parametrize("who", ["bob", "anonymous"])
def test_other_identity_can_read(clients: dict[str, BaseRegistry], who: str) -> None:
    other = clients[who]
    assert other.get("/secret") == b"v"
    assert other.children("/secret") == ["child"]
    node = other.get_node("/secret/child")
    assert node is not None and node.value == b"c"


@pytest.mark.parametrize("who", ["bob", "anonymous"])
def test_other_identity_cannot_change_our_nodes(clients: dict[str, BaseRegistry], who: str) -> None:
    other = clients[who]
    with pytest.raises(RegistryError) as put:
        other.put("/secret", b"stolen")
    _assert_clear_refusal(put.value, "/secret")
    with pytest.raises(RegistryError) as delete:
        other.delete("/secret")
    _assert_clear_refusal(delete.value, "/secret")
    with pytest.raises(RegistryError) as create:
        other.create("/secret/intruder", b"x")
    _assert_clear_refusal(create.value, "/secret")
    with pytest.raises(TransactionError):
        other.transaction([Set("/secret", b"stolen")])
    alice = clients["alice"]
    assert alice.get("/secret") == b"v"
    assert alice.children("/secret") == ["child"]


@pytest.mark.parametrize("who", ["bob", "anonymous"])
def test_nodes_a_transaction_creates_are_protected_too(clients: dict[str, BaseRegistry], who: str) -> None:
    """A transaction builds its creates itself (parents included), not through kazoo's
    create: they must carry the owner's ACL all the same."""
    alice = clients["alice"]
    alice.transaction([Create("/made/in/txn", b"x"), Create("/made/ephemeral", b"e", ephemeral=True)])
    other = clients[who]
    for path in ("/made", "/made/in", "/made/in/txn", "/made/ephemeral"):
        with pytest.raises(RegistryError) as put:
            other.put(path, b"stolen")
        _assert_clear_refusal(put.value, path)
    with pytest.raises(TransactionError):
        other.transaction([Create("/made/in/intruder", b"x")])
    assert alice.get("/made/in/txn") == b"x"
    assert other.children("/made/in") == ["txn"]


def test_owner_can_still_change_its_nodes(clients: dict[str, BaseRegistry]) -> None:
    alice = clients["alice"]
    alice.put("/secret", b"w")
    alice.transaction([Set("/secret/child", b"d"), Create("/secret/more/deep", b"x")])
    alice.delete("/secret/more")
    assert clients["bob"].get("/secret") == b"w"
    assert clients["bob"].get("/secret/child") == b"d"


def test_a_second_client_with_the_same_identity_may_change_them(
    zk_server: Any, clients: dict[str, BaseRegistry]
) -> None:
    namespace = registry.parse_url(clients["alice"].url).namespace
    with registry.connect(f"zk://alice:{ALICE_PASSWORD}@{zk_server.address}{namespace}") as again:
        again.put("/secret", b"from-alice-again")
    assert clients["bob"].get("/secret") == b"from-alice-again"


def test_password_shows_nowhere(
    zk_server: Any, clients: dict[str, BaseRegistry], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    alice = clients["alice"]
    for text in (repr(alice), alice.url, str(alice.url)):
        assert ALICE_PASSWORD not in text
    assert "alice:***@" in alice.url
    with registry.connect(f"zk://alice:{ALICE_PASSWORD}@{zk_server.address}/pw{uuid.uuid4().hex[:8]}") as reg:
        reg.put("/x", b"v")
        assert ALICE_PASSWORD not in repr(reg)
    assert ALICE_PASSWORD not in caplog.text
