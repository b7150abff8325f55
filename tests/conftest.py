"""Shared fixtures: real servers (started lazily, once per session), the per-backend
``harness`` the contract suite is parametrised over, and a connected ``reg``.

Invariants:
- a server starts only when a test asks for it (the ``memory`` harness never starts one),
  in its own temporary directory, and is stopped at session end even on failure;
- ``SHARDJOB_TEST_ZK`` / ``SHARDJOB_TEST_ETCD`` (``host:port[,host:port...]``, names in
  ``tests/servers/env.py``) replace the local ZooKeeper / etcd with running servers; faults
  that need process control then skip, saying which server, why and how to run them, and
  so do the tests that count every request a server handles while other xdist workers
  share it;
- everything a harness handed out (clients, links, participants) is closed at teardown.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from registry.backends.base import BaseRegistry
from scheduler import Cluster, Scheduler
from tests.harness import Harness
from tests.servers.env import ETCD_ENV, ZK_ENV, external_address
from tests.servers.etcd import EtcdCluster, EtcdServer, etcd_available
from tests.servers.external import ExternalServer
from tests.servers.postgres import PG_ENV, PostgresServer, fresh_database, postgres_available
from tests.servers.process import stop_all
from tests.servers.tls import TLSFiles, make_tls_files
from tests.servers.zookeeper import ZooKeeperEnsemble, ZooKeeperServer, zookeeper_available

__all__ = ["BACKENDS", "ETCD_ENV", "ZK_ENV"]

#: the chaos table's hooks, here so that pytest-xdist's controller loads them too
pytest_plugins = ["tests.scenarios.chaos_report"]

#: the ids of the ``harness`` fixture's parameters
BACKENDS = ("memory", "zookeeper", "etcd")


def need_local(missing: str | None) -> None:
    """Fail loudly when a local server cannot be started (scripts/test installs them), but
    skip in a runner pointed at external servers (compose), which need not have them."""
    if missing is None:
        return
    if external_address(ZK_ENV) or external_address(ETCD_ENV):
        pytest.skip(f"needs a local server and {missing}")
    pytest.fail(f"cannot start a local server: {missing}; run ./scripts/test to install it", pytrace=False)


def _workdir(factory: pytest.TempPathFactory, name: str) -> Path:
    return factory.mktemp(name, numbered=True)


# -- servers (session-scoped, lazy) -------------------------------------------------------
@pytest.fixture(scope="session")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer | ExternalServer]:
    """One ZooKeeper server; the external one when ``SHARDJOB_TEST_ZK`` is set."""
    address = external_address(ZK_ENV)
    if address:
        external = ExternalServer(address, "zookeeper")
        external.wait_ready()
        yield external
        return
    need_local(zookeeper_available())
    server = ZooKeeperServer(_workdir(tmp_path_factory, "zookeeper"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer | ExternalServer]:
    """One etcd server; the external one when ``SHARDJOB_TEST_ETCD`` is set."""
    address = external_address(ETCD_ENV)
    if address:
        external = ExternalServer(address, "etcd")
        external.wait_ready()
        yield external
        return
    need_local(etcd_available())
    server = EtcdServer(_workdir(tmp_path_factory, "etcd"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def zk_ensemble(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperEnsemble]:
    """A local 3-node ZooKeeper ensemble (always local: tests kill its members)."""
    need_local(zookeeper_available())
    ensemble = ZooKeeperEnsemble(_workdir(tmp_path_factory, "zk-ensemble"), size=3)
    try:
        ensemble.start()
        yield ensemble
    finally:
        ensemble.stop()


@pytest.fixture(scope="session")
def etcd_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """A local 3-node etcd cluster (always local: tests kill its members)."""
    need_local(etcd_available())
    cluster = EtcdCluster(_workdir(tmp_path_factory, "etcd-cluster"), size=3)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate."""
    try:
        return make_tls_files(_workdir(tmp_path_factory, "tls"))
    except RuntimeError as exc:
        need_local(str(exc))
        raise


