"""Transactions on ZooKeeper: a caller's ops become one atomic kazoo multi request.

ZooKeeper's multi knows nothing of missing parents or subtrees, so the plan adds a Create
for every missing parent of a Create op (skipping those an earlier op makes) and expands
each Delete into deletes of every descendant, deepest first, then the node itself with
its version check.

The first attempt reads nothing: it assumes every parent exists and every deleted node is
a leaf, which is what the hot path writes (a running mark under its job's ``running``
node, and its removal), so a transaction costs ONE request on the wire. Only when the
server answers that the assumption failed, and so applied nothing, is the plan made
again, reading only what failed: the parents when a Create found one missing (or one
appeared), the deleted subtrees when a Delete found a child. A shared transaction of a
group commit mixes many callers' ops: one job's first mark, whose ``running`` node is
not there yet, must not make the next plan read the subtree of every mark the same batch
removes: a round trip each, which the whole batch waits for (and fails with, when a busy
server does not answer in time).
Invariants kept here:

- the caller learns the failing op by its own index (``TxnOpFailed``), never by a
  position in the expanded request;
- a failure caused by the expansion racing a concurrent change (a parent appeared or
  vanished, a child appeared below a deleted node) re-plans a few times, because the
  server answered and so applied nothing; a caller op's own failure is reported at once;
- a request larger than ZooKeeper's ``jute.maxbuffer`` is refused before it is sent:
  past it the server drops the connection and the client only sees ConnectionLoss.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

from kazoo.exceptions import (
    BadVersionError as KzBadVersion,
)
from kazoo.exceptions import (
    NodeExistsError as KzNodeExists,
)
from kazoo.exceptions import (
    NoNodeError as KzNoNode,
)
from kazoo.exceptions import (
    NotEmptyError,
    RolledBackError,
    RuntimeInconsistency,
)
from kazoo.protocol.serialization import CheckVersion, SetData, Transaction
from kazoo.protocol.serialization import Create as KzCreate
from kazoo.protocol.serialization import Delete as KzDelete
from kazoo.security import OPEN_ACL_UNSAFE

from registry.backends.base import OpFailure, TxnOpFailed
from registry.backends.zookeeper_io import ZkIO
from registry.errors import RegistryError, TransactionError
from registry.paths import ancestors
from registry.protocol import Check, Create, Delete, Op, Set

__all__ = ["JUTE_MAX_BUFFER", "run_transaction"]

#: ZooKeeper's default limit on one request's length (the 4-byte length prefix excluded).
JUTE_MAX_BUFFER = 0xFFFFF
_REQUEST_HEADER = 8  # xid and op type, ahead of the multi body
_ATTEMPTS = 5  # one optimistic plan; re-plans for parents (trusting, then not) and subtrees
#: parents remembered as existing (``ZkIO.known_parents``), at most; then forgotten at once
_KNOWN_PARENTS = 100_000


class _Step(NamedTuple):
    """One request op: which caller op it serves, and whether the plan added it."""

    op_index: int
    path: str
    expansion: bool
    op_type: type


class _Replan(Exception):
    """The multi failed because the plan went stale; nothing was applied."""

    def __init__(self, step: _Step, reason: str) -> None:
        super().__init__(reason)
        self.step = step
        self.reason = reason


def run_transaction(io: ZkIO, ops: list[Op], client_path: Callable[[str], str]) -> None:
    """Apply ``ops`` (stored paths) atomically or raise ``TxnOpFailed`` / a registry error."""
    last: _Replan | None = None
    parents = _Reads.NONE  # what the next plan learns of the Creates' parents
    subtrees = False  # whether it reads the subtrees of the Deletes
    for attempt in range(_ATTEMPTS):
        request, steps = _plan(io, ops, parents=parents, subtrees=subtrees)
        _check_size(request, steps)
        try:
            io.write(
                ops[0].path, functools.partial(_commit, io, request, steps), action="apply a transaction on"
            )
        except _Replan as stale:
            last = stale
            if stale.step.op_type is Create:  # a parent missing, or one appeared
                # the first re-plan trusts the parents known to exist; a later one reads them all
                parents = _Reads.ALL if parents is not _Reads.NONE else _Reads.UNKNOWN
            else:  # a child below a deleted node, or a node of its subtree gone
                subtrees = True
            continue
        if attempt:  # the hot path's transactions commit at once: nothing to learn there
            _learn(io.known_parents, ops, steps)
        return
    assert last is not None
    step = last.step
    if step.op_type is Create and last.reason == "no_node" and not step.expansion:
        raise TxnOpFailed(step.op_index, OpFailure.NO_NODE)
    raise TransactionError(
        f"transaction op {step.op_index} kept racing concurrent changes at {client_path(step.path)} "
        f"({last.reason}); nothing was applied",
        index=step.op_index,
    )


class _Reads(enum.Enum):
    """What a plan reads of the parents of its Creates."""

    NONE = "assume every parent exists"
    UNKNOWN = "read those neither known nor watched"
    ALL = "read them all"


def _plan(io: ZkIO, ops: list[Op], *, parents: _Reads, subtrees: bool) -> tuple[Any, list[_Step]]:
    """The kazoo multi request of ``ops``, and what each of its ops stands for. Without
    parents read, every parent is assumed to exist; without subtrees read, every deleted
    node is assumed a leaf."""
    read_parents = parents is not _Reads.NONE
    present: dict[str, bool] = {}
    below_deleted: dict[str, list[str]] = {}
    if read_parents or subtrees:
        wanted = sorted({a for op in ops if isinstance(op, Create) for a in ancestors(op.path)}) if read_parents else []
        if parents is _Reads.UNKNOWN:
            # the parents earlier re-plans made or found, then what this client's tree
            # watches have reported: a start of N jobs reads none of its new parents
            known, watched = io.known_parents, io.watched_existence
            unread: list[str] = []
            for p in wanted:
                answer = True if p in known else watched(p)
                if answer is None:
                    unread.append(p)
                else:
                    present[p] = answer
            wanted = unread
        delete_roots = [op.path for op in ops if isinstance(op, Delete)] if subtrees else []

        def read(deadline: float) -> tuple[dict[str, bool], dict[str, list[str]]]:
            pending = [(p, io.client.exists_async(p)) for p in wanted]
            found = {p: io.wait(r, deadline) is not None for p, r in pending}
            return found, {p: io.subtree(p, deadline) for p in delete_roots}

        found, below_deleted = io.read(ops[0].path, read)
        present.update(found)
    planned: dict[str, bool] = {}  # existence after the ops planned so far
    # kazoo's request ops are built directly rather than through TransactionRequest's
    # methods, which check every argument and log every op: a fire's mark is a few ops of
    # a shared transaction, and those checks were most of what planning one cost. Paths
    # are the server's own (this backend uses no kazoo chroot); a created node gets the
    # client's default ACL, as TransactionRequest.create would give it.
    acl = io.client.default_acl or OPEN_ACL_UNSAFE
    out: list[Any] = []
    steps: list[_Step] = []
    for index, op in enumerate(ops):
        if isinstance(op, Create):
            if read_parents:  # else every parent is assumed to exist
                for ancestor in ancestors(op.path):
                    if not planned.get(ancestor, present.get(ancestor, False)):
                        out.append(KzCreate(ancestor, b"", acl, 0))
                        steps.append(_Step(index, ancestor, True, Create))
                        planned[ancestor] = True
            out.append(KzCreate(op.path, op.value, acl, 1 if op.ephemeral else 0))
            steps.append(_Step(index, op.path, False, Create))
            planned[op.path] = True
        elif isinstance(op, Set):
            out.append(SetData(op.path, op.value, _version(op.version)))
            steps.append(_Step(index, op.path, False, Set))
        elif isinstance(op, Check):
            out.append(CheckVersion(op.path, _version(op.version)))
            steps.append(_Step(index, op.path, False, Check))
        else:
            prefix = op.path + "/"
            below = {p for p in below_deleted.get(op.path, ()) if planned.get(p, True)}
            below.update(p for p, alive in planned.items() if alive and p.startswith(prefix))
            below.discard(op.path)  # a subtree read holds its root
            for path in sorted(below, key=lambda p: (-p.count("/"), p)):
                out.append(KzDelete(path, -1))
                steps.append(_Step(index, path, True, Delete))
                planned[path] = False
            out.append(KzDelete(op.path, _version(op.version)))
            steps.append(_Step(index, op.path, False, Delete))
            planned[op.path] = False
    request = io.client.transaction()
    request.operations = out
    return request, steps


def _version(version: int | None) -> int:
    return -1 if version is None else version


def request_size(request: Any) -> int:
    """Bytes of the multi request as sent (without the 4-byte length prefix)."""
    return _REQUEST_HEADER + len(Transaction(request.operations).serialize())


def _learn(known: set[str], ops: list[Op], steps: list[_Step]) -> None:
    """Note the parents a committed transaction created or relied on, and forget what it
    deleted. A hint only: nodes others delete stay in it, and a re-plan that trusted a
    vanished one fails and reads them all (``run_transaction``)."""
    if len(known) > _KNOWN_PARENTS:
        known.clear()
    for op in ops:
        if isinstance(op, Create):
            known.update(ancestors(op.path))
        elif isinstance(op, Delete):
            known.discard(op.path)
    for step in steps:
        if step.expansion and step.op_type is Delete:
            known.discard(step.path)


def _size_bound(request: Any) -> int:
    """An upper bound of ``request_size`` without serialising: each op's fixed fields
    (op header, lengths, version, flags) take under 32 bytes, an ACL under 16 beside its
    scheme and id; strings are counted in characters times 4 (UTF-8's worst case)."""
    total = _REQUEST_HEADER + 16  # the multi's closing header
    for op in request.operations:
        total += 32 + 4 * len(op.path) + len(getattr(op, "data", None) or b"")
        for acl in getattr(op, "acl", None) or ():
            total += 16 + 4 * (len(acl.id.scheme) + len(acl.id.id))
    return total


def _check_size(request: Any, steps: list[_Step]) -> None:
    # Serialising a request only to measure it would double what kazoo spends on it
    # (a fire's mark is one of a batch); the exact size is taken only near the limit.
    if _size_bound(request) <= JUTE_MAX_BUFFER:
        return
    size = request_size(request)
    if size > JUTE_MAX_BUFFER:
        raise TransactionError(
            f"transaction would be a {size}-byte ZooKeeper request ({len(steps)} operations once "
            f"parents and subtrees are included); ZooKeeper refuses requests over {JUTE_MAX_BUFFER} bytes. "
            "Nothing was applied."
        )


def _commit(io: ZkIO, request: Any, steps: list[_Step], deadline: float) -> None:
    results = io.wait(request.commit_async(), deadline)
    for position, result in enumerate(results):
        if not isinstance(result, Exception) or isinstance(result, (RolledBackError, RuntimeInconsistency)):
            continue
        step = steps[position]
        if isinstance(result, KzNodeExists):
            if step.expansion:
                raise _Replan(step, "a parent appeared")
            raise TxnOpFailed(step.op_index, OpFailure.EXISTS)
        if isinstance(result, KzNoNode):
            # A Create fails with NoNode only when a parent the plan counted on vanished.
            if step.expansion or step.op_type is Create:
                raise _Replan(step, "no_node")
            raise TxnOpFailed(step.op_index, OpFailure.NO_NODE)
        if isinstance(result, KzBadVersion):
            raise TxnOpFailed(step.op_index, OpFailure.BAD_VERSION)
        if isinstance(result, NotEmptyError):
            raise _Replan(step, "a child appeared below a deleted node")
        cause = io.map_error(result, step.path)
        raise TransactionError(
            f"transaction op {step.op_index} failed, nothing was applied: {cause}",
            index=step.op_index,
            cause=cause,
        )
    if any(isinstance(r, Exception) for r in results):
        raise RegistryError("ZooKeeper refused the transaction without naming an operation")
