"""Distributed, sharded cron jobs: the user's API.

``Scheduler(url)`` is one instance of every job added to it; each job's items are split
by an elected leader and every instance runs only its own. See README.md.
"""

from scheduler.cluster import Cluster, LiveInstances, NoSuchJob, StaleConfig
from scheduler.cluster_views import (
    InstanceView,
    ItemStatus,
    ItemView,
    JobBrief,
    JobDetail,
    JobStatus,
    ServerBrief,
)
from scheduler.config import JobConfig, JobType
from scheduler.context import ShardingContext
from scheduler.cron import CronSchedule
from scheduler.distribute_once import DistributeOnceListener
from scheduler.errors import (
    ClockSkewError,
    HttpJobFailed,
    JobExecutionError,
    JobTimeout,
    PoolShutDown,
    ScriptFailed,
    ShardJobError,
)
from scheduler.gc_tuning import tune_gc
from scheduler.handlers import JobListener, JobRun
from scheduler.scheduler import Scheduler

__all__ = [
    "ClockSkewError",
    "Cluster",
    "CronSchedule",
    "DistributeOnceListener",
    "HttpJobFailed",
    "InstanceView",
    "ItemStatus",
    "ItemView",
    "JobBrief",
    "JobConfig",
    "JobDetail",
    "JobExecutionError",
    "JobListener",
    "JobRun",
    "JobStatus",
    "JobTimeout",
    "JobType",
    "LiveInstances",
    "NoSuchJob",
    "PoolShutDown",
    "Scheduler",
    "ScriptFailed",
    "ServerBrief",
    "ShardJobError",
    "ShardingContext",
    "StaleConfig",
    "tune_gc",
]
