"""A server the test session did not start (``SHARDJOB_TEST_ZK`` / ``SHARDJOB_TEST_ETCD``).

Invariant: it behaves like a started server for everything a test may do to a server it
does not own — connect, proxy — and turns every fault that needs process control
(restart, stop, kill) into a skip, never into a silent no-op.
"""

from __future__ import annotations

import os
import time

import pytest

from tests.servers.env import ETCD_ENV, ZK_ENV, external_address, parse_hosts

__all__ = ["ExternalServer", "skip_unless_counted_alone"]


class ExternalServer:
    """``address`` is ``host:port[,host:port...]``; ``kind`` is ``zookeeper`` or ``etcd``."""

    external = True
    user: str | None = None
    password: str | None = None
    tls = None

    def __init__(self, address: str, kind: str) -> None:
        self.address = address
        self.kind = kind
        self.hosts = parse_hosts(address)

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Wait (bounded) until every host takes a write: compose starts us alongside them."""
        from tests.servers.etcd import etcd_write_check
        from tests.servers.zookeeper import zookeeper_write_check

        deadline = time.monotonic() + timeout
        for host, port in self.hosts:
            while True:
                remaining = deadline - time.monotonic()
                ok = (
                    zookeeper_write_check(f"{host}:{port}", min(5.0, max(0.1, remaining)))
                    if self.kind == "zookeeper"
                    else etcd_write_check(host, port, min(5.0, max(0.1, remaining)))
                )
                if ok:
                    break
                if remaining <= 0:
                    raise RuntimeError(
                        f"external {self.kind} at {host}:{port} takes no writes after {timeout:g}s"
                    )
                time.sleep(0.2)

    def cannot(self, action: str) -> str:
        """Why a test that must ``action`` this server is skipped, in full (``-ra`` prints it)."""
        variable = ZK_ENV if self.kind == "zookeeper" else ETCD_ENV
        return (
            f"external server: cannot {action} the {self.kind} at {self.address} ({variable} is set, so "
            f"this test session did not start it and has no control of its process); unset {variable} "
            f"to run this test against a server the suite starts itself"
        )

    def restart(self, downtime: float = 0.0) -> None:
        pytest.skip(self.cannot("restart"))

    def stop(self) -> None:
        pytest.skip(self.cannot("stop"))

    def kill(self) -> None:
        pytest.skip(self.cannot("kill"))

    def __repr__(self) -> str:
        return f"<ExternalServer {self.kind} {self.address}>"


def skip_unless_counted_alone(kind: str, address: str) -> None:
    """Skip a test that counts every request the ``kind`` server at ``address`` handles
    when that server is the external one and other pytest-xdist workers share it: their
    requests land in the same counter. A server the session started is its worker's alone."""
    variable = ZK_ENV if kind == "zookeeper" else ETCD_ENV
    shared = external_address(variable)
    if shared is None or not set(address.split(",")) & set(shared.split(",")):
        return
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        pytest.skip(
            f"external server: this test counts every request the {kind} at {address} handles, and "
            f"the other test workers use it too ({variable} is set); run it with -n 0, or unset "
            f"{variable} so that each worker starts a server of its own"
        )
