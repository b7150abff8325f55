"""Distributed, sharded cron jobs: the user's API.

``Scheduler(url)`` is one instance of every job added to it; each job's items are split
by an elected leader and every instance runs only its own. See README.md.
"""

from scheduler.config import JobConfig, JobType
from scheduler.context import ShardingContext
from scheduler.cron import CronSchedule
from scheduler.errors import ClockSkewError, JobExecutionError, PoolShutDown, ScriptFailed, ShardJobError
from scheduler.handlers import JobListener, JobRun
from scheduler.scheduler import Scheduler

__all__ = [
    "ClockSkewError",
    "CronSchedule",
    "JobConfig",
    "JobExecutionError",
    "JobListener",
    "JobRun",
    "JobType",
    "PoolShutDown",
    "Scheduler",
    "ScriptFailed",
    "ShardJobError",
    "ShardingContext",
]
