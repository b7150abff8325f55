"""Sharding: ElasticJob's strategies, leader election per job, and the fenced, atomic,
O(1) sharding service — written once on the registry protocol.
"""

from sharding.assignment import Assignment, AssignmentState, CorruptNodeError
from sharding.errors import FencedOut, FenceReason, ShardingError, ShardingTimeout
from sharding.instance import InstanceIdentity
from sharding.layout import JobPaths
from sharding.run_marks import CurrentAssignment, RunMark
from sharding.service import ShardingService, ShardingSettings
from sharding.strategies import java_string_hash
from sharding.strategy_loader import check_assignment, get_strategy

__all__ = [
    "Assignment",
    "AssignmentState",
    "CorruptNodeError",
    "CurrentAssignment",
    "FenceReason",
    "FencedOut",
    "InstanceIdentity",
    "JobPaths",
    "RunMark",
    "ShardingError",
    "ShardingService",
    "ShardingSettings",
    "ShardingTimeout",
    "check_assignment",
    "get_strategy",
    "java_string_hash",
]
