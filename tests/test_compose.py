"""The compose files agree with the fixtures: same variable names, reachable host:port
values, ports published where the docs say, ZooKeeper's tick as the harnesses assume.

No Docker engine is needed: the files are parsed and cross-checked, so a rename on
either side fails here instead of in a container.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import conftest
from tests.harnesses.common import ServerHarness
from tests.servers.env import ETCD_ENV, ZK_ENV, parse_hosts
from tests.servers.zookeeper import TICK_MS

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "compose"
SINGLE = COMPOSE / "docker-compose.yml"
CLUSTER = COMPOSE / "docker-compose.cluster.yml"

ZK_PORT = 2181
ETCD_PORT = 2379


def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict) and isinstance(data.get("services"), dict), f"{path.name}: no services"
    services: dict[str, Any] = data["services"]
    return services


def _published(service: dict[str, Any]) -> dict[int, int]:
    """container port -> host port, from short-syntax ``"HOST:CONTAINER"`` entries."""
    out: dict[int, int] = {}
    for entry in service.get("ports", []):
        host, _, container = str(entry).rpartition(":")
        out.setdefault(int(container), int(host))
    return out


def _flag(service: dict[str, Any], name: str) -> str:
    for arg in service.get("command", []):
        if str(arg).startswith(f"--{name}="):
            return str(arg).split("=", 1)[1]
    raise AssertionError(f"etcd service has no --{name}= flag")


def _listen_port(service: dict[str, Any], kind: str) -> int:
    """The container port a server service listens on for clients."""
    if kind == "zookeeper":
        return ZK_PORT
    url = _flag(service, "listen-client-urls")
    return int(url.rsplit(":", 1)[1])


def _check_tests_service(services: dict[str, Any], zk_kind: str, etcd_kind: str) -> None:
    tests = services["tests"]
    assert tests["build"]["dockerfile"] == "compose/Dockerfile"
    assert (COMPOSE / tests["build"]["context"] / tests["build"]["dockerfile"]).resolve() == (
        COMPOSE / "Dockerfile"
    ).resolve()
    command = tests["command"]
    assert command[0] == "pytest" and "tests/contract" in command
    env = tests["environment"]
    assert set(env) == {ZK_ENV, ETCD_ENV}, "the tests service must set exactly the variables conftest reads"
    depends = set(tests["depends_on"])
    for variable, kind in ((ZK_ENV, zk_kind), (ETCD_ENV, etcd_kind)):
        hosts = parse_hosts(env[variable])
        for host, port in hosts:
            assert host in services, f"{variable} names {host!r}, which is not a service"
            assert host in depends, f"tests does not depend on {host!r}"
            assert port == _listen_port(services[host], kind), f"{variable}: {host} listens elsewhere"


def _check_zookeeper(service: dict[str, Any]) -> None:
    assert str(service["image"]).startswith("zookeeper:3.8")
    env = service["environment"]
    # the harnesses' min_session_timeout (2 s) is 2 x tickTime on the server side
    assert int(env["ZOO_TICK_TIME"]) == TICK_MS
    assert ServerHarness.min_session_timeout == 2 * TICK_MS / 1000
    assert f"minSessionTimeout={2 * TICK_MS}" in env["ZOO_CFG_EXTRA"].split()
    assert "ruok" in env["ZOO_4LW_COMMANDS_WHITELIST"].split(",")
    # every fire writes: without a purge, snapshots and transaction logs fill the disk
    assert int(env["ZOO_AUTOPURGE_PURGEINTERVAL"]) >= 1
    assert int(env["ZOO_AUTOPURGE_SNAPRETAINCOUNT"]) >= 3


def _check_etcd(service: dict[str, Any]) -> None:
    assert service["image"] == "quay.io/coreos/etcd:v3.4.23"
    # every fire writes: without compaction the history reaches the space quota, and
    # etcd then refuses every write (tests/registry/test_etcd_space.py)
    assert _flag(service, "auto-compaction-mode") == "periodic"
    assert _flag(service, "auto-compaction-retention") not in ("", "0")


def test_conftest_reads_the_variables_named_in_env_module() -> None:
    assert (conftest.ZK_ENV, conftest.ETCD_ENV) == (ZK_ENV, ETCD_ENV)
    assert conftest.BACKENDS == ("memory", "zookeeper", "etcd")


def test_single_server_file() -> None:
    services = _load(SINGLE)
    assert {"zookeeper", "etcd", "tests"} <= set(services)
    _check_zookeeper(services["zookeeper"])
    assert _published(services["zookeeper"]) == {ZK_PORT: ZK_PORT}
    _check_etcd(services["etcd"])
    assert _published(services["etcd"]) == {ETCD_PORT: ETCD_PORT}
    assert _flag(services["etcd"], "advertise-client-urls") == f"http://etcd:{ETCD_PORT}"
    _check_tests_service(services, "zookeeper", "etcd")
    assert parse_hosts(services["tests"]["environment"][ZK_ENV]) == [("zookeeper", ZK_PORT)]
    assert parse_hosts(services["tests"]["environment"][ETCD_ENV]) == [("etcd", ETCD_PORT)]


def test_cluster_file() -> None:
    services = _load(CLUSTER)
    zk = [f"zk{i}" for i in (1, 2, 3)]
    etcd = [f"etcd{i}" for i in (1, 2, 3)]
    assert set(zk + etcd + ["tests"]) <= set(services)

    servers_line = services["zk1"]["environment"]["ZOO_SERVERS"].split()
    for index, name in enumerate(zk, start=1):
        service = services[name]
        _check_zookeeper(service)
        assert service["environment"]["ZOO_MY_ID"] == str(index)
        assert f"server.{index}={name}:2888:3888;{ZK_PORT}" in servers_line
        assert service["environment"]["ZOO_SERVERS"].split() == servers_line
    initial = {
        entry.split("=", 1)[0]: entry.split("=", 1)[1]
        for entry in _flag(services["etcd1"], "initial-cluster").split(",")
    }
    assert initial == {name: f"http://{name}:2380" for name in etcd}
    for name in etcd:
        service = services[name]
        _check_etcd(service)
        assert _flag(service, "name") == name
        assert _flag(service, "advertise-client-urls") == f"http://{name}:{ETCD_PORT}"
        assert _flag(service, "initial-cluster") == _flag(services["etcd1"], "initial-cluster")

    host_ports = [port for name in zk + etcd for port in _published(services[name]).values()]
    assert len(host_ports) == len(set(host_ports)) == 6, "each member needs its own host port"
    _check_tests_service(services, "zookeeper", "etcd")
    assert [h for h, _ in parse_hosts(services["tests"]["environment"][ZK_ENV])] == zk
    assert [h for h, _ in parse_hosts(services["tests"]["environment"][ETCD_ENV])] == etcd


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("zookeeper:2181", [("zookeeper", 2181)]),
        ("a:1, b:2", [("a", 1), ("b", 2)]),
    ],
)
def test_parse_hosts(value: str, expected: list[tuple[str, int]]) -> None:
    assert parse_hosts(value) == expected


@pytest.mark.parametrize("value", ["", "zookeeper", "zk:", "zk:0", "zk:70000", ":2181", "a:1,,b:2"])
def test_parse_hosts_rejects(value: str) -> None:
    with pytest.raises(ValueError, match="host:port"):
        parse_hosts(value)