@pytest.fixture(scope="session")
def etcd_auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """A local etcd with authentication on: ``.user`` (root) and ``.password``."""
    need_local(etcd_available())
    server = EtcdServer(_workdir(tmp_path_factory, "etcd-auth"), auth=True)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def etcd_tls_server(tmp_path_factory: pytest.TempPathFactory, tls_files: TLSFiles) -> Iterator[EtcdServer]:
    """A local etcd serving https with mandatory client certificates; ``.tls`` holds the
    ``TLSFiles`` (``ca``, client ``cert`` and ``key``)."""
    need_local(etcd_available())
    server = EtcdServer(_workdir(tmp_path_factory, "etcd-tls"), tls=tls_files)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer | str]:
    """One PostgreSQL server (Debian's, run as the postgres user); the URL of a running one
    when ``SHARDJOB_TEST_PG`` holds ``postgresql://user:password@host:port/db``."""
    import os

    external = os.environ.get(PG_ENV, "").strip()
    if external:
        yield external
        return
    need_local(postgres_available())
    server = PostgresServer(_workdir(tmp_path_factory, "postgres"))
    try:
        server.start()
        yield server
    finally:
        server.stop()
        server.remove()


@pytest.fixture
def pg_url(pg_server: PostgresServer | str) -> str:
    """A fresh, empty database on the session's PostgreSQL."""
    return fresh_database(pg_server if isinstance(pg_server, str) else pg_server.url)


@pytest.fixture(params=["sqlite", "postgresql"])
def history_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh history database: an SQLite file, or a database on the test PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'history.db'}"
    url: str = request.getfixturevalue("pg_url")
    return url


# -- harnesses ---------------------------------------------------------------------------
def make_harness(backend: str, request: pytest.FixtureRequest) -> Harness:
    """The harness for ``backend``; servers are fetched only for the backend that needs one."""
    if backend == "memory":
        from tests.harnesses.memory import MemoryHarness

        return MemoryHarness()
    if backend == "zookeeper":
        from tests.harnesses.zookeeper import ZooKeeperHarness

        return ZooKeeperHarness(request.getfixturevalue("zk_server"))
    if backend == "etcd":
        from tests.harnesses.etcd import EtcdHarness

        return EtcdHarness(request.getfixturevalue("etcd_server"))
    raise ValueError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")


def close_harness(harness: Harness) -> None:
    """Release what the harness handed out. A harness with its own ``close`` (the server
    harnesses: links restored first, then participants and clients, then links) knows the
    order; for others, closing the clients is all there is."""
    close = getattr(harness, "close", None)
    if callable(close):
        close()
    harness.close_clients()


@pytest.fixture(params=BACKENDS)
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    """The backend under test (ids ``memory``, ``zookeeper``, ``etcd``)."""
    made = make_harness(request.param, request)
    try:
        yield made
    finally:
        close_harness(made)


@pytest.fixture
def reg(harness: Harness) -> BaseRegistry:
    """A connected client in a fresh namespace, closed at teardown."""
    return harness.connect()


@pytest.fixture(params=["zookeeper", "etcd"])
def server(request: pytest.FixtureRequest) -> Iterator[Harness]:
    """ZooKeeper or etcd: worker processes need a server every process can reach."""
    made = make_harness(request.param, request)
    try:
        yield made
    finally:
        close_harness(made)


@pytest.fixture
def namespace(harness: Harness) -> str:
    """A fresh namespace on the test's harness (modules on ``server`` define their own)."""
    return harness.fresh_namespace()


@pytest.fixture
def made() -> Iterator[list[Scheduler]]:
    """Schedulers a test starts, shut down at teardown (newest first)."""
    schedulers: list[Scheduler] = []
    yield schedulers
    for sched in reversed(schedulers):
        sched.shutdown(wait=False)


@pytest.fixture
def cluster(harness: Harness, namespace: str) -> Iterator[Cluster]:
    """A ``Cluster`` on the test's namespace, to compare views with."""
    with Cluster(harness.url(namespace)) as made:
        yield made


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # the fixtures' finalizers have run by now; this catches servers started outside them
    stop_all()
