"""The test infrastructure itself: the severable proxy, bounded waits, certificates, and
the server launchers' promises (ready means writable; restart keeps port and data;
a killed cluster member is replaced by a new leader and rejoins; a server whose picked
port was taken first serves on another, and one that exits says why).

These use the raw clients (kazoo, pyetcd), not the registry backends, so a fault in a
backend cannot hide a fault in the tools that test it.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import need_local
from tests.servers.etcd import EtcdCluster, EtcdServer, etcd_available, etcd_write_check
from tests.servers.external import ExternalServer
from tests.servers.ports import LOOPBACK, free_port, free_ports
from tests.servers.process import ServerExitedError, run_tool
from tests.servers.proxy import TCPProxy
from tests.servers.tls import TLSFiles
from tests.servers.zookeeper import (
    ZooKeeperEnsemble,
    ZooKeeperServer,
    zookeeper_available,
    zookeeper_write_check,
)
from tests.waiting import wait_for


# -- free ports ----------------------------------------------------------------------------
@pytest.mark.parametrize(("worker", "count"), [("gw0", "2"), ("gw1", "2"), ("gw2", "3")])
def test_each_test_worker_is_handed_ports_no_other_worker_is(
    monkeypatch: pytest.MonkeyPatch, worker: str, count: str
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", count)
    ports = free_ports(20)
    assert len(set(ports)) == 20
    assert {(port >> 1) % int(count) for port in ports} == {int(worker[2:])}


def test_outside_test_workers_any_free_port_is_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    ports = [free_port() for _ in range(40)]
    assert len(set(ports)) == 40
    assert {(port >> 1) % 2 for port in ports} == {0, 1}  # neither worker's share kept out (2^-39 by chance)


# -- wait_for ------------------------------------------------------------------------------
def test_wait_for_returns_the_truthy_value() -> None:
    calls = iter([0, None, "done"])
    assert wait_for(lambda: next(calls), timeout=5, interval=0.001) == "done"


def test_wait_for_raises_with_the_message() -> None:
    with pytest.raises(AssertionError, match=r"timed out after 0\.05s: never true"):
        wait_for(lambda: False, timeout=0.05, message="never true")
    with pytest.raises(AssertionError, match="state 7"):
        wait_for(lambda: False, timeout=0.01, message=lambda: "state 7")


# -- proxy --------------------------------------------------------------------------------
@pytest.fixture
def echo_server() -> Iterator[tuple[str, int]]:
    listener = socket.create_server(("127.0.0.1", 0))

    def serve(conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(4096):
                    conn.sendall(data)
            except OSError:
                pass

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield listener.getsockname()[:2]
    listener.close()


def _echo(proxy: TCPProxy, payload: bytes) -> bytes:
    with socket.create_connection((proxy.host, proxy.port), timeout=5) as conn:
        conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := conn.recv(65536):
            received += chunk
        return received


def test_proxy_forwards_cuts_and_restores(echo_server: tuple[str, int]) -> None:
    with TCPProxy(*echo_server) as proxy:
        big = bytes(range(256)) * 4096  # 1 MiB: forwarding is byte-exact in both directions
        assert _echo(proxy, big) == big

        held = socket.create_connection((proxy.host, proxy.port), timeout=5)
        held.sendall(b"ping")
        assert held.recv(4) == b"ping"
        proxy.cut()
        # the open connection is reset, not merely idle
        with pytest.raises(OSError):
            held.sendall(b"x")
            if not held.recv(1):
                raise ConnectionResetError("closed")
        held.close()
        # new connections are refused while cut
        with pytest.raises(OSError):
            _echo(proxy, b"while cut")
        assert proxy.live_connections == 0

        proxy.restore()
        assert _echo(proxy, b"back") == b"back"
        wait_for(lambda: proxy.live_connections == 0, timeout=5, message="finished connection not released")


def test_a_stalled_proxy_accepts_and_never_answers_until_closed(echo_server: tuple[str, int]) -> None:
    with TCPProxy(*echo_server) as proxy:
        held = socket.create_connection((proxy.host, proxy.port), timeout=5)
        held.sendall(b"ping")
        assert held.recv(4) == b"ping"
        proxy.stall()
        with pytest.raises(OSError):  # the open connection is reset, as by cut()
            held.sendall(b"x")
            if not held.recv(1):
                raise ConnectionResetError("closed")
        held.close()
        silent = socket.create_connection((proxy.host, proxy.port), timeout=5)  # accepted
        silent.sendall(b"anyone?")
        wait_for(lambda: proxy.stalled == 1, timeout=5, message="the connection was not held")
        silent.settimeout(0.3)
        with pytest.raises(TimeoutError):
            silent.recv(1)
        proxy.restore()
        assert _echo(proxy, b"back") == b"back"  # new connections are forwarded again
        with pytest.raises(TimeoutError):
            silent.recv(1)  # the stalled one stays silent
    silent.settimeout(5)
    with pytest.raises(ConnectionResetError):
        silent.recv(1)  # until close() resets it
    silent.close()


def test_proxy_close_stops_its_threads(echo_server: tuple[str, int]) -> None:
    before = threading.active_count()
    proxy = TCPProxy(*echo_server)
    conn = socket.create_connection((proxy.host, proxy.port), timeout=5)
    conn.sendall(b"x")
    assert conn.recv(1) == b"x"
    proxy.close()
    conn.close()
    wait_for(lambda: threading.active_count() <= before, timeout=5, message="proxy threads left running")


# -- TLS files ----------------------------------------------------------------------------
def test_tls_files_chain_and_names(tls_files: TLSFiles) -> None:
    for cert in (tls_files.server_cert, tls_files.cert):
        verify = run_tool(["openssl", "verify", "-CAfile", str(tls_files.ca), str(cert)], timeout=10)
        assert verify.returncode == 0, verify.stderr
    text = run_tool(
        ["openssl", "x509", "-in", str(tls_files.server_cert), "-noout", "-text"], timeout=10
    ).stdout
    assert "IP Address:127.0.0.1" in text and "DNS:localhost" in text


# -- servers ------------------------------------------------------------------------------
def test_zookeeper_restart_keeps_port_and_data(zk_server: ZooKeeperServer | ExternalServer) -> None:
    from kazoo.client import KazooClient

    client = KazooClient(hosts=zk_server.address, timeout=10)
    client.start(timeout=10)
    try:
        path = f"/infra-{id(client):x}"
        client.create(path, b"kept")
        address = zk_server.address
        zk_server.restart(downtime=0.2)  # skips on an external server
        assert zk_server.address == address
        # the same client reconnects: same port, same session, same data
        assert wait_for(lambda: client.connected, timeout=15, message="kazoo did not reconnect")
        assert client.get(path)[0] == b"kept"
        client.delete(path)
    finally:
        client.stop()
        client.close()


def test_etcd_restart_keeps_port_and_data(etcd_server: EtcdServer | ExternalServer) -> None:
    if isinstance(etcd_server, ExternalServer):
        pytest.skip(etcd_server.cannot("restart"))
    etcd_server.etcdctl("put", "infra-key", "kept")
    etcd_server.restart(downtime=0.2)
    assert etcd_server.etcdctl("get", "infra-key", "--print-value-only").strip() == "kept"
    etcd_server.etcdctl("del", "infra-key")


def test_etcd_auth_server_refuses_anonymous(etcd_auth_server: EtcdServer) -> None:
    server = etcd_auth_server
    assert server.user == "root" and server.password
    assert server.password not in repr(server)
    assert etcd_write_check(server.host, server.port, 5, user=server.user, password=server.password)
    assert not etcd_write_check(server.host, server.port, 2)
    assert not etcd_write_check(server.host, server.port, 2, user=server.user, password="wrong")


def test_etcd_tls_server_needs_client_certificate(etcd_tls_server: EtcdServer) -> None:
    server = etcd_tls_server
    assert server.tls is not None and server.client_url.startswith("https://")
    assert etcd_write_check(server.host, server.port, 5, tls=server.tls)
    assert not etcd_write_check(server.host, server.port, 2)


@pytest.mark.cluster
def test_zookeeper_ensemble_survives_leader_kill(zk_ensemble: ZooKeeperEnsemble) -> None:
    leader = zk_ensemble.leader_index()
    zk_ensemble.kill_member(leader)
    try:
        assert zk_ensemble.leader_index() != leader
        assert zookeeper_write_check(zk_ensemble.address, 10.0)
    finally:
        zk_ensemble.start_member(leader)
    assert zk_ensemble.members[leader].mode() in ("leader", "follower")


@pytest.mark.cluster
def test_etcd_cluster_survives_leader_kill(etcd_cluster: EtcdCluster) -> None:
    leader = etcd_cluster.leader_index()
    etcd_cluster.kill_member(leader)
    try:
        assert etcd_cluster.leader_index() != leader
        survivor = next(m for m in etcd_cluster.members if m.running)
        assert wait_for(
            lambda: etcd_write_check(survivor.host, survivor.port, 2.0), timeout=15, message="no writes"
        )
    finally:
        etcd_cluster.start_member(leader)
    member = etcd_cluster.members[leader]
    assert etcd_write_check(member.host, member.port, 5.0)


# -- a picked port taken before the server binds it ----------------------------------------
@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port something else listens on, as when another process took the port
    ``free_port`` picked in the second before the server bound it."""
    listener = socket.create_server((LOOPBACK, 0))
    yield listener.getsockname()[1]
    listener.close()


