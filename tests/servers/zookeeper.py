"""ZooKeeper for the tests: one server, or a 3-node ensemble, from the Debian package.

Invariant: a server counts as started only once it answers ``ruok`` with ``imok`` *and* a
client write succeeds through it (for an ensemble member: once it has joined a quorum as
leader or follower); each server has its own work directory with config, data and log,
and a restart keeps its port and its data (so sessions and persistent nodes survive).
Settings: tickTime 1000 ms, so the shortest session the server grants is 2 s (twice the
tick), which keeps session-expiry tests fast.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from tests.servers.external import skip_unless_counted_alone
from tests.servers.ports import LOOPBACK, free_port
from tests.servers.process import ServerProcess, ServerStartError, stop_together

__all__ = [
    "TICK_MS",
    "ZOOKEEPER_JAR",
    "ZooKeeperEnsemble",
    "ZooKeeperServer",
    "four_letter",
    "zookeeper_available",
    "zookeeper_write_check",
]

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
# Debian's zookeeper.jar lists its other jars in its manifest, but not a logging backend:
# without these two the server logs nothing at all.
_LOG_JARS = (Path("/usr/share/java/slf4j-log4j12.jar"), Path("/usr/share/java/log4j-1.2.jar"))
TICK_MS = 1000
_FOUR_LETTER_WORDS = "ruok,stat,srvr,mntr,conf,isro,cons"


def zookeeper_available() -> str | None:
    """None when ZooKeeper can be started here, else what is missing."""
    if shutil.which("java") is None:
        return "no 'java' on PATH (apt-get install default-jre-headless)"
    if not ZOOKEEPER_JAR.exists():
        return f"{ZOOKEEPER_JAR} is missing (apt-get install zookeeper)"
    return None


def four_letter(host: str, port: int, word: str, timeout: float = 2.0) -> str:
    """Send a four-letter command; '' when the server is not reachable."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(word.encode("ascii"))
            sock.shutdown(socket.SHUT_WR)
            chunks: list[bytes] = []
            while True:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                chunks.append(chunk)
    except OSError:
        return ""
    return b"".join(chunks).decode("utf-8", "replace")


def packets_received(address: str) -> int:
    """The server's count of requests received (``mntr``'s ``zk_packets_received``): every
    client's, so a test that counts is skipped on an external server other workers share."""
    skip_unless_counted_alone("zookeeper", address)
    host, _, port = address.rpartition(":")
    for line in four_letter(host, int(port), "mntr").splitlines():
        name, _, value = line.partition("\t")
        if name == "zk_packets_received":
            return int(value)
    raise AssertionError(f"mntr of {address} gave no zk_packets_received")


def zookeeper_write_check(hosts: str, timeout: float) -> bool:
    """True when a client can open a session on ``hosts`` and write through it.

    The probe node is ephemeral and sits outside every test namespace, so it vanishes
    with the probe's session and no test ever sees it.
    """
    from kazoo.client import KazooClient

    client = KazooClient(hosts=hosts, timeout=max(2.0, min(timeout, 10.0)))
    try:
        client.start(timeout=max(0.1, timeout))
        client.create(f"/.shardjob-ready-{uuid.uuid4().hex}", b"", ephemeral=True)
        return True
    except Exception:
        return False
    finally:
        try:
            client.stop()
            client.close()
        except Exception:
            pass


@dataclass(frozen=True)
class QuorumPeer:
    myid: int
    quorum_port: int
    election_port: int

    def line(self) -> str:
        return f"server.{self.myid}={LOOPBACK}:{self.quorum_port}:{self.election_port}"


#: the test session's server heap: enough for the suite's few hundred nodes, small beside
#: the other servers it runs at once
TEST_HEAP = "256m"
#: ZooKeeper's own default (``ZK_SERVER_HEAP`` in ``zkEnv.sh``): what benchmarks run, since
#: 10,000 jobs (130,000 nodes and twice as many watches) outgrow the test heap
DEFAULT_HEAP = "1000m"


