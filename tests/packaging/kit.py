"""What the packaging tests share: the supported Pythons and finding them, the built
distributions, fresh virtual environments with the wheel installed, and the smoke run.

Invariants: a virtual environment is created without pip and filled by this session's pip
(``pip --python``, pip >= 22.3; pip's cache is reused), so its site-packages holds the wheel
and what it requires, nothing else; every child process gets an environment without PYTHONPATH, PYTHONHOME or
VIRTUAL_ENV, so nothing of the checkout or of the session's venv leaks into it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "SMOKE",
    "SUPPORTED_PYTHONS",
    "Dists",
    "Venv",
    "build_dists",
    "built_dists",
    "clean_env",
    "find_python",
    "make_venv",
    "run_smoke",
]

#: the Pythons shardjob supports; pyproject's classifiers declare the same (test_wheel)
SUPPORTED_PYTHONS = ("3.10", "3.11", "3.12", "3.13")
SMOKE = Path(__file__).with_name("smoke.py")
REPO_ROOT = Path(__file__).resolve().parents[2]

#: a build downloads setuptools into an isolated environment (pip's cache makes it quick)
BUILD_TIMEOUT = 300.0
#: an install resolves against the package index; wheels come from pip's cache when there
INSTALL_TIMEOUT = 300.0
#: the smoke script's own waits are bounded well below this
SMOKE_TIMEOUT = 240.0


def clean_env() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(name, None)
    return env


@dataclass(frozen=True)
class Dists:
    sdist: Path
    wheel: Path
    version: str


def build_dists(outdir: Path) -> Dists:
    """``python -m build`` of the checkout: the sdist, then the wheel built from that sdist
    (so a file the sdist lacks is missing from the wheel too)."""
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(outdir), str(REPO_ROOT)],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        env=clean_env(),
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, f"python -m build failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return built_dists(outdir)


def built_dists(outdir: Path) -> Dists:
    """The sdist and wheel ``build_dists`` wrote into ``outdir``."""
    (sdist,) = outdir.glob("shardjob-*.tar.gz")
    (wheel,) = outdir.glob("shardjob-*-py3-none-any.whl")
    version = wheel.name.split("-")[1]
    return Dists(sdist=sdist, wheel=wheel, version=version)


def _runs_as(python: str, version: str) -> bool:
    """True when ``python`` starts and is ``version`` (a pyenv shim for a version not
    selected exists on PATH but fails)."""
    try:
        done = subprocess.run(
            [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
            env=clean_env(),
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and done.stdout.strip() == version


def find_python(version: str) -> str | None:
    """An interpreter of ``version`` (``"3.12"``): the newest patch release under pyenv's
    versions folder, else ``python3.12`` on PATH; None when neither runs."""
    if version == f"{sys.version_info[0]}.{sys.version_info[1]}":
        return sys.executable
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    releases = [path for path in root.glob(f"{version}.*") if re.fullmatch(r"\d+\.\d+\.\d+", path.name)]
    releases.sort(key=lambda path: tuple(int(part) for part in path.name.split(".")), reverse=True)
    candidates = [str(path / "bin" / f"python{version}") for path in releases]
    on_path = shutil.which(f"python{version}")
    if on_path:
        candidates.append(on_path)
    return next((python for python in candidates if _runs_as(python, version)), None)


@dataclass(frozen=True)
class Venv:
    root: Path
    python: Path


def make_venv(root: Path, python: str, wheel: Path, extra: str | None) -> Venv:
    """A fresh virtual environment of ``python`` at ``root`` holding ``wheel[extra]``."""
    created = subprocess.run(
        [python, "-m", "venv", "--without-pip", str(root)],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
    )
    assert created.returncode == 0, f"{python} -m venv failed: {created.stderr}"
    venv_python = root / "bin" / "python"
    requirement = f"{wheel}[{extra}]" if extra else str(wheel)
    installed = subprocess.run(
        [
            sys.executable, "-m", "pip", "--python", str(venv_python), "install",
            "--no-compile", "--quiet", "--disable-pip-version-check", requirement,
        ],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT,
        env=clean_env(),
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert installed.returncode == 0, f"pip install {requirement} failed:\n{installed.stdout}\n{installed.stderr}"
    return Venv(root=root, python=venv_python)


def run_smoke(venv: Venv, *args: str) -> dict[str, Any]:
    """smoke.py run by the venv's Python in isolated mode from the venv's folder; its report."""
    done = subprocess.run(
        [str(venv.python), "-I", str(SMOKE), *args],
        cwd=venv.root,
        capture_output=True,
        text=True,
        timeout=SMOKE_TIMEOUT,
        env=clean_env(),
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, f"smoke.py failed (exit {done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report
