"""This instance's membership in one job: its server's status node ``servers/{ip}`` and
its ephemeral registration ``instances/{id}``.

The registration is what fences a run: every running mark checks the registration node
at the version this instance wrote, so a session that expired (its ephemeral node gone)
or a node that someone else replaced can start nothing.

Invariants:

- An instance never shuts itself down because its node vanished (ElasticJob does): it
  registers again on the live session, with the same value.
- Leaving removes only the node this instance wrote (its version): never another
  session's node of the same id.
- A node holding a value this instance wrote is its own, and adopted (``lost``).
- A node of the same id held by another session (a previous process with the same id
  whose session has not expired yet) is waited out, bounded by twice the session
  timeout, never overwritten: the server removes it when that session ends. The wait
  ends early when the owner says the instance is ``leaving``: a shutdown joins the
  registration under way, and must not sit out that bound.
- Read-your-writes: ``register`` returns once the job's cache (this instance's only read
  path) shows the node, so a leader computing right after does not leave itself out.
- An operator's disable lasts: ``servers/{ip}`` is written only when absent (with the
  state the configuration asks for); a status already there is kept across restarts, and
  only the leader's vacancy stamp is taken off it (a versioned write: an operator's
  change in between is never overwritten).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from registry.errors import BadVersionError, NodeExistsError, NoNodeError, RegistryError, TransactionError
from registry.protocol import Create, Delete, Node, Op, RegistryCenter, Set
from registry.recipes.batch import Commit
from registry.recipes.cache import TreeCache
from registry.recipes.versioned import update
from registry.shared_values import shared_value
from sharding.assignment import CorruptNodeError
from sharding.errors import ShardingError
from sharding.instance import InstanceIdentity
from sharding.job_state import ServerRecord, encode_server, server_status
from sharding.layout import JobPaths

__all__ = ["Membership"]

log = logging.getLogger("sharding")

#: how many of the values this instance wrote lately it recognises as its own
_WRITTEN_KEPT = 8


class MembershipOwner(Protocol):
    """What a membership asks of the service that owns it. One reference to the owner: a
    bound method was 80 bytes a job, at thousands of jobs (as ``run_marks.MarksOwner``)."""

    def leaving(self) -> bool:
        """The instance is stopping: no registration is wanted any more (a registration
        waiting out a stale node ends)."""
        ...


class Membership:
    """Registers ``identity`` (and its server) in ``paths``' job (module docstring)."""

    # one per job, thousands per process: no attribute dict (a new attribute goes here)
    __slots__ = (
        "_cache",
        "_commit",
        "_lock",
        "_owner",
        "_paths",
        "_reg",
        "_value",
        "_written",
        "identity",
        "path",
        "server_path",
        "version",
    )

    def __init__(
        self,
        reg: RegistryCenter,
        paths: JobPaths,
        identity: InstanceIdentity,
        cache: TreeCache,
        *,
        commit: Commit | None = None,
        owner: MembershipOwner | None = None,
    ) -> None:
        self._reg = reg
        self._commit = reg.transaction if commit is None else commit
        self._owner = owner
        self._paths = paths
        self.identity = identity
        self._cache = cache
        self.path = paths.instance(identity.instance_id)
        self.server_path = paths.server(identity.ip)
        self._lock = threading.Lock()
        #: the version and value of the node as this instance last wrote it
        self.version: int | None = None
        self._value: bytes | None = None
        #: the values this instance wrote lately, each its own (it holds a timestamp): a
        #: node holding one is this instance's, adopted and never waited out (``register``);
        #: a tuple, not a deque: a deque's first block alone is ~600 bytes, per job
        self._written: tuple[bytes, ...] = ()

    @property
    def registered(self) -> bool:
        """This instance's node, as last written by it, is in the registry (per the cache)."""
        version = self.version
        return version is not None and self._cache.version(self.path) == version

    def lost(self) -> None:
        """The session ended, and this instance's ephemeral node with it, whatever the
        cache still shows: not registered until ``register_again``. The cache lags the
        registry most right after a new session (every watch catching up), and fires
        that took its stale node for a registration each had its fenced mark refused,
        one round trip apiece, ahead of the re-registrations in the group commit.

        The next registration writes a fresh value, which identifies the node: the cache
        shows when it is there, with no read of it (``_written_version``). No lock: the
        session's listener must not wait behind a registration stuck on the dead
        session's round trips.

        Hazard: session states and watch events reach this client on threads of their
        own, so the loss may be heard after the cache reported the node gone and the
        instance registered again in the new session. The node it then finds holds a
        value it wrote: ``register`` adopts it. Waiting it out as another session's would
        wait for a node that lives as long as this session, fenced out of every run. (A
        node of the lost session itself, still there while the server has not yet ended
        that session, is adopted too: it vanishes with that session, and the instance
        registers again, as for any vanished node.)"""
        self.version = None
        self._value = None

    def join(self, *, server_enabled: bool) -> bool:
        """Make sure the server has a status (``server_enabled`` when it has none), then
        register; returns whether the server is enabled (as stored, which wins)."""
        enabled = self.ensure_server(server_enabled)
        # what the cache must show before the election: the server's enabled-ness as stored
        # (a server it does not know yet counts as enabled, so an enabled one waits for nothing)
        self._cache.wait_until(
            lambda: self._cached_server_enabled() == enabled, self._reg.session_timeout, under=self.server_path
        )
        self.register()
        return enabled

    def ensure_server(self, enabled_if_new: bool) -> bool:
        """Create ``servers/{ip}`` if absent, else keep its status and drop a vacancy stamp;
        returns whether the server is enabled."""
        path = self.server_path

        def plan(node: Node | None) -> list[Op]:
            if node is None:
                return [Create(path, encode_server(enabled_if_new))]
            record = _decoded(path, node)
            if record is None or record.vacant_since is None:
                return []  # a corrupt status is left as found (and reads as enabled)
            return [Set(path, encode_server(record.enabled), node.version)]

        cached = self._cache.get_node(path)
        if cached is not None and not plan(cached):
            record = _decoded(path, cached)
            return record is None or record.enabled  # nothing to write: no round trip
        unread = [cached]  # the cache's view first: a new server costs the create alone

        def read() -> Node | None:
            return unread.pop() if unread else self._reg.get_node(path)

        node = update(self._reg, read, plan, what=f"status of {path}", commit=self._commit)
        if node is None:
            return enabled_if_new
        record = _decoded(path, node)
        return record is None or record.enabled

    def _cached_server_enabled(self) -> bool:
        node = self._cache.get_node(self.server_path)
        if node is None:
            return True
        record = _decoded(self.server_path, node)
        return record is None or record.enabled

    def register(self) -> None:
        """Create this instance's ephemeral node, or adopt it if it holds a value this
        instance wrote; wait out a stale one of another session with the same id.
        ``ShardingError`` when it is still held at the bound, or once the owner is ``leaving``."""
        path = self.path
        bound = 2 * self._reg.session_timeout + 5
        deadline = time.monotonic() + bound
        announced = False
        with self._lock:
            while True:
                fresh = self._value is None  # a new value (it holds a timestamp) is ours alone
                # shared: the cache keeps the same object once the node's event comes back
                value = self._value or shared_value(self.identity.node_value())
                # kept before the create: one the server applied but whose answer was lost
                # (a dropped connection) left a node of this value, to be adopted on the
                # next try, not waited out as another session's
                self._value = value
                if value not in self._written:
                    self._written = (*self._written[-(_WRITTEN_KEPT - 1) :], value)
                if not self._created(path, value):
                    node = self._reg.get_node(path)
                    if node is None:
                        continue
                    if node.value in self._written:  # this instance's (``lost``)
                        self._value = node.value
                        self.version = node.version
                        self._adopted(path, node.version)
                        return
                    if self._leaving():
                        raise ShardingError(f"instance node {path} not registered: the instance is stopping")
                    if time.monotonic() > deadline:
                        raise ShardingError(f"instance node {path} is held by another session") from None
                    if not announced:
                        announced = True
                        log.warning(
                            "job %s: instance node %s is held by another session (a process with the "
                            "same instance id); waiting up to %g s for it to go",
                            self._paths.job,
                            path,
                            bound,
                        )
                    # woken by the node's change, or by the cache's wake() once stopping
                    self._cache.wait_until(
                        lambda: self._leaving() or not self._cache.exists(path), 0.5, under=path
                    )
                    continue
                self.version = self._written_version(path, value, fresh)
                return

    def _adopted(self, path: str, version: int) -> None:
        """Read-your-writes for a node this instance wrote, found in place, as for one created."""
        self._cache.wait_until(lambda: self._cache.version(path) == version, self._reg.session_timeout, under=path)

    def _created(self, path: str, value: bytes) -> bool:
        """Create the ephemeral node (in a group commit when the scheduler has one);
        False if it exists."""
        try:
            self._commit([Create(path, value, ephemeral=True)])
        except TransactionError as exc:
            if isinstance(exc.cause, NodeExistsError):
                return False
            raise
        return True

    def _written_version(self, path: str, value: bytes, fresh: bool) -> int | None:
        """The version of the node just created, once the cache shows it. A fresh value
        identifies the node, so the cache's version is read without a round trip; a value
        written before may still be the cache's view of the node this one replaced."""
        seen: list[Node] = []

        def shown() -> bool:
            node = self._cache.get_node(path)
            if node is not None and node.value == value:
                seen[:] = [node]
                return True
            return False

        timeout = self._reg.session_timeout
        if fresh and self._cache.wait_until(shown, timeout, under=path):
            return seen[0].version
        node = self._reg.get_node(path)
        self._cache.wait_until(lambda: self._cache.exists(path), timeout, under=path)
        return None if node is None else node.version

    def register_again(self) -> None:
        """The node vanished, or a new session began: register again unless the node as
        written is still there. Failures are logged; the next change retries."""
        if self.version is not None:
            node = self._reg.get_node(self.path)
            if node is not None and node.version == self.version:
                return
        try:
            self.ensure_server(True)
            self.register()
            log.info("job %s: instance %s registered again", self._paths.job, self.identity.instance_id)
        except (RegistryError, ShardingError):
            if self._leaving():
                return  # stopping: no registration is wanted any more
            log.warning(
                "job %s: re-registration failed; retrying on the next change", self._paths.job, exc_info=True
            )

    def _leaving(self) -> bool:
        return self._owner is not None and self._owner.leaving()

    def leave(self) -> None:
        """Remove this instance's node if it is the one this instance wrote (a versioned
        delete). A node of its id that another session holds (a registration that waited
        it out and failed, or that a shutdown cancelled) is that session's: left alone."""
        version = self.version
        if version is None:
            return  # never registered, or the node went with a lost session
        try:
            self._commit([Delete(self.path, version)])
        except TransactionError as exc:
            if not isinstance(exc.cause, (NoNodeError, BadVersionError)):
                raise


def _decoded(path: str, node: Node) -> ServerRecord | None:
    try:
        return server_status(path, node.value)
    except CorruptNodeError as exc:
        log.error("%s", exc)
        return None
