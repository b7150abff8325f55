"""Contract: ephemeral nodes live exactly as long as the session that owns them."""

from __future__ import annotations

import time

from registry.backends.base import BaseRegistry
from registry.protocol import Node
from tests.harness import Harness

from . import PROMPT, SLACK, namespace_of, peer, session_timeout, wait_for


def _node(reg: BaseRegistry, path: str) -> Node:
    node = reg.get_node(path)
    assert node is not None, path
    return node


def test_node_ephemeral_flag(harness: Harness, reg: BaseRegistry) -> None:
    reg.create("/e/leaf", b"v", ephemeral=True)
    reg.create("/p", b"v")
    reg.put("/put-e", b"v", ephemeral=True)
    other = peer(harness, reg)
    for client in (reg, other):
        assert _node(client, "/e/leaf").ephemeral is True
        assert _node(client, "/put-e").ephemeral is True
        assert _node(client, "/e").ephemeral is False
        assert _node(client, "/p").ephemeral is False


def test_gone_at_once_on_close(harness: Harness, reg: BaseRegistry) -> None:
    owner = peer(harness, reg)
    owner.create("/e1", b"v", ephemeral=True)
    owner.put("/dir/e2", b"v", ephemeral=True)
    assert reg.exists("/e1") and reg.exists("/dir/e2")
    owner.close()
    # no wait: close() returns only once the session has ended on the server
    assert not reg.exists("/e1")
    assert not reg.exists("/dir/e2")
    assert reg.exists("/dir")


def test_context_manager_exit_removes_ephemerals(harness: Harness, reg: BaseRegistry) -> None:
    with peer(harness, reg) as owner:
        owner.create("/e", b"v", ephemeral=True)
        assert reg.exists("/e")
    assert not reg.exists("/e")


def test_gone_within_session_timeout_after_participant_is_killed(harness: Harness, reg: BaseRegistry) -> None:
    timeout = session_timeout(harness)
    url = harness.url(namespace_of(reg), session_timeout=timeout)
    participant = harness.participant(url, "ephemeral", "/member")
    killed = False
    try:
        assert participant.ready(PROMPT + timeout), "participant did not create its node"
        wait_for(lambda: reg.exists("/member"), PROMPT, message="participant's node not visible")
        assert _node(reg, "/member").ephemeral is True
        start = time.monotonic()
        participant.kill()
        killed = True
        wait_for(
            lambda: not reg.exists("/member"),
            timeout + SLACK,
            message=f"ephemeral of a killed participant still present after {timeout + SLACK:g}s",
        )
        assert time.monotonic() - start < timeout + SLACK
    finally:
        if not killed:
            participant.kill()


def test_participant_clean_stop_removes_its_node_promptly(harness: Harness, reg: BaseRegistry) -> None:
    # a long session timeout: only closing the session can remove the node in time
    url = harness.url(namespace_of(reg), session_timeout=30)
    participant = harness.participant(url, "ephemeral", "/member")
    stopped = False
    try:
        assert participant.ready(PROMPT), "participant did not create its node"
        wait_for(lambda: reg.exists("/member"), PROMPT, message="participant's node not visible")
        participant.stop()
        stopped = True
        wait_for(lambda: not reg.exists("/member"), PROMPT, message="node kept after a clean stop")
    finally:
        if not stopped:
            participant.kill()


def test_gone_after_session_expiry(harness: Harness, reg: BaseRegistry) -> None:
    owner = peer(harness, reg, session_timeout=session_timeout(harness))
    owner.create("/e", b"v", ephemeral=True)
    owner.create("/p", b"v")
    harness.expire_session(owner)
    wait_for(lambda: not reg.exists("/e"), PROMPT, message="ephemeral survived its expired session")
    assert reg.get("/p") == b"v"


def test_put_keeps_persistent_node_persistent(harness: Harness, reg: BaseRegistry) -> None:
    owner = peer(harness, reg)
    owner.create("/p", b"1")
    owner.put("/p", b"2", ephemeral=True)
    assert _node(reg, "/p").ephemeral is False
    owner.close()
    assert reg.get("/p") == b"2"


def test_put_keeps_ephemeral_node_ephemeral(harness: Harness, reg: BaseRegistry) -> None:
    owner = peer(harness, reg)
    owner.create("/e", b"1", ephemeral=True)
    owner.put("/e", b"2")
    node = _node(reg, "/e")
    assert node.ephemeral is True
    assert node.value == b"2"
    owner.close()
    assert not reg.exists("/e")


def test_put_by_another_client_keeps_the_owner_session(harness: Harness, reg: BaseRegistry) -> None:
    owner = peer(harness, reg)
    writer = peer(harness, reg)
    owner.create("/e", b"1", ephemeral=True)
    writer.put("/e", b"2")
    writer.put("/e", b"3", ephemeral=True)
    assert _node(reg, "/e") == Node(b"3", _node(reg, "/e").version, True)
    writer.close()
    assert reg.get("/e") == b"3", "the node died with the writer's session, not its owner's"
    owner.close()
    assert not reg.exists("/e")


def test_ephemeral_can_be_recreated_after_close(harness: Harness, reg: BaseRegistry) -> None:
    first = peer(harness, reg)
    first.create("/e", b"1", ephemeral=True)
    first.close()
    second = peer(harness, reg)
    second.create("/e", b"2", ephemeral=True)
    assert _node(reg, "/e") == Node(b"2", _node(reg, "/e").version, True)


def test_deleting_an_ephemeral_node_is_allowed(reg: BaseRegistry) -> None:
    reg.create("/e", b"v", ephemeral=True)
    reg.delete("/e")
    assert not reg.exists("/e")
    reg.create("/e", b"w", ephemeral=True)
    assert reg.get("/e") == b"w"