@pytest.mark.parametrize("backend", ["zookeeper", "etcd"])
def test_a_server_whose_picked_port_is_taken_serves_on_a_fresh_one(
    tmp_path: Path, taken_port: int, backend: str
) -> None:
    server: ZooKeeperServer | EtcdServer
    if backend == "zookeeper":
        need_local(zookeeper_available())
        server = ZooKeeperServer(tmp_path / "zk")
    else:
        need_local(etcd_available())
        server = EtcdServer(tmp_path / "etcd")
    server.port = taken_port
    try:
        server.start()
        assert server.port != taken_port
        if isinstance(server, ZooKeeperServer):
            assert zookeeper_write_check(server.address, 5.0)
        else:
            assert etcd_write_check(server.host, server.port, 5.0)
    finally:
        server.stop()


def test_a_zookeeper_given_a_taken_port_says_why_it_exited(tmp_path: Path, taken_port: int) -> None:
    need_local(zookeeper_available())
    server = ZooKeeperServer(tmp_path / "zk", client_port=taken_port)
    with pytest.raises(ServerExitedError, match=r"(?i)address already in use") as raised:
        server.start()
    # ZooKeeper says so only in its own log4j file, not on its stdout
    assert "zookeeper-server.log" in str(raised.value)
    assert server.port == taken_port
