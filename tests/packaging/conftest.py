"""The packaging tests' one build: the sdist and the wheel, made once per session from the
checkout into a temporary folder (the build's own litter, ``shardjob.egg-info``, is
gitignored)."""

from __future__ import annotations

import pytest

from tests.packaging.kit import Dists, build_dists


@pytest.fixture(scope="session")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    return build_dists(tmp_path_factory.mktemp("dist"))
