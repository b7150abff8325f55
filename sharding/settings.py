"""What one job's sharding is asked to do: the part of a job's config the sharding
service, its resharding and its run marks read."""

from __future__ import annotations

from dataclasses import dataclass

from sharding.strategy_loader import get_strategy

__all__ = ["ShardingSettings"]


@dataclass(frozen=True, slots=True)
class ShardingSettings:
    total: int
    strategy: str = "AVG_ALLOCATION"
    monitor_execution: bool = True
    static: bool = False
    #: keep running marks persistent and queue a departed instance's undone work
    failover: bool = False
    #: the leader's reconcile deletes ``servers/{ip}`` vacant this long (<= 0: never)
    server_expiry_seconds: float = 86_400.0

    def __post_init__(self) -> None:
        if isinstance(self.total, bool) or not isinstance(self.total, int) or self.total < 1:
            raise ValueError(f"sharding_total_count must be an int >= 1, got {self.total!r}")
        get_strategy(self.strategy)  # unknown names fail here, before anything is written
