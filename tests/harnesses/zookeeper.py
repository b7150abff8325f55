"""The contract-suite harness for ZooKeeper: URLs, session expiry, restarts, proxies,
participant processes, all against a real server.

Invariant: ``expire_session`` returns only once the server has forgotten the session
(proved by a further attach attempt being refused), so a test can assert on what follows.
"""

from __future__ import annotations

import time
from typing import Protocol, cast

from registry.backends.base import BaseRegistry
from tests.harnesses.common import ServerHandle, ServerHarness

__all__ = ["ZooKeeperHarness"]


class _HasSessionCredentials(Protocol):
    def session_credentials(self) -> tuple[int, bytes]: ...


class ZooKeeperHarness(ServerHarness):
    name = "zookeeper"
    scheme = "zk"

    def __init__(self, server: ServerHandle) -> None:
        super().__init__(server)

    def expire_session(self, reg: BaseRegistry, timeout: float = 30.0) -> None:
        """Attach a second client to ``reg``'s session and close it: the server ends the
        session as if it had timed out (kazoo's own test harness does the same)."""
        from kazoo.client import KazooClient

        session_id, password = cast(_HasSessionCredentials, reg).session_credentials()
        deadline = time.monotonic() + timeout
        # The first attach-and-close normally ends the session; if ``reg`` reconnected in
        # between and took the session back, the close is refused and we go again. An
        # attach that yields a *new* session id proves the old one is gone.
        while time.monotonic() < deadline:
            other = KazooClient(hosts=self.server.address, client_id=(session_id, password), timeout=10.0)
            try:
                other.start(timeout=max(0.5, deadline - time.monotonic()))
                attached = other.client_id is not None and other.client_id[0] == session_id
            finally:
                other.stop()
                other.close()
            if not attached:
                return
        raise AssertionError(f"ZooKeeper session 0x{session_id:x} still alive after {timeout:g}s")
