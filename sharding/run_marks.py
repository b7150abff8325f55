"""This instance's running mark of one job: the fencing point of every run.

A run starts only once ONE transaction has applied three things together: the job's
assignment node is still at the version the run was planned with (no resharding began),
this instance's registration node is still the one it wrote (its session is the live
one), and this instance's mark ``running/{id}`` is created (ephemeral, or persistent
with failover so that a crash leaves the trace the leader turns into failover work).
Failover work claimed by the run leaves the queue in the same transaction, at the
version read, so two claimers never both succeed.

The transaction is planned here (``plan``) and applied either at once (``mark_running``)
or by the scheduler's group commit together with other jobs' marks; a refusal is mapped
to a ``FencedOut`` by the op the registry names, never by its position.

Invariants:

- Only this instance writes its mark, and one run of a job at a time is marked: a mark
  found in place while none is held is stale — left by a write whose outcome was unknown
  or a removal that failed — and is removed at the version read, never blindly.
- A write whose outcome is unknown sets ``in_doubt``: the mark may exist with nothing
  running, and would refuse every later run and hold up every resharding that waits for
  runs, until ``remove_stale_mark`` clears it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from registry.errors import BadVersionError, NoNodeError, RegistryError, TransactionError
from registry.protocol import Check, Create, Delete, Node, Op, RegistryCenter, Set
from registry.recipes.cache import TreeCache
from sharding.assignment import Assignment, CorruptNodeError
from sharding.errors import FencedOut, FenceReason
from sharding.failover import FailoverEntry, FailoverQueue, encode_trace
from sharding.layout import JobPaths

__all__ = ["CurrentAssignment", "MarkRequest", "MarksOwner", "RunMark", "RunMarks"]

log = logging.getLogger("sharding")

class MarksOwner(Protocol):
    """What a job's marks ask of the service that owns them. One reference to the owner:
    a bound method per question cost 80 bytes a job each, at thousands of jobs."""

    @property
    def registration_version(self) -> int | None:
        """This instance's registration node's version as it wrote it; None when it is
        not registered."""

    @property
    def marks_persist(self) -> bool:
        """A mark is a persistent node (failover on: a crash leaves its trace), not an
        ephemeral one."""

    def report_corrupt(self, path: str, version: int, problem: str) -> None:
        """A node that does not decode, reported once per version."""


@dataclass(frozen=True, slots=True)
class CurrentAssignment:
    """An assignment and the registry version it was read at (the fencing token): READY
    wherever a run is fenced by it (``ShardingService.ready``)."""

    assignment: Assignment
    version: int

    @property
    def epoch(self) -> int:
        return self.assignment.epoch


@dataclass(frozen=True, slots=True)
class RunMark:
    epoch: int
    items: tuple[int, ...]
    fire_time: float
    path: str


@dataclass(eq=False, slots=True)
class MarkRequest:
    """A planned mark: the transaction's ops, each role named, and the mark it makes.
    Never changed once made; not frozen, as a frozen dataclass pays a call per field to be
    made (seven here), and every fire makes one."""

    ops: tuple[Op, ...]
    mark: RunMark
    claimed: tuple[FailoverEntry, ...]
    assignment_check: Check
    registration_check: Check
    create: Create
    queue_update: Set | None


class RunMarks:
    """Plans, adopts and clears this instance's running mark of one job (module docstring)."""

    # one per job, thousands per process: no attribute dict (a new attribute goes here)
    __slots__ = (
        "_cache",
        "_fence",
        "_own_instance",
        "_owner",
        "_paths",
        "_reg",
        "held",
        "in_doubt",
        "last_fire",
        "path",
    )

    def __init__(
        self,
        reg: RegistryCenter,
        paths: JobPaths,
        instance_id: str,
        cache: TreeCache,
        owner: MarksOwner,
    ) -> None:
        self._reg = reg
        self._paths = paths
        self.path = paths.running_of(instance_id)
        self._own_instance = paths.instance(instance_id)
        self._cache = cache
        self._owner = owner
        #: the fence checks of the last mark, by (assignment version, registration version):
        #: the same two ops fire after fire until either changes
        self._fence: tuple[int, int, Check, Check] | None = None
        #: the mark of the run in progress, between adopt and clear
        self.held: RunMark | None = None
        self.in_doubt = False
        #: the latest fire time marked (not failover work): the trace a clean stop leaves
        self.last_fire: float | None = None

    # -- marking --------------------------------------------------------------------------
    def plan(
        self,
        current: CurrentAssignment,
        items: Sequence[int],
        fire_time: float,
        claimed: Sequence[FailoverEntry] = (),
    ) -> MarkRequest:
        """The fenced mark's transaction; ``FencedOut`` when it cannot even be planned."""
        version = self._owner.registration_version
        if version is None:
            raise FencedOut(
                f"job {self._paths.job}: instance node {self._own_instance} is not registered",
                FenceReason.REGISTRATION,
            )
        fence = self._fence
        if fence is None or fence[0] != current.version or fence[1] != version:
            fence = self._fence = (
                current.version,
                version,
                Check(self._paths.assignment, current.version),
                Check(self._own_instance, version),
            )
        trace = encode_trace("running", items, fire_time, bool(claimed))
        create = Create(self.path, trace, ephemeral=not self._owner.marks_persist)
        queue_update: Set | None = None
        if claimed:
            node = self._cache.get_node(self._paths.failover_items)
            if node is None:
                raise FencedOut(f"job {self._paths.job}: failover entries already taken", FenceReason.ASSIGNMENT)
            remaining = self.queue(node).without(claimed)
            queue_update = Set(self._paths.failover_items, remaining.encode(), node.version)
        ops: tuple[Op, ...] = (fence[2], fence[3], create) if queue_update is None else (
            fence[2], fence[3], create, queue_update
        )
        mark = RunMark(current.epoch, tuple(items), fire_time, self.path)
        return MarkRequest(ops, mark, tuple(claimed), fence[2], fence[3], create, queue_update)

    def doomed(self, request: MarkRequest) -> TransactionError | None:
        """The refusal ``request`` is sure to meet, known without a round trip: the
        registration its fence checks is no longer this instance's (the session that held
        it ended, or a new one registered since). What the server would answer: the
        registration check fails."""
        check = request.registration_check
        version = self._owner.registration_version
        if version == check.version:
            return None
        cause: RegistryError = NoNodeError(check.path) if version is None else BadVersionError(check.path, check.version)
        return TransactionError.for_op(request.ops.index(check), check, cause)

    def adopt(self, request: MarkRequest) -> RunMark:
        """The request's transaction was applied: its mark is held."""
        self.in_doubt = False
        self.held = request.mark
        if not request.claimed:
            fire = request.mark.fire_time
            self.last_fire = fire if self.last_fire is None else max(self.last_fire, fire)
        return request.mark

    def answered_late(self, request: MarkRequest) -> FencedOut:
        """``request`` was applied, but its answer came after the session's deadline: not
        held, and in doubt (the mark stays at the server while the session lasts)."""
        self.in_doubt = True
        return FencedOut(
            f"job {self._paths.job}: run of fire {request.mark.fire_time:.3f} not started, its mark was "
            "answered after the session's deadline",
            FenceReason.REGISTRY,
        )

    def refusal(self, request: MarkRequest, error: BaseException) -> FencedOut:
        """The ``FencedOut`` that ``error`` (from applying ``request``) means; an error
        that leaves the outcome unknown puts the mark in doubt."""
        job = self._paths.job
        if isinstance(error, TransactionError):
            op = error.op
            if op is request.assignment_check:
                return FencedOut(f"job {job}: run refused, the assignment changed", FenceReason.ASSIGNMENT)
            if op is request.registration_check:
                return FencedOut(
                    f"job {job}: run refused, this instance's registration is gone", FenceReason.REGISTRATION
                )
            if op is request.create:
                return FencedOut(f"job {job}: run refused, already running", FenceReason.RUNNING)
            if op is not None and op is request.queue_update:
                return FencedOut(
                    f"job {job}: run refused, the failover queue changed", FenceReason.ASSIGNMENT
                )
            return FencedOut(f"job {job}: run refused: {error}", FenceReason.REGISTRY)
        self.in_doubt = True  # the server may have applied it all the same
        return FencedOut(f"job {job}: run refused, registry unavailable ({error})", FenceReason.REGISTRY)

    def mark_running(
        self,
        current: CurrentAssignment,
        items: Sequence[int],
        fire_time: float,
        *,
        claimed: Sequence[FailoverEntry] = (),
    ) -> RunMark:
        """Plan and apply the fenced mark at once; ``FencedOut`` if refused (nothing ran).
        A mark found in place while none is held is removed and the mark tried once more."""
        for attempt in (0, 1):
            request = self.plan(current, items, fire_time, claimed)
            try:
                self._reg.transaction(list(request.ops))
            except RegistryError as exc:
                refused = self.refusal(request, exc)
                if refused.reason is FenceReason.RUNNING and attempt == 0 and self.remove_if_stale():
                    continue
                raise refused from None
            return self.adopt(request)
        raise AssertionError("unreachable: the second attempt returns or raises")

    # -- clearing -------------------------------------------------------------------------
    def clear_ops(self, mark: RunMark) -> list[Op]:
        """The mark's removal as a transaction (no read of its children: it has none)."""
        return [Delete(mark.path)]

    def cleared(self, error: BaseException | None) -> None:
        """The removal of the held mark ended: ``error`` None, or the mark was already gone
        (its session ended), clears it; another error leaves it in doubt."""
        self.held = None
        gone = isinstance(error, TransactionError) and error.op is not None
        if error is None or gone:
            self.in_doubt = False
            return
        self.in_doubt = True
        log.warning(
            "job %s: clearing the running mark failed (%s); it is removed once the registry answers",
            self._paths.job,
            error,
        )

    def clear_running(self, mark: RunMark) -> None:
        try:
            self._reg.transaction(self.clear_ops(mark))
        except RegistryError as exc:
            self.cleared(exc)
        else:
            self.cleared(None)

    def may_be_in_place(self) -> bool:
        """Whether this instance's mark may be in the registry: one is held, or a write or
        removal of it ended with its outcome unknown. Only this instance writes it, so
        otherwise none of this process is there (a trace an earlier process left under the
        same id is the leader's to remove when it reshards, and a fire's removes it first)."""
        return self.held is not None or self.in_doubt

    # -- stale marks ----------------------------------------------------------------------
    def remove_stale_mark(self) -> bool:
        """Remove this instance's mark if a write in doubt may have left it; the caller
        guarantees nothing of this job runs here. True once nothing is in doubt."""
        if not self.in_doubt or self.held is not None:
            return True
        self.remove_if_stale()
        self.in_doubt = False
        return True

    def remove_if_stale(self) -> bool:
        """Delete the mark at the version read if none is held; True if one was removed."""
        if self.held is not None:
            return False
        node = self._reg.get_node(self.path)
        if node is None:
            return False
        try:
            self._reg.transaction([Delete(self.path, node.version)])
        except TransactionError:
            return False
        log.warning(
            "job %s: removed a stale running mark of this instance (%d bytes)", self._paths.job, len(node.value)
        )
        return True

    # -- the failover queue -----------------------------------------------------------------
    def queue(self, node: Node) -> FailoverQueue:
        try:
            return FailoverQueue.decode(self._paths.failover_items, node.value)
        except CorruptNodeError as exc:
            self._owner.report_corrupt(self._paths.failover_items, node.version, exc.problem)
            return FailoverQueue()

    def queue_additions(self, node: Node | None, entries: Sequence[FailoverEntry], total: int) -> list[Create | Set]:
        """The write that adds ``entries`` to the queue as ``node`` holds it (None: no
        queue yet): a create, or a set at the version read, so a change made since fails
        it; none when every entry is there already."""
        queue = FailoverQueue() if node is None else self.queue(node)
        merged = queue.merged(entries, total)
        if merged == queue:
            return []
        path = self._paths.failover_items
        return [Create(path, merged.encode())] if node is None else [Set(path, merged.encode(), node.version)]
