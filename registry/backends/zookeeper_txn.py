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
from typing import NamedTuple

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

from registry.backends.op_failures import OpFailure, TxnOpFailed
from registry.backends.zookeeper_io import ZkIO
from registry.backends.zookeeper_wire import request_size, send_multi
from registry.errors import RegistryError, TransactionError
from registry.paths import ancestors, shared
from registry.protocol import Check, Create, Delete, Op, Set

__all__ = ["JUTE_MAX_BUFFER", "run_transaction"]

#: ZooKeeper's default limit on one request's length (the 4-byte length prefix excluded).
JUTE_MAX_BUFFER = 0xFFFFF
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
    # the last re-plan's step and reason, not the exception: its traceback holds this
    # frame, whose locals would hold it (a cycle, with the whole batch's plan in it, left
    # to the garbage collector; a start of N jobs re-plans many batches)
    last: tuple[_Step, str] | None = None
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
            last = (stale.step, stale.reason)
            if stale.step.op_type is Create:  # a parent missing, or one appeared
                # the first re-plan trusts the parents known to exist; a later one reads them all
                parents = _Reads.ALL if parents is not _Reads.NONE else _Reads.UNKNOWN
            else:  # a child below a deleted node, or a node of its subtree gone
                subtrees = True
            continue
        if attempt:  # the hot path's transactions commit at once: nothing to learn there
            _learn(io, ops, steps)
        return
    assert last is not None
    step, reason = last
    if step.op_type is Create and reason == "no_node" and not step.expansion:
        raise TxnOpFailed(step.op_index, OpFailure.NO_NODE)
    raise TransactionError(
        f"transaction op {step.op_index} kept racing concurrent changes at {client_path(step.path)} "
        f"({reason}); nothing was applied",
        index=step.op_index,
    )


class _Reads(enum.Enum):
    """What a plan reads of the parents of its Creates."""

    NONE = "assume every parent exists"
    UNKNOWN = "read those neither known nor watched"
    ALL = "read them all"


def _plan(io: ZkIO, ops: list[Op], *, parents: _Reads, subtrees: bool) -> tuple[list[bytes], list[_Step]]:
    """The multi request of ``ops``, encoded op by op, and what each of its ops stands for. Without
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
    encode = io.encoder
    out: list[bytes] = []
    steps: list[_Step] = []
    for index, op in enumerate(ops):
        if isinstance(op, Check):
            out.append(encode.check(op.path, _version(op.version)))
            steps.append(_Step(index, op.path, False, Check))
        elif isinstance(op, Create):
            parents_of = ancestors(op.path)
            if read_parents:  # else every parent is assumed to exist
                for ancestor in parents_of:
                    if not planned.get(ancestor, present.get(ancestor, False)):
                        out.append(encode.create(ancestor, b"", False))
                        steps.append(_Step(index, ancestor, True, Create))
                        planned[ancestor] = True
            out.append(encode.create(op.path, op.value, op.ephemeral))
            steps.append(_Step(index, op.path, False, Create))
            planned[op.path] = True
        elif isinstance(op, Set):
            out.append(encode.set(op.path, op.value, _version(op.version)))
            steps.append(_Step(index, op.path, False, Set))
        else:
            # what lies below the deleted node: what the subtree read found, less what
            # earlier Deletes of this plan take (a mark's clear: nothing, a leaf). No op
            # writes below it: the shared op check refuses that before any plan.
            below = {p for p in below_deleted.get(op.path, ()) if planned.get(p, True)}
            below.discard(op.path)  # a subtree read holds its root
            for path in sorted(below, key=lambda p: (-p.count("/"), p)):
                out.append(encode.delete(path, -1))
                steps.append(_Step(index, path, True, Delete))
                planned[path] = False
            out.append(encode.delete(op.path, _version(op.version)))
            steps.append(_Step(index, op.path, False, Delete))
            planned[op.path] = False
    return out, steps


def _version(version: int | None) -> int:
    return -1 if version is None else version


def _learn(io: ZkIO, ops: list[Op], steps: list[_Step]) -> None:
    """Note the parents a committed transaction created or relied on, but those a tree
    watch has reported (it answers for them, and drops the others it reports later:
    ``ZkIO.known_parents``), and forget what it deleted. A hint only: nodes others delete
    stay in it, and a re-plan that trusted a vanished one fails and reads them all
    (``run_transaction``)."""
    known, watched = io.known_parents, io.watched_existence
    if len(known) > _KNOWN_PARENTS:
        known.clear()
    for op in ops:
        if isinstance(op, Create):
            known.update(shared(p) for p in ancestors(op.path) if p not in known and watched(p) is not True)
        elif isinstance(op, Delete):
            known.discard(op.path)
    for step in steps:
        if step.expansion and step.op_type is Delete:
            known.discard(step.path)


def _check_size(request: list[bytes], steps: list[_Step]) -> None:
    size = request_size(request)
    if size > JUTE_MAX_BUFFER:
        raise TransactionError(
            f"transaction would be a {size}-byte ZooKeeper request ({len(steps)} operations once "
            f"parents and subtrees are included); ZooKeeper refuses requests over {JUTE_MAX_BUFFER} bytes. "
            "Nothing was applied."
        )


def _commit(io: ZkIO, request: list[bytes], steps: list[_Step], deadline: float) -> None:
    results = io.wait(send_multi(io.client, request), deadline)
    refused = False
    for position, result in enumerate(results):
        if not isinstance(result, Exception):
            continue
        refused = True
        if isinstance(result, (RolledBackError, RuntimeInconsistency)):
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
    if refused:
        raise RegistryError("ZooKeeper refused the transaction without naming an operation")
