"""One root for every error shardjob raises: ``except ShardJobError`` catches them all,
and errors that always were ValueError or RuntimeError still are."""

from __future__ import annotations

import pytest

import registry
import scheduler
import sharding
from registry.backends import BackendUnavailable
from registry.recipes.batch import BatcherClosed

ERRORS: list[type[BaseException]] = [
    registry.RegistryError,
    registry.RegistryConnectionError,
    registry.NodeExistsError,
    registry.NoNodeError,
    registry.BadVersionError,
    registry.TransactionError,
    registry.LockTimeout,
    registry.SessionLostError,
    BackendUnavailable,
    BatcherClosed,
    sharding.ShardingError,
    sharding.ShardingTimeout,
    sharding.FencedOut,
    sharding.CorruptNodeError,
    scheduler.ClockSkewError,
    scheduler.JobExecutionError,
    scheduler.ScriptFailed,
    scheduler.PoolShutDown,
    scheduler.StaleConfig,
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: e.__name__)
def test_every_error_has_the_one_root(error: type[BaseException]) -> None:
    assert issubclass(error, registry.ShardJobError)
    assert scheduler.ShardJobError is registry.ShardJobError


def test_errors_keep_the_builtin_bases_callers_catch() -> None:
    assert issubclass(sharding.CorruptNodeError, ValueError)  # a node nobody can read, as before
    assert issubclass(scheduler.PoolShutDown, RuntimeError)  # what an executor raises once shut down
