"""What ``Cluster`` reports: statuses and views of jobs, items, instances and servers,
computed from a job's decoded subtree (``sharding.job_state.JobState``).

Statuses follow ElasticJob's consoles, so that an operator who knows one reads the other:
a job is ``CRASHED`` when no instance is live, ``DISABLED`` when every live instance's
server is disabled, ``SHARDING_FLAG`` while a resharding is flagged or under way,
``FAILOVER`` while failover work is queued, else ``OK`` (checked in that order).
An item is ``DISABLED``, ``RUNNING`` (a running mark covers it), ``SHARDING_FLAG``,
``FAILOVER`` (entries queued for it), else ``PENDING`` (waiting for its next fire).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from scheduler.config import JobConfig
from sharding.assignment import CorruptNodeError
from sharding.job_state import JobState

__all__ = [
    "InstanceView",
    "ItemStatus",
    "ItemView",
    "JobBrief",
    "JobDetail",
    "JobStatus",
    "ServerBrief",
    "brief_of",
    "config_of",
    "detail_of",
    "servers_of",
]


class JobStatus(enum.Enum):
    OK = "OK"
    #: no live instance
    CRASHED = "CRASHED"
    #: every live instance's server is disabled
    DISABLED = "DISABLED"
    #: a resharding is flagged or under way
    SHARDING_FLAG = "SHARDING_FLAG"
    #: failover work is queued
    FAILOVER = "FAILOVER"


class ItemStatus(enum.Enum):
    #: waiting for its next fire
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    DISABLED = "DISABLED"
    SHARDING_FLAG = "SHARDING_FLAG"
    #: failover entries are queued for it
    FAILOVER = "FAILOVER"


@dataclass(frozen=True)
class JobBrief:
    name: str
    status: JobStatus
    cron: str | None
    sharding_total_count: int
    #: live instances
    instances: int
    description: str


@dataclass(frozen=True)
class InstanceView:
    id: str
    ip: str
    pid: int | None
    #: UNIX time of its registration
    since: float | None
    #: its server is enabled for this job
    enabled: bool
    items: tuple[int, ...]
    #: the fire time of the run it is marked running, if any
    running_fire: float | None
    leader: bool


@dataclass(frozen=True)
class ItemView:
    item: int
    #: the instance the assignment gives it to (None: unassigned)
    instance: str | None
    status: ItemStatus
    parameter: str
    #: the fire time of the run covering it now, if any
    fire_time: float | None
    #: failover entries queued for it
    failover_entries: int


@dataclass(frozen=True)
class JobDetail:
    brief: JobBrief
    #: None when the stored configuration does not decode (see ``problems``)
    config: JobConfig | None
    leader: str | None
    epoch: int | None
    #: the reason a resharding is flagged for, if one is
    resharding_reason: str | None
    instances: tuple[InstanceView, ...]
    items: tuple[ItemView, ...]
    #: nodes that do not decode, each naming its path and fault
    problems: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.brief.name

    @property
    def status(self) -> JobStatus:
        return self.brief.status


@dataclass(frozen=True)
class ServerBrief:
    ip: str
    #: live instances on this server, across jobs
    instances: int
    #: jobs that know this server
    jobs: int
    #: of those, the jobs for which it is disabled
    disabled_jobs: int
    #: it has a live instance now
    online: bool
    #: when it was last seen with an instance: now when online, else the time the
    #: leader's reconcile first found it empty (None: not checked since)
    last_seen: float | None


def config_of(state: JobState) -> JobConfig | None:
    """The stored configuration; None when absent or corrupt (a problem of the state)."""
    node = state.config
    if node is None:
        return None
    try:
        return JobConfig.from_json(state.paths.config, node.value)
    except CorruptNodeError:
        return None


def _config_problem(state: JobState) -> str | None:
    node = state.config
    if node is None:
        return None
    try:
        JobConfig.from_json(state.paths.config, node.value)
    except CorruptNodeError as exc:
        return str(exc)
    return None


def _status(state: JobState) -> JobStatus:
    if not state.instances:
        return JobStatus.CRASHED
    if not any(state.server_of(i).enabled for i in state.instances):
        return JobStatus.DISABLED
    if state.resharding:
        return JobStatus.SHARDING_FLAG
    if state.failover.entries:
        return JobStatus.FAILOVER
    return JobStatus.OK


def brief_of(state: JobState, config: JobConfig | None = None) -> JobBrief:
    config = config if config is not None else config_of(state)
    total = config.sharding_total_count if config is not None else 0
    if config is None and state.assignment is not None:
        total = state.assignment.total
    return JobBrief(
        name=state.job,
        status=_status(state),
        cron=None if config is None else config.cron,
        sharding_total_count=total,
        instances=len(state.instances),
        description="" if config is None else config.description,
    )


def _running_fires(state: JobState) -> dict[int, float]:
    fires: dict[int, float] = {}
    for trace in state.running.values():
        if trace.state == "running" and trace.fire_time is not None:
            for item in trace.items:
                fires[item] = trace.fire_time
    return fires


def _item_status(
    state: JobState, item: int, running: Mapping[int, float], queued: Mapping[int, int]
) -> ItemStatus:
    if item in state.disabled_items:
        return ItemStatus.DISABLED
    if item in running:
        return ItemStatus.RUNNING
    if state.resharding:
        return ItemStatus.SHARDING_FLAG
    if queued.get(item):
        return ItemStatus.FAILOVER
    return ItemStatus.PENDING


def detail_of(state: JobState) -> JobDetail:
    config = config_of(state)
    brief = brief_of(state, config)
    assignment = state.assignment
    owners = {} if assignment is None else {i: who for who, items in assignment.items.items() for i in items}
    running = _running_fires(state)
    queued: dict[int, int] = {}
    for entry in state.failover.entries:
        queued[entry.item] = queued.get(entry.item, 0) + 1
    parameters = config.item_parameters() if config is not None else {}
    items = tuple(
        ItemView(
            item=item,
            instance=owners.get(item),
            status=_item_status(state, item, running, queued),
            parameter=parameters.get(item, ""),
            fire_time=running.get(item),
            failover_entries=queued.get(item, 0),
        )
        for item in range(brief.sharding_total_count)
    )
    instances = []
    for instance_id, record in sorted(state.instances.items()):
        trace = state.running.get(instance_id)
        instances.append(
            InstanceView(
                id=instance_id,
                ip=record.ip,
                pid=record.pid,
                since=record.started,
                enabled=state.server_of(instance_id).enabled,
                items=() if assignment is None else assignment.items_of(instance_id),
                running_fire=trace.fire_time if trace is not None and trace.state == "running" else None,
                leader=instance_id == state.leader,
            )
        )
    problems = [str(p) for p in state.problems]
    config_problem = _config_problem(state)
    if config_problem is not None:
        problems.insert(0, config_problem)
    return JobDetail(
        brief=brief,
        config=config,
        leader=state.leader,
        epoch=None if assignment is None else assignment.epoch,
        resharding_reason=state.resharding_flag,
        instances=tuple(instances),
        items=items,
        problems=tuple(problems),
    )


def servers_of(states: Mapping[str, JobState], now: float) -> list[ServerBrief]:
    """Every server any job knows, with its instances and jobs across the namespace."""
    instances: dict[str, int] = {}
    jobs: dict[str, set[str]] = {}
    disabled: dict[str, set[str]] = {}
    vacant: dict[str, float] = {}
    for name, state in states.items():
        for record in state.instances.values():
            instances[record.ip] = instances.get(record.ip, 0) + 1
            jobs.setdefault(record.ip, set()).add(name)
        for ip, server in state.servers.items():
            jobs.setdefault(ip, set()).add(name)
            if not server.enabled:
                disabled.setdefault(ip, set()).add(name)
            if server.vacant_since is not None:
                vacant[ip] = max(vacant.get(ip, 0.0), server.vacant_since)
    briefs = []
    for ip in sorted(jobs):
        online = instances.get(ip, 0) > 0
        briefs.append(
            ServerBrief(
                ip=ip,
                instances=instances.get(ip, 0),
                jobs=len(jobs[ip]),
                disabled_jobs=len(disabled.get(ip, ())),
                online=online,
                last_seen=now if online else vacant.get(ip),
            )
        )
    return briefs
