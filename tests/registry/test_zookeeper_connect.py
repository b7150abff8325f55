"""One ZooKeeper connection attempt waits at most the URL's ``connect_timeout`` for the
server (``registry/backends/zookeeper_connect.py``). kazoo alone gives a handshake the
session timeout divided by the hosts: a reconnect that met a server accepting and not
answering (one starting up) stayed SUSPENDED until its session was gone."""

from __future__ import annotations

import time
import uuid
from typing import Any

import registry
from registry.backends.zookeeper import ZooKeeperRegistry
from registry.protocol import SessionState
from tests.servers.proxy import TCPProxy
from tests.waiting import wait_for

_SESSION = 30.0  # the server grants up to 60 s (tests/servers/zookeeper.py)
_ATTEMPT = 1.0


def test_a_handshake_nobody_answers_is_given_up_and_the_session_resumed(zk_server: Any) -> None:
    host, port = zk_server.address.rsplit(":", 1)
    with TCPProxy(host, int(port)) as proxy:
        namespace = "/zkconnect" + uuid.uuid4().hex[:10]
        reg = registry.connect(
            f"zk://{proxy.address}{namespace}?session_timeout={_SESSION:g}&connect_timeout={_ATTEMPT:g}"
        )
        assert isinstance(reg, ZooKeeperRegistry)
        states: list[SessionState] = []
        reg.add_listener(states.append)
        try:
            reg.create("/e", b"v", ephemeral=True)
            proxy.stall()  # the link drops; the reconnect's handshake goes unanswered
            wait_for(lambda: proxy.stalled >= 1, 10, message="no reconnect attempt reached the proxy")
            proxy.restore()
            restored = time.monotonic()
            # kazoo alone would wait out the stalled handshake: the whole 30 s session
            wait_for(lambda: reg.state is SessionState.RECONNECTED, 4 * _ATTEMPT + 3, message=lambda: f"{states}")
            assert time.monotonic() - restored < _SESSION / 3
            assert SessionState.LOST not in states
            assert reg.exists("/e")  # the same session: its ephemeral node survived
        finally:
            reg.close()


def test_each_attempt_is_bounded_by_the_url_s_connect_timeout(zk_server: Any) -> None:
    with registry.connect(f"zk://{zk_server.address}/zkconnect?connect_timeout=2.5&session_timeout=20") as reg:
        assert isinstance(reg, ZooKeeperRegistry)
        connection = reg._client._connection
        assert connection.attempt_timeout == 2.5  # the handshake
        assert reg._client.handler.connect_timeout == 2.5  # the TCP connect
