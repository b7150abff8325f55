"""The packaging tests' one build: the sdist and the wheel, made once per test run from the
checkout into a temporary folder (the build's own litter, ``shardjob.egg-info``, is
gitignored).

Invariant: one build per run, also under pytest-xdist. ``python -m build`` writes
``shardjob.egg-info`` into the checkout, so two workers building at once could each
package the other's half-written file list; the first worker to take the lock builds
into the folder the workers share, and the others use what it built.
"""

from __future__ import annotations

import fcntl
import os

import pytest

from tests.packaging.kit import Dists, build_dists, built_dists


@pytest.fixture(scope="session")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # no xdist: this process is the only one
        return build_dists(tmp_path_factory.mktemp("dist"))
    shared = tmp_path_factory.getbasetemp().parent  # the run's folder, above each worker's
    with open(shared / "dist.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        outdir = shared / "dist"
        if (outdir / "built").exists():
            return built_dists(outdir)
        made = build_dists(outdir)
        (outdir / "built").write_text(str(os.getpid()))
        return made
