"""Fixtures of the console tests: a fresh namespace on the session's harness, schedulers
of this process, a ``Cluster`` to compare the console with."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from scheduler import Cluster, Scheduler
from tests.harness import Harness


@pytest.fixture
def namespace(harness: Harness) -> str:
    return harness.fresh_namespace()


@pytest.fixture
def made() -> Iterator[list[Scheduler]]:
    schedulers: list[Scheduler] = []
    yield schedulers
    for sched in reversed(schedulers):
        sched.shutdown(wait=False)


@pytest.fixture
def cluster(harness: Harness, namespace: str) -> Iterator[Cluster]:
    with Cluster(harness.url(namespace)) as made:
        yield made
