"""The contract-suite harness for etcd: URLs (with the server's credentials or TLS
files), session expiry by lease revocation, restarts, proxies, participant processes.

Invariant: ``expire_session`` returns once the session's lease is revoked on the server:
every key attached to it is gone, and the client's next keep-alive finds the lease dead.
"""

from __future__ import annotations

from typing import Any, Protocol, cast

from registry.backends.base import BaseRegistry
from tests.harnesses.common import ServerHandle, ServerHarness, build_url
from tests.servers.env import parse_hosts
from tests.servers.tls import TLSFiles

__all__ = ["EtcdHarness"]


class _HasLease(Protocol):
    @property
    def lease_id(self) -> int: ...


class EtcdHarness(ServerHarness):
    name = "etcd"
    scheme = "etcd"

    def __init__(self, server: ServerHandle) -> None:
        super().__init__(server)
        # an auth-enabled or TLS server (tests/servers/etcd.py) carries what clients need
        self.user: str | None = getattr(server, "user", None)
        self.password: str | None = getattr(server, "password", None)
        self.tls: TLSFiles | None = getattr(server, "tls", None)

    def url_for(self, hosts: str, namespace: str = "", **options: Any) -> str:
        if self.tls is not None:
            options.setdefault("ca_cert", str(self.tls.ca))
            options.setdefault("cert_key", str(self.tls.key))
            options.setdefault("cert_cert", str(self.tls.cert))
        return build_url(self.scheme, hosts, namespace, user=self.user, password=self.password, **options)

    def expire_session(self, reg: BaseRegistry) -> None:
        """Revoke ``reg``'s session lease from a separate client."""
        import grpc
        import pyetcd

        lease_id = cast(_HasLease, reg).lease_id
        host, port = parse_hosts(self.server.address)[0]
        client = pyetcd.client(
            host=host,
            port=port,
            timeout=10.0,
            user=self.user,
            password=self.password,
            ca_cert=str(self.tls.ca) if self.tls else None,
            cert_key=str(self.tls.key) if self.tls else None,
            cert_cert=str(self.tls.cert) if self.tls else None,
        )
        try:
            if self.user is not None:
                client.call_credentials = None  # see etcd_write_check: token goes as metadata
            try:
                client.revoke_lease(lease_id)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:  # already expired: nothing to do
                    raise
        finally:
            client.close()
