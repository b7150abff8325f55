"""The URL option ``max_txn_ops`` on etcd: a client that asks for more ops per transaction
than the server's ``--max-txn-ops`` is refused on connecting, with an error that names the
server flag and the option, instead of every shared transaction of its group commit
failing later; one the server takes connects and uses it."""

from __future__ import annotations

import pytest

import registry
from registry.errors import RegistryError
from tests.servers.etcd import ROOMY_TXN_OPS, EtcdServer
from tests.servers.external import ExternalServer


def _url(server: EtcdServer | ExternalServer, ops: int) -> str:
    return f"etcd://{server.address}/txn-room?max_txn_ops={ops}"


def test_more_ops_than_the_server_takes_are_refused_on_connecting(etcd_server: EtcdServer | ExternalServer) -> None:
    with registry.connect(f"etcd://{etcd_server.address}/txn-room") as writer:
        writer.put("/kept", b"v")
    too_many = 2 * ROOMY_TXN_OPS
    with pytest.raises(RegistryError, match=f"--max-txn-ops {too_many} .*max_txn_ops"):
        registry.connect(_url(etcd_server, too_many))
    with registry.connect(_url(etcd_server, ROOMY_TXN_OPS)) as roomy:
        assert roomy.max_txn_ops == ROOMY_TXN_OPS
        assert roomy.get("/kept") == b"v"  # refusing the client touched nothing stored
