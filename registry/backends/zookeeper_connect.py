"""A bound on how long one ZooKeeper connection attempt may wait for the server.

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
uses only while it establishes a connection (the connect request and authentication).
``bound_handshakes`` swaps the client's connection handler to a subclass that caps its
timeout; if a kazoo release no longer has it, the client is left as kazoo made it and a
warning says so.
"""

from __future__ import annotations

import logging
from typing import Any

from kazoo.protocol.connection import ConnectionHandler

__all__ = ["bound_handshakes"]

log = logging.getLogger("registry.zookeeper")


class _BoundedHandshake(ConnectionHandler):  # type: ignore[misc]
    """kazoo's connection handler, each handshake read capped at ``attempt_timeout``."""

    attempt_timeout: float

    def _invoke(self, timeout: float, request: Any, xid: int | None = None) -> Any:
        return super()._invoke(min(timeout, self.attempt_timeout), request, xid)


def bound_handshakes(client: Any, timeout: float) -> bool:
    """Cap each of ``client``'s connect handshakes at ``timeout`` seconds (module
    docstring); False, with a warning, when this kazoo has no handshake to cap."""
    connection = client._connection
    if type(connection) is not ConnectionHandler or not callable(getattr(connection, "_invoke", None)):
        log.warning(
            "kazoo's connection handler is not the one this release expects: a ZooKeeper "
            "handshake may wait the session timeout for a server that does not answer"
        )
        return False
    connection.__class__ = _BoundedHandshake
    connection.attempt_timeout = timeout
    return True
