"""Errors of the scheduler layer, all under ``ShardJobError`` (``registry.errors``): a
caller's bad input (a configuration, a job target) is a ``ValueError`` instead."""

from __future__ import annotations

from registry.errors import ShardJobError

__all__ = ["ClockSkewError", "JobExecutionError", "PoolShutDown", "ScriptFailed", "ShardJobError"]


class ClockSkewError(ShardJobError):
    """The local clock differs from the registry's by more than max_time_diff_seconds."""


class JobExecutionError(ShardJobError):
    """An item failed and the job's error handler is THROW."""


class ScriptFailed(ShardJobError):
    """A script job's command exited with a non-zero status."""

    def __init__(self, command: list[str], status: int, stderr: str) -> None:
        tail = stderr.strip().splitlines()[-5:]
        super().__init__(
            f"script {command[0]!r} exited with status {status}" + (f": {' | '.join(tail)}" if tail else "")
        )
        self.status = status


class PoolShutDown(ShardJobError, RuntimeError):
    """The worker pool is shut down and takes no more work (the process is exiting)."""
