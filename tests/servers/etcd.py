"""etcd for the tests: one server (plain, with user auth, or with TLS) or a 3-node cluster.

Invariant: a server counts as started only once a write through it succeeds (etcd answers
status before its election ends, so an open port proves nothing); each server has its own
work directory with data and log, and a restart keeps its ports and data. The root
password of an auth-enabled server never appears in an error or a log written here.
"""

from __future__ import annotations

import json
import secrets
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from tests.servers.ports import LOOPBACK, free_port
from tests.servers.process import ServerProcess, ServerStartError, run_tool, stop_together
from tests.servers.tls import TLSFiles

__all__ = ["ROOMY_TXN_OPS", "EtcdCluster", "EtcdServer", "etcd_available", "etcd_write_check"]

_PROBE_KEY = b"shardjob-test-ready"


#: operations per transaction list the suite's etcd servers take (``--max-txn-ops``; etcd's
#: default is 128), as compose's server does: the contract tests of the URL option
#: ``max_txn_ops`` need a server that takes more than the default
ROOMY_TXN_OPS = 1024


def etcd_available() -> str | None:
    """None when etcd can be started here, else what is missing."""
    for tool, package in (("etcd", "etcd-server"), ("etcdctl", "etcd-client")):
        if shutil.which(tool) is None:
            return f"no {tool!r} on PATH (apt-get install {package})"
    return None


def etcd_write_check(
    host: str,
    port: int,
    timeout: float,
    *,
    tls: TLSFiles | None = None,
    user: str | None = None,
    password: str | None = None,
) -> bool:
    """True when a put and a delete of a probe key (outside every test prefix) succeed."""
    import pyetcd

    client = None
    try:
        client = pyetcd.client(
            host=host,
            port=port,
            timeout=max(0.2, min(timeout, 5.0)),
            user=user,
            password=password,
            ca_cert=str(tls.ca) if tls else None,
            cert_key=str(tls.key) if tls else None,
            cert_cert=str(tls.cert) if tls else None,
        )
        if user is not None:
            # pyetcd attaches the token as call credentials, which grpc refuses on a
            # plaintext channel; the token also travels as metadata, which suffices
            client.call_credentials = None
        client.put(_PROBE_KEY, b"")
        client.delete(_PROBE_KEY)
        return True
    except Exception:
        return False
    finally:
        if client is not None:
            try:
                client.close()
            except Exception:
                pass


class EtcdServer(ServerProcess):
    """An etcd member process. Alone by default; ``EtcdCluster`` passes the peer list.

    ``auth=True``: after the first start, user ``root`` is created with a random password
    (``user``/``password``) and authentication is enabled. ``tls``: the client URL is
    https with mandatory client certificates (etcd 3.4 with a trusted CA requires them).
    """

    def __init__(
        self,
        workdir: Path,
        *,
        auth: bool = False,
        tls: TLSFiles | None = None,
        name: str = "n1",
        client_port: int | None = None,
        peer_port: int | None = None,
        initial_cluster: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        super().__init__(workdir, f"etcd-{name}")
        #: more etcd flags, e.g. ``--quota-backend-bytes`` for a server that fills up
        self.extra_args = tuple(extra_args)
        self.member_name = name
        self.host = LOOPBACK
        self._own_ports = client_port is None and peer_port is None and initial_cluster is None
        self.port = client_port if client_port is not None else free_port()
        self.peer_port = peer_port if peer_port is not None else free_port()
        self.initial_cluster = initial_cluster or f"{name}={self.peer_url}"
        self.initial_cluster_state = "new"
        self.tls = tls
        self.auth = auth
        self.user: str | None = "root" if auth else None
        self.password: str | None = secrets.token_urlsafe(18) if auth else None
        self._auth_enabled = False

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def client_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.address}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    def _prepare(self) -> None:
        super()._prepare()
        missing = etcd_available()
        if missing:
            raise ServerStartError(f"cannot start etcd: {missing}")

    def _take_fresh_ports(self) -> bool:
        if not self._own_ports:
            return False
        self.port, self.peer_port = free_port(), free_port()
        self.initial_cluster = f"{self.member_name}={self.peer_url}"
        # etcd binds before it writes its data dir; a half-made one would pin the old peer URL
        shutil.rmtree(self.workdir / "data", ignore_errors=True)
        return True

    def _argv(self) -> list[str]:
        argv = [
            "etcd",
            "--name", self.member_name,
            "--data-dir", str(self.workdir / "data"),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", self.peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", self.initial_cluster,
            "--initial-cluster-state", self.initial_cluster_state,
            "--initial-cluster-token", "shardjob-test",
            "--log-level", "warn",
            "--logger", "zap",
            "--max-txn-ops", str(ROOMY_TXN_OPS),
        ]  # fmt: skip
        if self.tls:
            argv += [
                "--cert-file", str(self.tls.server_cert),
                "--key-file", str(self.tls.server_key),
                "--trusted-ca-file", str(self.tls.ca),
                "--client-cert-auth",
            ]  # fmt: skip
        return argv + list(self.extra_args)

    def _check_ready(self, remaining: float) -> bool:
        if self._auth_enabled:
            return etcd_write_check(
                self.host, self.port, remaining, tls=self.tls, user=self.user, password=self.password
            )
        return etcd_write_check(self.host, self.port, remaining, tls=self.tls)

    def start(self, timeout: float | None = None) -> None:
        super().start(timeout)
        if self.auth and not self._auth_enabled:
            self._enable_auth()

    def _enable_auth(self) -> None:
        assert self.password is not None
        self.etcdctl("user", "add", "root", "--interactive=false", "--new-user-password", self.password)
        self.etcdctl("user", "grant-role", "root", "root")
        self.etcdctl("auth", "enable")
        self._auth_enabled = True

    def etcdctl(self, *args: str, endpoints: Sequence[str] | None = None, timeout: float = 10.0) -> str:
        """Run etcdctl against this server (with its TLS files and, once enabled, root's
        credentials); returns stdout, raises ``RuntimeError`` with the password masked."""
        argv = [
            "etcdctl",
            f"--endpoints={','.join(endpoints) if endpoints else self.client_url}",
            "--dial-timeout=2s",
            "--command-timeout=5s",
        ]
        if self.tls:
            argv += [f"--cacert={self.tls.ca}", f"--cert={self.tls.cert}", f"--key={self.tls.key}"]
        if self._auth_enabled:
            argv += [f"--user={self.user}:{self.password}"]
        argv += args
        result = run_tool(argv, timeout=timeout, env={"ETCDCTL_API": "3"})
        if result.returncode != 0:
            shown = " ".join(argv)
            if self.password:
                shown = shown.replace(self.password, "***")
            raise RuntimeError(f"{shown} failed ({result.returncode}): {result.stderr.strip()}")
        return result.stdout

    def __repr__(self) -> str:
        # never show the password
        return f"<EtcdServer {self.member_name} {self.client_url} {'running' if self.running else 'stopped'}>"


