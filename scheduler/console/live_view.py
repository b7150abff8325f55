"""A watch-fed view of a whole namespace: what ``Cluster`` reports, without a registry
round trip per page.

``Cluster.jobs()`` reads the whole namespace on every call (hundreds of milliseconds at a
hundred jobs on ZooKeeper); a console refreshing every few seconds for several people
would be that cost again and again. ``LiveView`` keeps ONE ``TreeCache`` over the
namespace root and decodes each job with ``JobState.decode`` — the read model
``Cluster`` uses — into the same views
(``brief_of``, ``detail_of``, ``servers_of``), so the console shows exactly what
``Cluster`` would, only possibly a moment behind. Running marks are left out of the
cache (``layout.is_running_marks``: written twice per fire by every instance, following
them would cost the console a watch re-read per mark on ZooKeeper); the one view that
shows them, a job's detail, reads that job's marks when it is asked for (one call).

Invariants: a job is decoded again only after an event under its subtree (a listener
marks it dirty; the mark is taken off BEFORE its nodes are read, so an event that lands
during the read marks it again and nothing is missed); a node that does not decode is a
problem of its job's view, never an error of the page (``JobState``'s rule).
Hazard: reads are as current as the watch; a write decided from them must be versioned
(``Cluster``'s writes are).
"""

from __future__ import annotations

import threading
import time

from registry.paths import join
from registry.protocol import Event, Node, RegistryCenter
from registry.recipes.cache import TreeCache
from scheduler.cluster_views import JobBrief, JobDetail, ServerBrief, brief_of, detail_of, servers_of
from sharding.job_state import JobState
from sharding.layout import JobPaths, is_leaf, is_running_marks
from sharding.operations import NoSuchJob

__all__ = ["LiveView"]


class LiveView:
    """The namespace of ``reg`` as ``Cluster`` reports it, kept current by one watch."""

    def __init__(self, reg: RegistryCenter) -> None:
        self._reg = reg
        self._cache = TreeCache(reg, "/", exclude=is_running_marks, leaves=is_leaf)
        self._lock = threading.Lock()
        #: job name -> its decoded state, while no event touched its subtree since
        self._decoded: dict[str, JobState] = {}
        self._dirty: set[str] = set()
        self._cache.add_listener(self._on_event)

    def start(self, timeout: float = 30.0) -> LiveView:
        self._cache.start(timeout)
        return self

    def close(self) -> None:
        self._cache.close()

    def __enter__(self) -> LiveView:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reads ----------------------------------------------------------------------------
    def states(self) -> dict[str, JobState]:
        """Every job of the namespace (a subtree with a configuration), by name."""
        states: dict[str, JobState] = {}
        for name in self._cache.children("/"):
            state = self._state(name)
            if state is not None:
                states[name] = state
        with self._lock:  # forget jobs that are gone
            for gone in set(self._decoded) - set(states):
                self._decoded.pop(gone, None)
        return states

    def state(self, name: str) -> JobState:
        state = self._state(name)
        if state is None:
            raise NoSuchJob(name)
        return state

    def jobs(self) -> list[JobBrief]:
        return [brief_of(state) for state in self.states().values()]

    def job(self, name: str) -> JobDetail:
        state = self.state(name)
        marks = self._reg.read_tree(state.paths.running)
        if marks:
            state = JobState.decode(state.paths, {**state.nodes, **marks})
        return detail_of(state)

    def servers(self) -> list[ServerBrief]:
        return servers_of(self.states(), time.time())

    def config_version(self, name: str) -> int | None:
        node = self.state(name).config
        return None if node is None else node.version

    # -- internals ------------------------------------------------------------------------
    def _state(self, name: str) -> JobState | None:
        try:
            paths = JobPaths(name)
        except ValueError:
            return None  # not a job's name: not a job
        with self._lock:
            cached = self._decoded.get(name)
            if cached is not None and name not in self._dirty:
                return cached
            self._dirty.discard(name)  # before the read: a later event marks it again
        nodes = self._subtree(paths.root)
        if paths.config not in nodes:
            with self._lock:
                self._decoded.pop(name, None)
            return None
        state = JobState.decode(paths, nodes)
        with self._lock:
            self._decoded[name] = state
        return state

    def _subtree(self, root: str) -> dict[str, Node]:
        nodes: dict[str, Node] = {}
        pending = [root]
        while pending:
            path = pending.pop()
            node = self._cache.get_node(path)
            if node is not None:
                nodes[path] = node
            pending.extend(join(path, child) for child in self._cache.children(path))
        return nodes

    def _on_event(self, event: Event) -> None:
        parts = event.path.split("/", 2)
        if len(parts) < 2 or not parts[1]:
            return
        with self._lock:
            self._dirty.add(parts[1])
