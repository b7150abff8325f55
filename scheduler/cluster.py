"""``Cluster``: read and steer a live cluster through the registry alone.

Reads: ``jobs()`` and ``servers()`` read the whole namespace with one ``read_tree``,
``job(name)`` one job's subtree; none grows in round trips with instances or items.

Writes: every change is ONE transaction planned from a fresh read (``sharding.operations``)
with the versions it read, made again from a new read when a concurrent writer (another
operator, a resharding leader) got there first; so no change is lost, and a change to a
job that does not exist (or stopped existing meanwhile) is ``NoSuchJob``, never a node
created by accident.

Thread-safe: the registry client is, and a ``Cluster`` keeps no other state.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Any

import registry
from registry.errors import ShardJobError
from registry.paths import parent
from registry.protocol import Event, Op, RegistryCenter, Set
from registry.recipes.versioned import update
from scheduler.cluster_views import (
    JobBrief,
    JobDetail,
    ServerBrief,
    brief_of,
    config_of,
    detail_of,
    servers_of,
)
from scheduler.config import JobConfig
from sharding.assignment import CorruptNodeError
from sharding.job_state import JobState
from sharding.layout import JobPaths, validate_job_name
from sharding.operations import (
    NoSuchJob,
    plan_items,
    plan_remove,
    plan_servers,
    plan_shutdown,
    plan_trigger,
    require_job,
)

__all__ = ["Cluster", "LiveInstances", "NoSuchJob", "StaleConfig"]

#: fields an operator may not change: the name is the job's identity, and the code each
#: instance runs decides the kind and what the kind needs
_FIXED_FIELDS = frozenset({"name", "job_type", "script_command_line", "streaming_process", "error_handler", "overwrite"})


class LiveInstances(ShardJobError):
    """``remove`` refused: the job still has live instances."""


class StaleConfig(ShardJobError):
    """``update_config(expected_version=...)`` refused: the stored configuration changed
    since the caller read it. ``current`` is what is stored now, ``version`` its version."""

    def __init__(self, name: str, expected: int, version: int, current: JobConfig) -> None:
        super().__init__(
            f"job {name!r}: the configuration changed since it was read (version {expected}, now {version}); "
            "nothing written"
        )
        self.current = current
        self.version = version


class Cluster:
    """Reads and steers the jobs of one registry namespace (module docstring)."""

    def __init__(self, url_or_registry: str | RegistryCenter) -> None:
        if isinstance(url_or_registry, str):
            self._reg: RegistryCenter = registry.connect(url_or_registry)
            self._owns = True
        elif isinstance(url_or_registry, RegistryCenter):
            self._reg = url_or_registry
            self._owns = False
        else:
            raise ValueError("Cluster needs a registry URL or a RegistryCenter")
        self._close_lock = threading.Lock()

    @property
    def registry(self) -> RegistryCenter:
        return self._reg

    # -- reads ----------------------------------------------------------------------------
    def states(self) -> dict[str, JobState]:
        """Every job of the namespace, decoded, from one read of the whole tree."""
        tree = self._reg.read_tree("/")
        by_job: dict[str, dict[str, Any]] = {}
        for path, node in tree.items():
            name = path.split("/", 2)[1]
            by_job.setdefault(name, {})[path] = node
        states = {}
        for name, nodes in sorted(by_job.items()):
            try:
                paths = JobPaths(name)
            except ValueError:
                continue  # not a job's name: not a job
            if paths.config in nodes:
                states[name] = JobState.decode(paths, nodes)
        return states

    def state(self, name: str) -> JobState:
        """One job, decoded; ``NoSuchJob`` when it has no configuration."""
        validate_job_name(name)
        state = JobState.read(self._reg, name)
        if not state.exists:
            raise NoSuchJob(name)
        return state

    def jobs(self) -> list[JobBrief]:
        return [brief_of(state) for state in self.states().values()]

    def job(self, name: str) -> JobDetail:
        return detail_of(self.state(name))

    def servers(self) -> list[ServerBrief]:
        return servers_of(self.states(), time.time())

    def config(self, name: str) -> JobConfig:
        """The stored configuration; ``CorruptNodeError`` when it does not decode."""
        state = self.state(name)
        node = state.config
        assert node is not None  # state() checked it exists
        return JobConfig.from_json(state.paths.config, node.value)

    def dump(self, name: str) -> dict[str, Any]:
        """Every node of the job as stored: path -> ``{"version", "ephemeral", "value"}``,
        the value decoded where the layout knows its format (JSON or text), else the raw
        bytes."""
        state = self.state(name)
        return {
            "job": name,
            "nodes": {
                path: {"version": node.version, "ephemeral": node.ephemeral, "value": _decoded(state.paths, path, node.value)}
                for path, node in sorted(state.nodes.items())
            },
            "problems": [str(p) for p in state.problems],
        }

    # -- changes --------------------------------------------------------------------------
    def trigger(self, name: str) -> list[str]:
        """Run the job once now on every live instance (each its own items); returns them."""
        stamp = repr(time.time()).encode()
        state = self._update(name, lambda s: plan_trigger(s, stamp), "trigger")
        return sorted(state.instances)

    def disable(self, name: str, *, server: str | None = None, items: Sequence[int] | None = None) -> None:
        """Disable the job everywhere (every server it knows, and servers that join later:
        the configuration's ``disabled``), on one ``server``, or some ``items``."""
        self._set_enabled(name, False, server, items)

    def enable(self, name: str, *, server: str | None = None, items: Sequence[int] | None = None) -> None:
        """The inverse of ``disable``, with the same scopes."""
        self._set_enabled(name, True, server, items)

    def shutdown(self, name: str, *, instance: str | None = None, timeout: float | None = None) -> list[str]:
        """Ask ``instance`` (default: every live instance) to stop the job gracefully: it
        finishes its running items, leaves, and does not take the job up again until its
        process restarts. Returns the instances asked; with ``timeout``, waits until they
        have left (``TimeoutError`` if not)."""
        stamp = repr(time.time()).encode()

        def plan(state: JobState) -> list[Op]:
            targets = [instance] if instance is not None else sorted(state.instances)
            return plan_shutdown(state, targets, stamp)

        state = self._update(name, plan, "shutdown")
        asked = [instance] if instance is not None else sorted(state.instances)
        if timeout is not None:
            self._wait_gone(name, asked, timeout)
        return asked

    def remove(self, name: str, *, force: bool = False, timeout: float = 60.0) -> None:
        """Delete the job from the registry. Refused (``LiveInstances``) while instances
        run it, unless ``force``: then they are shut down first (waiting up to ``timeout``)."""
        state = self.state(name)
        if state.instances:
            if not force:
                raise LiveInstances(
                    f"job {name!r} has {len(state.instances)} live instance(s) "
                    f"({', '.join(sorted(state.instances))}); shut them down first, or force"
                )
            self.shutdown(name, timeout=timeout)
        self._update(name, plan_remove, "remove")

    def config_version(self, name: str) -> tuple[JobConfig, int]:
        """The stored configuration with its node's version (for ``expected_version``)."""
        state = self.state(name)
        node = state.config
        assert node is not None  # state() checked it exists
        return JobConfig.from_json(state.paths.config, node.value), node.version

    def update_config(self, name: str, /, expected_version: int | None = None, **fields: Any) -> JobConfig:
        """Change fields of the stored configuration, validated as ``add_job`` validates
        (``ValueError`` naming the field), in one write at the version read: two operators
        changing different fields both land. Running instances apply it at once.

        With ``expected_version`` (a version ``config_version`` gave) the change applies
        only to that very configuration: ``StaleConfig`` (with the current one) if it changed
        since, so an edit made from a stale form never lands over someone else's."""
        unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(JobConfig)})
        if unknown:
            raise ValueError(f"no such configuration field: {', '.join(unknown)}")
        fixed = sorted(set(fields) & _FIXED_FIELDS)
        if fixed:
            raise ValueError(f"{', '.join(fixed)}: cannot be changed in the registry (set by each instance's code)")
        result: list[JobConfig] = []

        def plan(state: JobState) -> list[Op]:
            node = state.config
            if node is None:
                raise NoSuchJob(name)
            stored = JobConfig.from_json(state.paths.config, node.value)
            if expected_version is not None and node.version != expected_version:
                raise StaleConfig(name, expected_version, node.version, stored)
            updated = stored.with_changes(**fields)
            result[:] = [updated]
            return [Set(state.paths.config, updated.to_json(), node.version)]

        self._update(name, plan, "config update")
        return result[0]

    # -- lifecycle ------------------------------------------------------------------------
    def close(self) -> None:
        with self._close_lock:
            if self._owns:
                self._owns = False
                self._reg.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------------
    def _update(self, name: str, plan: Callable[[JobState], Sequence[Op]], what: str) -> JobState:
        validate_job_name(name)

        def read() -> JobState:
            return JobState.read(self._reg, name)

        return update(self._reg, read, plan, what=f"job {name}: {what}")

    def _set_enabled(self, name: str, enabled: bool, server: str | None, items: Sequence[int] | None) -> None:
        if server is not None and items is not None:
            raise ValueError("give a server or items, not both")

        def plan(state: JobState) -> list[Op]:
            check = require_job(state)
            config = config_of(state)
            if items is not None:
                total = config.sharding_total_count if config is not None else _assigned_total(state)
                return [check, *plan_items(state, list(items), not enabled, total)]
            if server is not None:
                known = set(state.servers) | {r.ip for r in state.instances.values()}
                if server not in known:
                    raise ValueError(
                        f"job {name!r} has no server {server!r} (servers: {', '.join(sorted(known)) or 'none'})"
                    )
                return [check, *plan_servers(state, [server], enabled)]
            ops: list[Op] = []
            node = state.config
            assert node is not None  # require_job checked it
            if config is None:
                raise CorruptNodeError(state.paths.config, "configuration does not decode; cannot change it")
            if config.disabled == enabled:  # the flag new servers start with
                updated = config.with_changes(disabled=not enabled)
                ops.append(Set(state.paths.config, updated.to_json(), node.version))
            else:
                ops.append(check)
            everywhere = set(state.servers) | {r.ip for r in state.instances.values()}
            return [*ops, *plan_servers(state, everywhere, enabled)]

        self._update(name, plan, "enable" if enabled else "disable")

    def _wait_gone(self, name: str, instances: Iterable[str], timeout: float) -> None:
        paths = JobPaths(name)
        waiting = set(instances)
        changed = threading.Event()

        def on_event(event: Event) -> None:
            if parent(event.path) == paths.instances:
                changed.set()

        watch = self._reg.watch(paths.instances, on_event)
        try:
            deadline = time.monotonic() + timeout
            while waiting & set(self._reg.children(paths.instances)):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    left = sorted(waiting & set(self._reg.children(paths.instances)))
                    raise TimeoutError(f"job {name!r}: instances {left} still live after {timeout:g}s")
                changed.wait(min(remaining, 1.0))
                changed.clear()
        finally:
            watch.cancel()


def _assigned_total(state: JobState) -> int:
    if state.assignment is None:
        raise CorruptNodeError(state.paths.config, "configuration does not decode and no assignment gives the count")
    return state.assignment.total


def _decoded(paths: JobPaths, path: str, value: bytes) -> Any:
    """JSON where the layout stores JSON, text where it stores text; the raw bytes when
    the value is not what the layout says (or the node is not in the layout)."""
    json_node = path in (paths.config, paths.assignment, paths.failover_items) or parent(path) in (
        paths.instances,
        paths.running,
    )
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return value
    if not json_node:
        return text
    try:
        return json.loads(text)
    except ValueError:
        return value