class ZooKeeperServer(ServerProcess):
    """A ZooKeeper server process; standalone unless given ``peers`` (ensemble member)."""

    def __init__(
        self,
        workdir: Path,
        *,
        client_port: int | None = None,
        myid: int | None = None,
        peers: tuple[QuorumPeer, ...] = (),
        heap: str = TEST_HEAP,
    ) -> None:
        super().__init__(workdir, f"zookeeper{myid or ''}")
        self.host = LOOPBACK
        self._own_port = client_port is None
        self.port = client_port if client_port is not None else free_port()
        self.myid = myid
        self.peers = peers
        self.heap = heap

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def ensemble_member(self) -> bool:
        return bool(self.peers)

    def _prepare(self) -> None:
        super()._prepare()
        missing = zookeeper_available()
        if missing:
            raise ServerStartError(f"cannot start ZooKeeper: {missing}")
        data = self.workdir / "data"
        data.mkdir(exist_ok=True)
        lines = [
            f"tickTime={TICK_MS}",
            "initLimit=10",
            "syncLimit=5",
            f"dataDir={data}",
            f"clientPort={self.port}",
            f"clientPortAddress={self.host}",
            "maxClientCnxns=0",
            "admin.enableServer=false",
            f"4lw.commands.whitelist={_FOUR_LETTER_WORDS}",
            f"minSessionTimeout={2 * TICK_MS}",
            "maxSessionTimeout=60000",
        ]
        if self.peers:
            assert self.myid is not None
            (data / "myid").write_text(f"{self.myid}\n")
            lines += [peer.line() for peer in self.peers]
        (self.workdir / "zoo.cfg").write_text("\n".join(lines) + "\n")
        (self.workdir / "log4j.properties").write_text(
            "log4j.rootLogger=INFO, FILE\n"
            "log4j.appender.FILE=org.apache.log4j.FileAppender\n"
            f"log4j.appender.FILE.File={self._server_log}\n"
            "log4j.appender.FILE.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.FILE.layout.ConversionPattern=%d{ISO8601} [myid:%X{myid}] %-5p [%t:%C{1}@%L] - %m%n\n"
        )

    @property
    def _server_log(self) -> Path:
        """log4j's file: where ZooKeeper says why it stopped (its stdout says nothing)."""
        return self.workdir / "zookeeper-server.log"

    def _logs(self) -> list[Path]:
        return [*super()._logs(), self._server_log]

    def _take_fresh_ports(self) -> bool:
        if not self._own_port or self.peers:
            return False
        self.port = free_port()
        return True

    def _argv(self) -> list[str]:
        classpath = os.pathsep.join([str(self.workdir), str(ZOOKEEPER_JAR), *(str(j) for j in _LOG_JARS)])
        return [
            "java",
            f"-Xmx{self.heap}",
            "-XX:+UseSerialGC",
            f"-Dlog4j.configuration=file:{self.workdir / 'log4j.properties'}",
            "-cp",
            classpath,
            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            str(self.workdir / "zoo.cfg"),
        ]

    def mode(self) -> str | None:
        """'standalone', 'leader', 'follower', or None when not serving."""
        for line in four_letter(self.host, self.port, "srvr", timeout=1.0).splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return None

    def _check_ready(self, remaining: float) -> bool:
        if four_letter(self.host, self.port, "ruok", timeout=min(1.0, remaining)) != "imok":
            return False
        if self.peers:
            # a member serves once it has joined a quorum; writes are checked by the ensemble
            return self.mode() in ("leader", "follower")
        return zookeeper_write_check(self.address, min(remaining, 5.0))


class ZooKeeperEnsemble:
    """A ZooKeeper ensemble of ``size`` members on loopback, for failover tests."""

    def __init__(self, workdir: Path, size: int = 3) -> None:
        if size < 1:
            raise ValueError("an ensemble needs at least one member")
        peers = tuple(QuorumPeer(i + 1, free_port(), free_port()) for i in range(size))
        self.members = [ZooKeeperServer(workdir / f"zk{i + 1}", myid=i + 1, peers=peers) for i in range(size)]

    @property
    def address(self) -> str:
        return ",".join(member.address for member in self.members)

    def start(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        try:
            for member in self.members:
                member.launch()
            for member in self.members:
                member.wait_ready(max(0.1, deadline - time.monotonic()))
            self._wait_writable(deadline)
        except BaseException:
            self.stop()
            raise

    def _wait_writable(self, deadline: float) -> None:
        while not zookeeper_write_check(self.address, max(0.1, min(5.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                raise ServerStartError(f"ZooKeeper ensemble {self.address} takes no writes")
            time.sleep(0.05)

    def stop(self) -> None:
        stop_together(self.members)

    def leader_index(self, timeout: float = 30.0) -> int:
        """Index into ``members`` of the current leader (waits for an election to end)."""
        deadline = time.monotonic() + timeout
        while True:
            for index, member in enumerate(self.members):
                if member.running and member.mode() == "leader":
                    return index
            if time.monotonic() >= deadline:
                raise AssertionError(f"no ZooKeeper leader among {self.address} after {timeout:g}s")
            time.sleep(0.05)

    def kill_member(self, index: int) -> None:
        self.members[index].kill()

    def stop_member(self, index: int) -> None:
        self.members[index].stop()

    def start_member(self, index: int, timeout: float = 30.0) -> None:
        """Start a stopped member and wait until it has rejoined the quorum."""
        self.members[index].start(timeout)

    def __repr__(self) -> str:
        return f"<ZooKeeperEnsemble {self.address}>"
