"""What a job's code receives: one :class:`ShardingContext` per item it runs.

``epoch`` is the assignment's fencing token: it only grows, so a job that writes elsewhere
(a database, a queue) can store it and reject a write carrying an older epoch — the one
thing that stops a process that was paused mid-run from overwriting its successor.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

__all__ = ["ShardingContext"]


@dataclass(frozen=True)
class ShardingContext:
    job_name: str
    task_id: str
    sharding_total_count: int
    job_parameter: str
    sharding_item: int
    sharding_parameter: str | None
    fire_time: float
    epoch: int
    #: true when this run was claimed from a crashed instance (failover)
    failover: bool = False

    def to_json(self) -> str:
        """ElasticJob's script jobs receive the context as one JSON argument (camelCase)."""
        doc = asdict(self)
        return json.dumps(
            {
                "jobName": doc["job_name"],
                "taskId": doc["task_id"],
                "shardingTotalCount": doc["sharding_total_count"],
                "jobParameter": doc["job_parameter"],
                "shardingItem": doc["sharding_item"],
                "shardingParameter": doc["sharding_parameter"],
                "fireTime": doc["fire_time"],
                "epoch": doc["epoch"],
                "failover": doc["failover"],
            },
            ensure_ascii=False,
            sort_keys=True,
        )
