"""A job's registry subtree as typed values: the one place that decodes its nodes.

The sharding service reads single nodes from its cache through the codecs here
(``server_status``, ``instance_record``, ``disabled_items``); operators read a whole job at
once through :meth:`JobState.read` — one ``read_tree``, so the round trips per job do not
grow with its instances or items — and get every node decoded the same way.

Invariant: a node that does not decode never fails the whole view. It is reported in
``JobState.problems`` (a ``CorruptNodeError`` naming the path and the fault) and read as
absent, exactly as the service treats it when it meets it on the run path.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from registry.paths import basename, parent
from registry.protocol import Node, RegistryCenter
from sharding.assignment import Assignment, AssignmentState, CorruptNodeError, decode_items
from sharding.failover import FailoverQueue, RunTrace
from sharding.layout import JobPaths

__all__ = [
    "DISABLED",
    "ENABLED",
    "InstanceRecord",
    "JobState",
    "ServerRecord",
    "disabled_items",
    "encode_server",
    "instance_record",
    "server_status",
]

ENABLED = "ENABLED"
DISABLED = "DISABLED"
_VACANT_SINCE = "vacant_since="


@dataclass(frozen=True)
class ServerRecord:
    """``servers/{ip}``: ElasticJob's status word, then, once the leader found the server
    with no instance, a second line ``vacant_since=<unix time>``."""

    ip: str
    enabled: bool
    #: when the leader first found no instance on this server (None: it had one since)
    vacant_since: float | None = None
    version: int = -1


def server_status(path: str, raw: bytes | None, version: int = -1) -> ServerRecord:
    """Decode ``servers/{ip}``; an absent node is an enabled server (ElasticJob's rule)."""
    ip = basename(path)
    if raw is None:
        return ServerRecord(ip, True, None, version)
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise CorruptNodeError(path, "server status is not UTF-8 text") from None
    status = lines[0].strip() if lines else ""
    if status not in (ENABLED, DISABLED):
        raise CorruptNodeError(path, f"server status {status[:40]!r} is neither {ENABLED} nor {DISABLED}")
    vacant: float | None = None
    for line in lines[1:]:
        if line.startswith(_VACANT_SINCE):
            try:
                vacant = float(line[len(_VACANT_SINCE) :])
            except ValueError:
                raise CorruptNodeError(path, f"bad {line[:60]!r}") from None
    return ServerRecord(ip, status == ENABLED, vacant, version)


def encode_server(enabled: bool, vacant_since: float | None = None) -> bytes:
    status = ENABLED if enabled else DISABLED
    if vacant_since is None:
        return status.encode()
    return f"{status}\n{_VACANT_SINCE}{vacant_since!r}".encode()


@dataclass(frozen=True)
class InstanceRecord:
    """``instances/{id}``, written by the instance at each registration."""

    id: str
    ip: str
    pid: int | None = None
    #: UNIX time of the registration
    started: float | None = None
    version: int = -1


def instance_record(instance_id: str, raw: bytes | None, version: int = -1) -> InstanceRecord:
    """Decode ``instances/{id}``; a value that is not the JSON we write still names the
    instance, and its ip is taken from the id (``{ip}@-@{pid}``) as ElasticJob does."""
    fallback = instance_id.split("@-@", 1)[0]
    doc: object = None
    if raw:
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            doc = None
    if not isinstance(doc, dict):
        return InstanceRecord(instance_id, fallback, version=version)
    ip = doc.get("ip")
    pid = doc.get("pid")
    started = doc.get("started")
    return InstanceRecord(
        instance_id,
        ip if isinstance(ip, str) and ip else fallback,
        pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
        float(started) if isinstance(started, int | float) and not isinstance(started, bool) else None,
        version,
    )


def disabled_items(path: str, raw: bytes | None) -> frozenset[int]:
    """Decode ``sharding/disabled`` (item ranges, ``"3,7-9"``)."""
    if not raw:
        return frozenset()
    try:
        return frozenset(decode_items(raw.decode("utf-8")))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CorruptNodeError(path, f"disabled items: {exc}") from None


@dataclass(frozen=True)
class JobState:
    """One job's nodes, decoded (module docstring). ``nodes`` keeps every node as stored."""

    paths: JobPaths
    nodes: Mapping[str, Node]
    instances: Mapping[str, InstanceRecord] = field(default_factory=dict)
    servers: Mapping[str, ServerRecord] = field(default_factory=dict)
    leader: str | None = None
    #: the reason text of ``leader/sharding/necessary`` (None: no resharding flagged)
    resharding_flag: str | None = None
    assignment: Assignment | None = None
    disabled_items: frozenset[int] = frozenset()
    #: instance id -> its running mark
    running: Mapping[str, RunTrace] = field(default_factory=dict)
    failover: FailoverQueue = field(default_factory=FailoverQueue)
    #: instance id -> the trigger request waiting for it
    triggers: Mapping[str, bytes] = field(default_factory=dict)
    #: instance id -> the operator's shutdown request waiting for it
    shutdowns: Mapping[str, bytes] = field(default_factory=dict)
    problems: tuple[CorruptNodeError, ...] = ()

    @property
    def job(self) -> str:
        return self.paths.job

    @property
    def exists(self) -> bool:
        """The job has a configuration node (what makes a subtree a job)."""
        return self.paths.config in self.nodes

    @property
    def config(self) -> Node | None:
        """The configuration node as stored (the scheduler decodes it: ``JobConfig``)."""
        return self.nodes.get(self.paths.config)

    @property
    def resharding(self) -> bool:
        """A resharding is flagged or under way."""
        return self.resharding_flag is not None or (
            self.assignment is not None and self.assignment.state is AssignmentState.RESHARDING
        )

    @property
    def assignment_version(self) -> int | None:
        node = self.nodes.get(self.paths.assignment)
        return None if node is None else node.version

    def server_of(self, instance_id: str) -> ServerRecord:
        ip = self.instances[instance_id].ip
        return self.servers.get(ip, ServerRecord(ip, True))

    @classmethod
    def read(cls, reg: RegistryCenter, job: str) -> JobState:
        """The job as the registry holds it now (one ``read_tree``)."""
        paths = JobPaths(job)
        return cls.decode(paths, reg.read_tree(paths.root))

    @classmethod
    def decode(cls, paths: JobPaths, nodes: Mapping[str, Node]) -> JobState:
        problems: list[CorruptNodeError] = []

        def children(of: str) -> dict[str, Node]:
            return {basename(p): n for p, n in nodes.items() if parent(p) == of}

        def value(path: str) -> bytes | None:
            node = nodes.get(path)
            return None if node is None else node.value

        servers: dict[str, ServerRecord] = {}
        for ip, node in children(paths.servers).items():
            try:
                servers[ip] = server_status(paths.server(ip), node.value, node.version)
            except CorruptNodeError as exc:
                problems.append(exc)
        running: dict[str, RunTrace] = {}
        for instance_id, node in children(paths.running).items():
            try:
                running[instance_id] = RunTrace.decode(paths.running_of(instance_id), node.value)
            except CorruptNodeError as exc:
                problems.append(exc)
        assignment = None
        raw_assignment = value(paths.assignment)
        if raw_assignment is not None:
            try:
                assignment = Assignment.decode(paths.assignment, raw_assignment)
            except CorruptNodeError as exc:
                problems.append(exc)
        disabled: frozenset[int] = frozenset()
        try:
            disabled = disabled_items(paths.disabled_items, value(paths.disabled_items))
        except CorruptNodeError as exc:
            problems.append(exc)
        failover = FailoverQueue()
        try:
            failover = FailoverQueue.decode(paths.failover_items, value(paths.failover_items))
        except CorruptNodeError as exc:
            problems.append(exc)
        leader = value(paths.leader)
        flag = value(paths.necessary)
        return cls(
            paths=paths,
            nodes=dict(nodes),
            instances={
                i: instance_record(i, n.value, n.version) for i, n in children(paths.instances).items()
            },
            servers=servers,
            leader=None if leader is None else leader.decode("utf-8", "replace"),
            resharding_flag=None if flag is None else flag.decode("utf-8", "replace"),
            assignment=assignment,
            disabled_items=disabled,
            running=running,
            failover=failover,
            triggers={i: n.value for i, n in children(paths.triggers).items()},
            shutdowns={i: n.value for i, n in children(paths.shutdowns).items()},
            problems=tuple(problems),
        )