class EtcdCluster:
    """An etcd cluster of ``size`` members on loopback, for failover tests."""

    def __init__(self, workdir: Path, size: int = 3) -> None:
        if size < 1:
            raise ValueError("a cluster needs at least one member")
        ports = [(free_port(), free_port()) for _ in range(size)]
        initial = ",".join(f"n{i + 1}=http://{LOOPBACK}:{peer}" for i, (_, peer) in enumerate(ports))
        self.members = [
            EtcdServer(
                workdir / f"etcd{i + 1}",
                name=f"n{i + 1}",
                client_port=client,
                peer_port=peer,
                initial_cluster=initial,
            )
            for i, (client, peer) in enumerate(ports)
        ]

    @property
    def address(self) -> str:
        return ",".join(member.address for member in self.members)

    def start(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        try:
            # every member must be up before any of them can elect a leader
            for member in self.members:
                member.launch()
            for member in self.members:
                member.wait_ready(max(0.1, deadline - time.monotonic()))
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        # A stopping leader first hands leadership to a connected follower, and waits ~7 s
        # for it if that follower is stopping too; with no follower left it skips that.
        leader = self._leader_now()
        followers = [m for i, m in enumerate(self.members) if i != leader]
        stop_together(followers)
        stop_together(self.members)

    def leader_index(self, timeout: float = 30.0) -> int:
        """Index into ``members`` of the current leader (waits for an election to end)."""
        deadline = time.monotonic() + timeout
        while True:
            index = self._leader_now()
            if index is not None:
                return index
            if time.monotonic() >= deadline:
                raise AssertionError(f"no etcd leader among {self.address} after {timeout:g}s")
            time.sleep(0.05)

    def _leader_now(self) -> int | None:
        live = [m for m in self.members if m.running]
        if not live:
            return None
        try:
            out = live[0].etcdctl(
                "endpoint", "status", "-w", "json", endpoints=[m.client_url for m in live], timeout=5.0
            )
            statuses = json.loads(out)
        except (RuntimeError, ValueError):
            return None
        ids = {}
        leader = None
        for entry in statuses:
            status = entry.get("Status", {})
            ids[status.get("header", {}).get("member_id")] = entry.get("Endpoint")
            leader = status.get("leader") or leader
        endpoint = ids.get(leader)
        for index, member in enumerate(self.members):
            if member.running and member.client_url == endpoint:
                return index
        return None

    def kill_member(self, index: int) -> None:
        self.members[index].kill()

    def stop_member(self, index: int) -> None:
        self.members[index].stop()

    def start_member(self, index: int, timeout: float = 30.0) -> None:
        """Start a stopped member again; it rejoins with its data (cluster state existing)."""
        member = self.members[index]
        member.initial_cluster_state = "existing"
        member.start(timeout)

    def __repr__(self) -> str:
        return f"<EtcdCluster {self.address}>"
