"""The connection handler a ZooKeeper client runs: kazoo's, with each connection attempt
bounded and its bytes moved in bulk (``zookeeper_socket``).

kazoo gives a connection attempt the whole session timeout for its TCP connect, and
``session_timeout / len(hosts)`` for the server to answer its handshake: with one host,
the whole session. A server that accepts connections while it is still starting, or a
link that swallows packets, then holds the client SUSPENDED until its session is over on
the server, though the server came back seconds in (kazoo issues #517 and #756).

Invariant: one attempt, TCP connect and handshake each, waits at most the URL's
``connect_timeout`` (5 s by default); kazoo then drops that socket and its retry policy
tries again 0.1-1 s later, while the session is still alive on the server. The TCP
connect is capped by ``PollingHandler(connect_timeout=...)``, the handshake here.

Hazard: the handshake goes through ``ConnectionHandler._invoke``, a private method kazoo
uses only while it establishes a connection (the connect request and authentication),
and ``zookeeper_socket`` overrides others. ``tune_connection`` swaps the client's
connection handler to the subclass below only when kazoo's is exactly the class they were
written against and has them all; otherwise the client is left as kazoo made it and a
warning says so.
"""

from __future__ import annotations

import logging
from typing import Any

from kazoo.protocol.connection import ConnectionHandler
from kazoo.protocol.serialization import Connect

from registry.backends.zookeeper_socket import BatchedSocketIO

__all__ = ["granted_timeout", "tune_connection"]

log = logging.getLogger("registry.zookeeper")

#: kazoo's private methods the subclass relies on
_OVERRIDDEN = ("_invoke", "_read", "_read_socket", "_send_request", "_write", "_socket_error_handling")


class _TunedConnection(BatchedSocketIO):
    """kazoo's connection handler, each handshake read capped at ``attempt_timeout``; it
    keeps the session timeout the server granted (kazoo logs it and keeps nothing)."""

    attempt_timeout: float
    #: seconds, from the last handshake's answer; None before the first
    granted_timeout: float | None = None

    def _invoke(self, timeout: float, request: Any, xid: int | None = None) -> Any:
        answer = super()._invoke(min(timeout, self.attempt_timeout), request, xid)
        if isinstance(request, Connect):
            granted = answer[0].time_out
            if granted > 0:
                self.granted_timeout = granted / 1000.0
        return answer


def granted_timeout(client: Any) -> float | None:
    """The session timeout (s) the server granted ``client`` at its last handshake, or
    None when it is not known (no handshake yet, or kazoo's handler left untuned)."""
    timeout = getattr(client._connection, "granted_timeout", None)
    return timeout if isinstance(timeout, float) else None


def tune_connection(client: Any, timeout: float) -> bool:
    """Cap each of ``client``'s connect handshakes at ``timeout`` seconds and batch its
    socket I/O (module docstring); False, with a warning, when this kazoo's connection
    handler is not the one expected."""
    connection = client._connection
    if type(connection) is not ConnectionHandler or not all(
        callable(getattr(connection, name, None)) for name in _OVERRIDDEN
    ):
        log.warning(
            "kazoo's connection handler is not the one this release expects: a ZooKeeper "
            "handshake may wait the session timeout for a server that does not answer, "
            "and requests are sent one write each"
        )
        return False
    connection.__class__ = _TunedConnection
    connection.attempt_timeout = timeout
    return True
