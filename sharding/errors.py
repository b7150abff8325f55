"""Errors of the sharding layer (registry errors pass through unchanged)."""

from __future__ import annotations

from sharding.assignment import CorruptNodeError

__all__ = ["CorruptNodeError", "FencedOut", "ShardingError", "ShardingTimeout"]


class ShardingError(Exception):
    """Base of sharding failures."""


class ShardingTimeout(ShardingError):
    """No READY assignment arrived within the bound (the leader is busy, gone or stuck)."""


class FencedOut(ShardingError):
    """A run was refused: the assignment changed, or this instance's session or
    registration is no longer the one the run was planned with. Nothing ran.

    ``reason``: ``"assignment"`` (plan again with the new one), ``"registration"``,
    ``"running"`` (a run of this job is still marked) or ``"registry"``."""

    def __init__(self, message: str, reason: str = "registry") -> None:
        super().__init__(message)
        self.reason = reason
