"""Three-node ZooKeeper and etcd: when the leader dies the client keeps working — writes
resume within a bounded wait, a watch keeps delivering, the session and its ephemeral nodes
survive."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import registry
from registry.backends.base import BaseRegistry
from registry.errors import RegistryError
from registry.protocol import EventKind, SessionState
from tests.contract import EventLog, StateLog, until, wait_for

pytestmark = pytest.mark.cluster

#: long enough that a leader election (under a second or two) never costs the session
SESSION_TIMEOUT = 8.0
#: bound for the cluster to take writes again after its leader died
FAILOVER = 20.0

_SCHEMES = {"zk_ensemble": "zk", "etcd_cluster": "etcd"}


@pytest.mark.parametrize("fixture", ["zk_ensemble", "etcd_cluster"], ids=["zookeeper", "etcd"])
def test_client_survives_the_leader_dying(request: pytest.FixtureRequest, fixture: str) -> None:
    cluster: Any = request.getfixturevalue(fixture)
    url = (
        f"{_SCHEMES[fixture]}://{cluster.address}/c{uuid.uuid4().hex[:10]}?session_timeout={SESSION_TIMEOUT}"
    )
    reg: BaseRegistry = registry.connect(url)
    observer: BaseRegistry = registry.connect(url)
    leader: int | None = None
    try:
        states = StateLog()
        reg.add_listener(states)
        reg.create("/members/me", b"alive", ephemeral=True)
        events = EventLog()
        reg.watch("/w", events)
        observer.put("/w/before", b"1")
        events.wait(EventKind.CREATED, "/w/before", b"1")

        leader = cluster.leader_index()
        cluster.kill_member(leader)

        until(lambda: reg.put("/after", b"written"), FAILOVER, "no write succeeded after the leader died")
        until(
            lambda: _expect(reg.get("/after"), b"written"),
            FAILOVER,
            "the write made after failover cannot be read back",
        )
        until(lambda: observer.put("/w/after", b"2"), FAILOVER, "the observer could not write after failover")
        events.wait(EventKind.CREATED, "/w/after", b"2", timeout=FAILOVER)
        until(lambda: _expect(observer.exists("/members/me"), True), FAILOVER, "the ephemeral node is gone")
        node = observer.get_node("/members/me")
        assert node is not None and node.ephemeral and node.value == b"alive"
        assert SessionState.LOST not in states.states, f"session lost during failover: {states.states}"
        wait_for(
            lambda: reg.state in (SessionState.CONNECTED, SessionState.RECONNECTED),
            FAILOVER,
            message=lambda: f"client state {reg.state}",
        )
    finally:
        if leader is not None:
            cluster.start_member(leader)
        reg.close()
        observer.close()


def _expect(actual: object, expected: object) -> None:
    if actual != expected:
        raise RegistryError(f"read {actual!r}, expected {expected!r}")
