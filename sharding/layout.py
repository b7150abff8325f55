"""Where a job's state lives in the registry — every path in one place.

Documented node by node in ``docs/registry-layout.md``. Invariant: the per-job node count
is O(instances + servers), never O(items): the assignment, the disabled items and each
instance's running mark are one node each, whatever the item count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from registry.paths import join, parent, shared

__all__ = ["SYSTEM_ROOT", "JobPaths", "is_config", "is_leaf", "is_running_marks", "validate_job_name"]

#: shardjob's own nodes beside the jobs (the layout version, ZooKeeper's clock node): a
#: name no job may take
SYSTEM_ROOT = "/.shardjob"

_JOB_NAME = re.compile(r"^[A-Za-z0-9_.\-:\u0080-\U0010ffff]+$")


def validate_job_name(name: object) -> str:
    """A job name is one registry path segment: no '/', not '.' or '..', not empty, and
    not ``SYSTEM_ROOT``'s."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"job name must be a non-empty str, got {name!r}")
    if "/" + name == SYSTEM_ROOT:
        raise ValueError(f"job name {name!r} is reserved for shardjob's own nodes")
    if name in {".", ".."} or not _JOB_NAME.match(name):
        raise ValueError(
            f"job name {name!r} may hold letters, digits, '_', '.', '-', ':' and non-ASCII characters only"
        )
    return name


def is_running_marks(path: str) -> bool:
    """``/{job}/running``, the node holding a job's running marks: caches of a job's
    subtree exclude it (``TreeCache(..., exclude=is_running_marks)``). Every instance
    writes its mark twice per fire, so with every instance following every mark the
    watch traffic would grow with the square of the instance count; only the leader
    needs them, and only while it reshards, so it reads them when it does."""
    return path.count("/") == 2 and path.endswith("/running")


def is_config(path: str) -> bool:
    """``/{job}/config``, a job's configuration node (``JobPaths.config``)."""
    return path.count("/") == 2 and path.endswith("/config")


def _path(base: str, *names: str) -> str:
    """``join``, as the one shared ``str`` of the path (``JobPaths``' docstring)."""
    return shared(join(base, *names))


@dataclass(frozen=True, slots=True)
class JobPaths:
    """Every path of one job.

    The paths of the nodes every started job has (its root, config, instances, servers,
    leader, assignment and running marks) are built once, as ``registry.paths.shared``:
    the cache, the watch and the registry key their maps by that same ``str``, and a fire
    reads them. The others name nodes that exist now and then (a resharding's flag, the
    failover queue, a trigger or a shutdown request, a listener's progress) and are built
    when asked. Hazard: kept here, each was a string of its own and an entry in the
    interpreter's table of interned strings for every job, whether its node ever existed
    or not (six a job)."""

    job: str
    root: str = field(init=False, repr=False, compare=False)
    config: str = field(init=False, repr=False, compare=False)
    instances: str = field(init=False, repr=False, compare=False)
    servers: str = field(init=False, repr=False, compare=False)
    leader: str = field(init=False, repr=False, compare=False)
    assignment: str = field(init=False, repr=False, compare=False)
    running: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        validate_job_name(self.job)
        root = _path("/", self.job)
        built = {
            "root": root,
            "config": _path(root, "config"),
            "instances": _path(root, "instances"),
            "servers": _path(root, "servers"),
            "leader": _path(root, "leader", "election", "instance"),
            "assignment": _path(root, "sharding", "assignment"),
            "running": _path(root, "running"),
        }
        for name, path in built.items():
            object.__setattr__(self, name, path)

    def instance(self, instance_id: str) -> str:
        return _path(self.instances, instance_id)

    def server(self, ip: str) -> str:
        return _path(self.servers, ip)

    def running_of(self, instance_id: str) -> str:
        return _path(self.running, instance_id)

    # -- nodes that exist now and then: built when asked, not shared --------------------------
    @property
    def necessary(self) -> str:
        return join(self.root, "leader", "sharding", "necessary")

    @property
    def disabled_items(self) -> str:
        return join(self.root, "sharding", "disabled")

    @property
    def guarantee(self) -> str:
        """``guarantee/{fire}``: once-per-cluster listeners' progress through a fire."""
        return join(self.root, "guarantee")

    @property
    def failover(self) -> str:
        return join(self.root, "leader", "failover")

    @property
    def failover_items(self) -> str:
        return join(self.failover, "items")

    @property
    def triggers(self) -> str:
        return join(self.root, "trigger")

    def trigger(self, instance_id: str) -> str:
        return join(self.triggers, instance_id)

    @property
    def shutdowns(self) -> str:
        return join(self.root, "shutdown")

    def shutdown(self, instance_id: str) -> str:
        return join(self.shutdowns, instance_id)


def _leaf_tails() -> frozenset[tuple[str, ...]]:
    """The job-relative segments of every node ``is_leaf`` names, ``*`` for a name that
    varies: taken from ``JobPaths`` itself, so the two cannot drift apart."""
    sample = JobPaths("job")
    paths = [
        sample.config,
        sample.instance("*"),
        sample.server("*"),
        sample.leader,
        join(parent(sample.leader), "term"),  # the election's term (registry/recipes/election.py)
        sample.necessary,
        sample.failover_items,
        sample.assignment,
        sample.disabled_items,
        sample.trigger("*"),
        sample.shutdown("*"),
    ]
    return frozenset(tuple(path.split("/")[2:]) for path in paths)


_LEAF_TAILS = _leaf_tails()
_LEAF_WILDCARDS = frozenset(tail[:-1] for tail in _LEAF_TAILS if tail[-1] == "*")


def is_leaf(path: str) -> bool:
    """Whether ``path`` is one of a job's nodes that never have children (its config, an
    instance, a server, the election's nodes, the resharding flag, the failover queue, the
    assignment, the disabled items, a trigger or shutdown request): caches of a job's
    subtree name them as ``leaves``, so on ZooKeeper they cost a data watch and no child
    watch."""
    tail = tuple(path.split("/")[2:])
    return tail in _LEAF_TAILS or (len(tail) > 1 and tail[:-1] in _LEAF_WILDCARDS)
