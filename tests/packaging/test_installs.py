"""The built wheel, installed into a fresh virtual environment per extra, works there: the
packages import from the environment (not the checkout), ``shardjob --version`` and
``shardjob demo`` run, and a job with an every-second cron fires on the registry the extra
is for — ``memory://`` for the base install, real ZooKeeper and etcd servers for theirs.
A backend or an optional feature whose extra is missing is a clear error naming the pip
install, at the CLI an exit 2 without a traceback. The other supported Pythons run the
same smoke with ``[all]``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.packaging.kit import SUPPORTED_PYTHONS, Dists, Venv, find_python, make_venv, run_smoke
from tests.servers.etcd import EtcdServer
from tests.servers.external import ExternalServer
from tests.servers.zookeeper import ZooKeeperServer

#: what each backend extra brings (distribution names, lower case)
ZOOKEEPER_DISTS = {"kazoo"}
ETCD_DISTS = {"etcd-sdk-python", "grpcio", "protobuf"}
#: a URL that names the backend; no server is reached: the missing extra stops it first
UNAVAILABLE = {"zookeeper": "zk://127.0.0.1:2181/smoke", "etcd": "etcd://127.0.0.1:2379/smoke"}
THIS_PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"


def _assert_installed_and_runs(report: dict[str, Any], venv: Venv, dists: Dists) -> None:
    """The facts every install must show, whatever its extra."""
    for package, path in report["modules"].items():
        assert Path(path).is_relative_to(venv.root.resolve()), f"{package} imported from {path}, not the venv"
    assert report["version"] == dists.version
    assert report["cli_version"] == {"rc": 0, "stdout": f"shardjob {dists.version}\n", "stderr": ""}
    demo = report["demo"]
    assert demo["rc"] == 0, demo
    assert "demo done:" in demo["stdout"] and ", 0 item runs doubled." in demo["stdout"], demo["stdout"]
    assert report["check"] == {
        "rc": 0,
        "stdout": "[jobs.nightly] ok: SCRIPT, cron '0 30 2 * * ?', 1 item, error_handler LOG\n",
        "stderr": "",
    }
    # worker --config's TOML parser: tomllib from 3.11, the tomli package before
    before_tomllib = tuple(map(int, report["python"].split(".")[:2])) < (3, 11)
    assert ("tomli" in report["distributions"]) == before_tomllib, report["distributions"]


def _assert_job_ran(report: dict[str, Any], schemes: list[str]) -> None:
    """Each registry's one-job run fired and its function saw every item's context."""
    assert [run["url"].split("://")[0] for run in report["runs"]] == schemes
    for run in report["runs"]:
        assert run["fired"], f"no fire seen every item within the smoke's timeout: {run}"
        by_item = {ctx["sharding_item"]: ctx for ctx in run["contexts"]}
        assert sorted(by_item) == [0, 1], run
        assert by_item[0]["sharding_parameter"] == "zero" and by_item[1]["sharding_parameter"] == "one"
        assert all(ctx["job_name"] == "smoke" and ctx["sharding_total_count"] == 2 for ctx in run["contexts"])
        assert all(ctx["epoch"] >= 1 and ctx["fire_time"] > 0 for ctx in run["contexts"]), run


def _assert_unavailable(report: dict[str, Any], backend: str, missing: str) -> None:
    message = f"registry backend {backend!r} needs {missing}: pip install 'shardjob[{backend}]'"
    found = report["unavailable"][UNAVAILABLE[backend]]
    assert found["error"] == "BackendUnavailable" and found["is_shardjob_error"], found
    assert found["message"] == message
    assert found["cli"] == {"rc": 2, "stdout": "", "stderr": f"shardjob: {message}\n"}


def test_the_base_install_runs_on_memory_and_names_each_missing_extra(
    dists: Dists, tmp_path: Path
) -> None:
    venv = make_venv(tmp_path / "base", sys.executable, dists.wheel, None)
    report = run_smoke(
        venv, "--registry", "memory://smoke", *[f"--unavailable={url}" for url in UNAVAILABLE.values()], "--missing-extras"
    )
    _assert_installed_and_runs(report, venv, dists)
    assert set(report["distributions"]) == {"shardjob", "tenacity", "tzdata"}
    _assert_job_ran(report, ["memory"])
    _assert_unavailable(report, "zookeeper", "kazoo")
    _assert_unavailable(report, "etcd", "etcd-sdk-python")
    missing = report["missing_extras"]
    assert missing["metrics"] == "metrics need prometheus_client: pip install 'shardjob[metrics]'"
    for feature in ("history", "console"):
        cli = missing[feature]
        assert cli["rc"] == 2 and "Traceback" not in cli["stderr"], cli
        assert cli["stderr"].startswith("shardjob: ") and f"pip install 'shardjob[{feature}]'" in cli["stderr"], cli


def test_the_zookeeper_extra_runs_on_zookeeper_without_etcd(
    dists: Dists, tmp_path: Path, zk_server: ZooKeeperServer | ExternalServer
) -> None:
    venv = make_venv(tmp_path / "zookeeper", sys.executable, dists.wheel, "zookeeper")
    report = run_smoke(venv, "--registry", f"zk://{zk_server.address}", f"--unavailable={UNAVAILABLE['etcd']}")
    _assert_installed_and_runs(report, venv, dists)
    assert set(report["distributions"]) >= ZOOKEEPER_DISTS
    assert not ETCD_DISTS & set(report["distributions"])
    _assert_job_ran(report, ["zk"])
    _assert_unavailable(report, "etcd", "etcd-sdk-python")


def test_the_etcd_extra_runs_on_etcd_without_kazoo(
    dists: Dists, tmp_path: Path, etcd_server: EtcdServer | ExternalServer
) -> None:
    venv = make_venv(tmp_path / "etcd", sys.executable, dists.wheel, "etcd")
    report = run_smoke(venv, "--registry", f"etcd://{etcd_server.address}", f"--unavailable={UNAVAILABLE['zookeeper']}")
    _assert_installed_and_runs(report, venv, dists)
    assert set(report["distributions"]) >= ETCD_DISTS
    assert not ZOOKEEPER_DISTS & set(report["distributions"])
    _assert_job_ran(report, ["etcd"])
    _assert_unavailable(report, "zookeeper", "kazoo")


@pytest.mark.parametrize("version", [v for v in SUPPORTED_PYTHONS if v != THIS_PYTHON])
def test_every_other_supported_python_runs_all_backends(
    version: str,
    dists: Dists,
    tmp_path: Path,
    zk_server: ZooKeeperServer | ExternalServer,
    etcd_server: EtcdServer | ExternalServer,
) -> None:
    python = find_python(version)
    if python is None:
        pytest.skip(f"python{version} not found on this machine (pyenv versions folder, PATH)")
    venv = make_venv(tmp_path / f"all-{version}", python, dists.wheel, "all")
    report = run_smoke(venv, "--registry", f"zk://{zk_server.address}", "--registry", f"etcd://{etcd_server.address}")
    assert report["python"].rsplit(".", 1)[0] == version
    _assert_installed_and_runs(report, venv, dists)
    assert set(report["distributions"]) >= ZOOKEEPER_DISTS | ETCD_DISTS
    _assert_job_ran(report, ["zk", "etcd"])
