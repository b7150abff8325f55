"""Errors of the sharding layer (registry errors pass through unchanged)."""

from __future__ import annotations

from registry.errors import ShardJobError
from registry.text_enum import TextEnum
from sharding.assignment import CorruptNodeError

__all__ = ["CorruptNodeError", "FenceReason", "FencedOut", "ShardingError", "ShardingTimeout"]


class ShardingError(ShardJobError):
    """Base of sharding failures."""


class ShardingTimeout(ShardingError):
    """No READY assignment arrived within the bound (the leader is busy, gone or stuck)."""


class FenceReason(TextEnum):
    """Why a run's fenced mark was refused, and so what the runner does next."""

    #: a resharding began (or the failover queue changed): plan again with the new assignment
    ASSIGNMENT = "assignment"
    #: this instance's registration is not the live one: wait until it registers again
    REGISTRATION = "registration"
    #: a run of this job is still marked on this instance
    RUNNING = "running"
    #: the registry did not answer: the outcome is unknown
    REGISTRY = "registry"


class FencedOut(ShardingError):
    """A run was refused: the assignment changed, or this instance's session or
    registration is no longer the one the run was planned with. Nothing ran."""

    def __init__(self, message: str, reason: FenceReason = FenceReason.REGISTRY) -> None:
        super().__init__(message)
        self.reason = reason
