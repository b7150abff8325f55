"""An operator's changes to one job, planned as versioned ops on a :class:`JobState`.

Each ``plan_*`` turns what was read into the ops of ONE transaction: writes carry the
version they were read at, and what the change relies on without writing (the job's
configuration, an instance's registration) is a ``Check``. Applied through
``registry.recipes.versioned.update``, a concurrent change — another operator's, the
leader's — refuses the transaction and the plan is made again from a fresh read, so no
change is lost and none lands on a job or an instance that went away meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from registry.errors import ShardJobError
from registry.protocol import Check, Create, Delete, Op, Set
from sharding.assignment import encode_items
from sharding.job_state import JobState, encode_server

__all__ = [
    "NoSuchJob",
    "plan_items",
    "plan_remove",
    "plan_servers",
    "plan_shutdown",
    "plan_trigger",
    "plan_vacancies",
    "require_job",
]


class NoSuchJob(ShardJobError, LookupError):
    """The job has no configuration in the registry."""

    def __init__(self, job: str) -> None:
        super().__init__(f"no job {job!r} in the registry")
        self.job = job


def require_job(state: JobState) -> Check:
    """The ``Check`` that the job still exists, at the configuration's version read."""
    node = state.config
    if node is None:
        raise NoSuchJob(state.job)
    return Check(state.paths.config, node.version)


def plan_servers(state: JobState, ips: Iterable[str], enabled: bool) -> list[Op]:
    """Set ``servers/{ip}`` of each of ``ips`` to ``enabled`` (a vacancy stamp stays)."""
    ops: list[Op] = []
    for ip in sorted(set(ips)):
        path = state.paths.server(ip)
        node = state.nodes.get(path)
        record = state.servers.get(ip)
        if node is None:
            ops.append(Create(path, encode_server(enabled)))
        elif record is None or record.enabled != enabled:  # corrupt, or another state
            vacant = None if record is None else record.vacant_since
            ops.append(Set(path, encode_server(enabled, vacant), node.version))
    return ops


def plan_items(state: JobState, items: Sequence[int], disabled: bool, total: int) -> list[Op]:
    """Add ``items`` to (or take them from) ``sharding/disabled``; ``ValueError`` naming
    the items outside ``0..total-1``."""
    bad = [i for i in items if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < total]
    if bad:
        raise ValueError(f"job {state.job}: items {bad} are not in 0..{total - 1}")
    current = set(state.disabled_items)
    updated = current | set(items) if disabled else current - set(items)
    if updated == current and state.paths.disabled_items not in {p for p, _ in _corrupt(state)}:
        return []
    path = state.paths.disabled_items
    value = encode_items(updated).encode()
    node = state.nodes.get(path)
    return [Create(path, value) if node is None else Set(path, value, node.version)]


def plan_trigger(state: JobState, stamp: bytes) -> list[Op]:
    """A trigger request for every live instance, each checked still registered."""
    ops: list[Op] = [require_job(state)]
    if not state.instances:
        raise ValueError(f"job {state.job!r} has no live instance to trigger")
    for instance_id, record in sorted(state.instances.items()):
        ops.append(Check(state.paths.instance(instance_id), record.version))
        path = state.paths.trigger(instance_id)
        node = state.nodes.get(path)
        ops.append(Create(path, stamp) if node is None else Set(path, stamp, node.version))
    return ops


def plan_shutdown(state: JobState, instances: Iterable[str], stamp: bytes) -> list[Op]:
    """A shutdown request for each of ``instances``; ``ValueError`` for one not live."""
    ops: list[Op] = [require_job(state)]
    for instance_id in sorted(set(instances)):
        record = state.instances.get(instance_id)
        if record is None:
            live = ", ".join(sorted(state.instances)) or "none"
            raise ValueError(f"job {state.job!r} has no live instance {instance_id!r} (live: {live})")
        ops.append(Check(state.paths.instance(instance_id), record.version))
        path = state.paths.shutdown(instance_id)
        if path not in state.nodes:
            ops.append(Create(path, stamp))
    return ops


def plan_remove(state: JobState) -> list[Op]:
    """Delete the whole job, unless its configuration changed since it was read."""
    return [require_job(state), Delete(state.paths.root)]


def plan_vacancies(state: JobState, now: float, expiry_seconds: float) -> list[Op]:
    """The leader's upkeep of ``servers/``: stamp a server with no instance as vacant,
    take the stamp off one that has an instance again, and delete one vacant for longer
    than ``expiry_seconds`` (<= 0: never). Also drops shutdown requests whose instance is
    gone (an instance restarted under the same id starts afresh)."""
    occupied = {record.ip for record in state.instances.values()}
    ops: list[Op] = []
    for ip, record in sorted(state.servers.items()):
        path = state.paths.server(ip)
        version = state.nodes[path].version
        if ip in occupied:
            if record.vacant_since is not None:
                ops.append(Set(path, encode_server(record.enabled), version))
        elif record.vacant_since is None:
            ops.append(Set(path, encode_server(record.enabled, now), version))
        elif expiry_seconds > 0 and now - record.vacant_since > expiry_seconds:
            ops.append(Delete(path, version))
    for instance_id in sorted(state.shutdowns):
        if instance_id not in state.instances:
            path = state.paths.shutdown(instance_id)
            ops.append(Delete(path, state.nodes[path].version))
    return ops


def _corrupt(state: JobState) -> list[tuple[str, str]]:
    return [(problem.path, problem.problem) for problem in state.problems]
