"""Backends are found by name, built in or through the entry-point group
``shardjob.registry_backends``; each owns its URL options and declares its
characteristics, so nothing above the registry asks which backend it is."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import registry
from registry.backends import (
    BUILTIN_BACKENDS,
    ENTRY_POINT_GROUP,
    EXTRA_MODULES,
    BackendUnavailable,
    backend_class,
)
from registry.backends.base import BaseRegistry
from registry.counting import CountingRegistry
from registry.protocol import Characteristic, Check, Create, Delete, Op
from tests.registry.plugin_backend import EchoRegistry


@pytest.fixture
def plugins(tmp_path: Path) -> Iterator[None]:
    """Two entry points installed the way a package installs them: a dist-info folder
    on ``sys.path`` with an ``entry_points.txt``."""
    dist = tmp_path / "shardjob_echo_backend-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: shardjob-echo-backend\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\n"
        "echo = tests.registry.plugin_backend:EchoRegistry\n"
        "bogus = tests.registry.plugin_backend:NotABackend\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        yield
    finally:
        sys.path.remove(str(tmp_path))


@pytest.mark.parametrize("name", sorted(BUILTIN_BACKENDS))
def test_each_builtin_backend_is_found_by_name(name: str) -> None:
    found = backend_class(name)
    assert issubclass(found, BaseRegistry) and found.backend_name == name


def test_a_backend_owns_its_url_options() -> None:
    assert "link" in backend_class("memory").url_options
    assert {"ca_cert", "cert_key", "cert_cert"} <= backend_class("etcd").url_options
    with pytest.raises(ValueError, match=r"unknown registry option 'ca_cert' for zookeeper; known: connect_timeout"):
        registry.parse_url("zk://127.0.0.1:2181/app?ca_cert=/ca.pem")


def test_backends_declare_what_callers_may_rely_on() -> None:
    network = {Characteristic.NETWORK, Characteristic.DISTRIBUTED}
    assert backend_class("memory").characteristics == set()
    assert backend_class("zookeeper").characteristics == network
    assert backend_class("etcd").characteristics == network
    with registry.connect("memory://backends-test/ns") as reg:
        assert CountingRegistry(reg).characteristics == set()  # a wrapper passes them on


def test_a_transaction_costs_its_ops_where_the_server_takes_them_as_they_come() -> None:
    mark: list[Op] = [Check("/j/sharding", 1), Check("/j/instances/i", 2), Create("/j/running/i", b"t")]
    with registry.connect("memory://backends-cost/ns") as reg:
        assert reg.transaction_cost(mark) == 3
        assert CountingRegistry(reg).transaction_cost([Delete("/j/running/i")]) == 1
    # etcd expands them: tests/registry/test_etcd_txn_cost.py


def test_a_third_party_backend_registers_through_the_entry_point_group(plugins: None) -> None:
    assert backend_class("echo") is EchoRegistry
    with registry.connect("echo://127.0.0.1:1/plugin?session_timeout=3") as reg:
        assert isinstance(reg, EchoRegistry)
        assert reg.characteristics == {Characteristic.DISTRIBUTED}
        reg.put("/a", b"1")
        assert reg.get("/a") == b"1"
    with pytest.raises(ValueError, match="needs a port"):
        registry.parse_url("echo://127.0.0.1/plugin")
    with pytest.raises(ValueError, match="is not a BaseRegistry subclass"):
        backend_class("bogus")


def test_an_unknown_backend_names_the_known_ones(plugins: None) -> None:
    with pytest.raises(ValueError, match=r"unknown registry backend 'nope'; known: bogus, echo, etcd, memory"):
        backend_class("nope")
    with pytest.raises(ValueError, match=r"unknown scheme 'nope'; known: .*echo.*zk"):
        registry.parse_url("nope://h:1/x")


# -- a backend whose extra is missing -------------------------------------------------------
# tests/packaging proves these on real installs without the extra; here the import system
# is told a module is absent (None in sys.modules, restored after), to reach the cases an
# install cannot: each module of an extra, and a module of our own gone missing.
def _block(monkeypatch: pytest.MonkeyPatch, backend: str, module: str) -> None:
    """Make ``module`` (and its submodules) absent and the backend's modules unimported."""
    for name in [m for m in sys.modules if m.startswith(f"registry.backends.{backend}")]:
        monkeypatch.delitem(sys.modules, name)
    for name in [m for m in sys.modules if m == module or m.startswith(f"{module}.")] or [module]:
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.parametrize(
    ("backend", "module", "distribution"),
    [("zookeeper", "kazoo", "kazoo"), ("etcd", "pyetcd", "etcd-sdk-python"), ("etcd", "grpc", "grpcio")],
)
def test_a_backend_whose_extra_is_missing_names_the_pip_install(
    monkeypatch: pytest.MonkeyPatch, backend: str, module: str, distribution: str
) -> None:
    _block(monkeypatch, backend, module)
    message = f"registry backend '{backend}' needs {distribution}: pip install 'shardjob[{backend}]'"
    with pytest.raises(BackendUnavailable) as raised:
        backend_class(backend)
    assert str(raised.value) == message
    assert (raised.value.backend, raised.value.missing) == (backend, distribution)
    assert isinstance(raised.value, registry.ShardJobError)
    scheme = "zk" if backend == "zookeeper" else backend
    with pytest.raises(BackendUnavailable, match=r"pip install 'shardjob\[" + backend + r"\]'"):
        registry.connect(f"{scheme}://127.0.0.1:1/missing")


def test_a_missing_module_of_our_own_is_not_taken_for_a_missing_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    _block(monkeypatch, "zookeeper", "registry.backends.zookeeper_io")
    with pytest.raises(ModuleNotFoundError) as raised:
        backend_class("zookeeper")
    assert raised.value.name == "registry.backends.zookeeper_io"


@pytest.mark.parametrize("backend", sorted(EXTRA_MODULES))
def test_each_backend_is_an_extra_of_its_name_listing_the_distributions_it_imports(backend: str) -> None:
    in_extra = set()
    for line in metadata.requires("shardjob") or []:
        req = Requirement(line)
        if req.marker is not None and req.marker.evaluate({"extra": backend}):
            in_extra.add(req.name.lower())
    assert in_extra == set(EXTRA_MODULES[backend].values())
    assert backend in BUILTIN_BACKENDS
