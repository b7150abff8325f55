"""Requests counted at the server, not at our protocol: a claim about round trips is a claim
about the wire.

- ZooKeeper: ``zk_packets_received`` of the ``mntr`` four-letter word (every request a
  client sent, pings included; the test servers allow ``mntr``).
- etcd: the sum of ``grpc_server_msg_received_total`` on ``/metrics`` (every message a
  client sent: unary requests, and each message on a stream — lease keep-alives, watch
  creations), with the KV service's share beside it.

Counters are read before and after a window; their difference over the window's length
is the rate the benchmarks report. Other clients of the same server count too, so a
benchmark reads them while it is the server's only user.
"""

from __future__ import annotations

import re
import socket
import urllib.request
from dataclasses import dataclass

__all__ = ["ServerCount", "read_count"]

_ETCD_MSG = re.compile(r'^grpc_server_msg_received_total\{([^}]*)\}\s+([0-9.e+]+)$', re.MULTILINE)


@dataclass(frozen=True)
class ServerCount:
    """Requests the server had received when read; ``kv``: etcd's KV service share."""

    requests: int
    kv: int | None = None

    def __sub__(self, earlier: ServerCount) -> ServerCount:
        kv = None if self.kv is None or earlier.kv is None else self.kv - earlier.kv
        return ServerCount(self.requests - earlier.requests, kv)


def read_count(backend: str, address: str) -> ServerCount:
    """The server's request count now; ``address`` is one ``host:port``."""
    host, _, port = address.split(",")[0].strip().rpartition(":")
    if backend == "zookeeper":
        return ServerCount(_zookeeper_packets(host, int(port)))
    if backend == "etcd":
        return _etcd_messages(host, int(port))
    raise ValueError(f"no server counters for backend {backend!r}")


def _zookeeper_packets(host: str, port: int) -> int:
    with socket.create_connection((host, port), timeout=5) as conn:
        conn.sendall(b"mntr")
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    for line in data.decode(errors="replace").splitlines():
        name, _, value = line.partition("\t")
        if name == "zk_packets_received":
            return int(value)
    raise RuntimeError(f"ZooKeeper at {host}:{port} answered mntr without zk_packets_received: {data[:200]!r}")


def _etcd_messages(host: str, port: int) -> ServerCount:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    total = kv = 0.0
    for labels, value in _ETCD_MSG.findall(text):
        total += float(value)
        if 'grpc_service="etcdserverpb.KV"' in labels:
            kv += float(value)
    return ServerCount(int(total), int(kv))
