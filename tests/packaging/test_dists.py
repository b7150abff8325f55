"""What ``python -m build`` makes: a wheel that carries the packages, their ``py.typed``
markers, the console's templates and the licence, and nothing of tests/ or benchmarks/;
metadata declaring the base requirements, the extras, the supported Pythons and the licence;
an sdist without the test suite."""

from __future__ import annotations

import tarfile
import zipfile
from email.message import Message
from email.parser import Parser

from packaging.requirements import Requirement  # build's own dependency
from packaging.utils import canonicalize_name

from tests.packaging.kit import SUPPORTED_PYTHONS, Dists

PACKAGES = ("registry", "sharding", "scheduler")


def _metadata(dists: Dists) -> Message:
    with zipfile.ZipFile(dists.wheel) as wheel:
        text = wheel.read(f"shardjob-{dists.version}.dist-info/METADATA").decode()
    return Parser().parsestr(text)


def _requirements(meta: Message) -> dict[str, set[str]]:
    """The distributions required (with their extras), by extra ("" for the base install)."""
    extras = meta.get_all("Provides-Extra") or []
    found: dict[str, set[str]] = {"": set(), **{extra: set() for extra in extras}}
    for line in meta.get_all("Requires-Dist") or []:
        req = Requirement(line)
        label = canonicalize_name(req.name) + (f"[{','.join(sorted(req.extras))}]" if req.extras else "")
        if req.marker is None:
            found[""].add(label)
            continue
        for extra in extras:
            if req.marker.evaluate({"extra": extra}):
                found[extra].add(label)
    return found


def test_the_wheel_carries_the_packages_their_markers_templates_and_licence(dists: Dists) -> None:
    with zipfile.ZipFile(dists.wheel) as wheel:
        names = set(wheel.namelist())
    info = f"shardjob-{dists.version}.dist-info"
    for package in PACKAGES:
        assert f"{package}/__init__.py" in names
        assert f"{package}/py.typed" in names, f"{package} is not marked typed"
    assert f"{info}/licenses/LICENSE" in names
    with zipfile.ZipFile(dists.wheel) as wheel:
        assert "Apache License" in wheel.read(f"{info}/licenses/LICENSE").decode()
    templates = {name.rsplit("/", 1)[1] for name in names if name.startswith("scheduler/console/templates/")}
    assert {"base.html", "jobs.html", "job.html", "servers.html", "history.html", "login.html"} <= templates
    tops = {name.split("/", 1)[0] for name in names}
    assert tops == {*PACKAGES, info}, f"unexpected top-level entries: {sorted(tops - {*PACKAGES, info})}"


def test_the_metadata_declares_the_extras_the_pythons_and_the_licence(dists: Dists) -> None:
    meta = _metadata(dists)
    required = _requirements(meta)
    assert required[""] == {"tenacity", "tzdata"}, "the base install must carry only what memory:// needs"
    assert required["zookeeper"] == {"kazoo"}
    assert required["etcd"] == {"etcd-sdk-python", "protobuf", "grpcio"}
    assert required["all"] == {"shardjob[etcd,zookeeper]"}
    assert "shardjob[all,console,history,metrics,postgresql]" in required["test"]
    assert {"console", "history", "postgresql", "metrics"} <= set(meta.get_all("Provides-Extra") or [])
    assert meta["Requires-Python"] == f">={SUPPORTED_PYTHONS[0]}"
    declared = {
        c.removeprefix("Programming Language :: Python :: ")
        for c in meta.get_all("Classifier") or []
        if c.startswith("Programming Language :: Python :: 3.")
    }
    assert declared == set(SUPPORTED_PYTHONS)
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta["Version"] == dists.version


def test_the_sdist_carries_licence_and_changelog_but_not_the_tests(dists: Dists) -> None:
    with tarfile.open(dists.sdist) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {"LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml"} <= names
    assert {"registry/py.typed", "scheduler/console/templates/base.html"} <= names
    assert not [name for name in names if name.startswith(("tests/", "benchmarks/"))]
