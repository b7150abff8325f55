"""What a job's code receives: one :class:`ShardingContext` per item it runs.

``epoch`` is the assignment's fencing token: it only grows, so a job that writes elsewhere
(a database, a queue) can store it and reject a write carrying an older epoch — the one
thing that stops a process that was paused mid-run from overwriting its successor.

A job with ``timeout_seconds`` gets a ``deadline`` per attempt: ``cancelled`` turns true
when it passes. A sync job cannot be stopped from outside (Python has no way to kill a
call), so a long one should look at ``cancelled`` (or call ``raise_if_cancelled()``)
between steps; an async job's task is cancelled, a script's process group killed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime

from scheduler.cron import parse_time_zone
from scheduler.errors import JobTimeout
from scheduler.timeouts import Deadline

__all__ = ["ShardingContext"]


@dataclass(frozen=True, init=False)
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
    #: 1 for the first run of the item in this fire, 2 for its first retry (``retries``)
    attempt: int = 1
    #: the job's ``time_zone`` (None: the machine's), in which ``fire_datetime`` is given
    time_zone: str | None = None
    #: this attempt's deadline when the job has ``timeout_seconds``, else None
    deadline: Deadline | None = field(default=None, compare=False, repr=False)

    def __init__(
        self,
        job_name: str,
        task_id: str,
        sharding_total_count: int,
        job_parameter: str,
        sharding_item: int,
        sharding_parameter: str | None,
        fire_time: float,
        epoch: int,
        failover: bool = False,
        attempt: int = 1,
        time_zone: str | None = None,
        deadline: Deadline | None = None,
    ) -> None:
        # Hazard: the run path makes one context per item, so its fields go into the
        # instance dict in one update: a frozen dataclass's own __init__ pays one
        # object.__setattr__ per field (twelve cost about 0.7 us an item). Every field of
        # the class must be set here, in this order.
        self.__dict__.update(
            job_name=job_name,
            task_id=task_id,
            sharding_total_count=sharding_total_count,
            job_parameter=job_parameter,
            sharding_item=sharding_item,
            sharding_parameter=sharding_parameter,
            fire_time=fire_time,
            epoch=epoch,
            failover=failover,
            attempt=attempt,
            time_zone=time_zone,
            deadline=deadline,
        )

    @property
    def fire_datetime(self) -> datetime:
        """``fire_time`` as an aware datetime in the job's time zone (made on demand)."""
        return datetime.fromtimestamp(self.fire_time, parse_time_zone(self.time_zone))

    @property
    def cancelled(self) -> bool:
        """True once this attempt ran past the job's ``timeout_seconds``: stop soon, the
        attempt fails with ``JobTimeout`` whatever it does from here."""
        deadline = self.deadline
        return deadline is not None and deadline.expired

    def raise_if_cancelled(self) -> None:
        """Raise ``JobTimeout`` when ``cancelled``: a sync job's way out at a safe point."""
        deadline = self.deadline
        if deadline is not None and deadline.expired:
            raise JobTimeout(self.job_name, self.sharding_item, deadline.timeout)

    def to_json(self) -> str:
        """ElasticJob's script jobs receive the context as one JSON argument (camelCase),
        with ``attempt`` added."""
        return json.dumps(
            {
                "jobName": self.job_name,
                "taskId": self.task_id,
                "shardingTotalCount": self.sharding_total_count,
                "jobParameter": self.job_parameter,
                "shardingItem": self.sharding_item,
                "shardingParameter": self.sharding_parameter,
                "fireTime": self.fire_time,
                "epoch": self.epoch,
                "failover": self.failover,
                "attempt": self.attempt,
            },
            ensure_ascii=False,
            sort_keys=True,
        )
