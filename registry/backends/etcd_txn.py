"""Builds etcd requests for the registry's writes and reads back why a transaction failed.

The key of a node is its stored path; a parent is an explicit key with an empty value.
Invariants kept here:
- a node and its missing parents are written in ONE etcd transaction whose compares pin
  every parent it relies on: missing ones ``version == 0``, present ones ``version > 0``,
  or a compare on a node below them (deletes are recursive: while it exists, they do);
- a delete removes the key and the range ``key + "/"`` and nothing else (a single range
  from ``key`` would also hit siblings such as ``key-1``, which sort before ``key/``);
- a parent no watch has reported is created, if absent, by a nested transaction
  (``version == 0`` then put) inside the same transaction: right whether it exists or not,
  so a new subtree is written in one request instead of a refused guard, a read of its
  parents and a second try. etcd checks a nested transaction's lists against what the
  outer lists leave of ``--max-txn-ops``, so the outer lists stay below the limit;
- a registry transaction (``TxnPlan``, every fire's mark and its removal) has no failure
  branch: it is sent lean, and only after it failed are its keys read, in a second request,
  to name an op whose check fails (``analyse_failure``); a failure whose cause is gone by
  then names none, and the caller plans and tries it again. A single write (``Plan``)
  reads its node and parents back in its failure branch, so its re-plan knows them exactly;
- no request exceeds the operations per list the server takes (etcd's ``--max-txn-ops``:
  128 unless the URL's ``max_txn_ops`` says the server was set up for more), and no key is
  written twice (etcd refuses both with INVALID_ARGUMENT): such requests are refused
  before sending.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyetcd import etcdrpc
from pyetcd.utils import prefix_range_end

from registry.backends.op_failures import raise_first_failed_op
from registry.errors import TransactionError
from registry.paths import ancestors, parent
from registry.protocol import Create, Delete, Node, Op, Set

__all__ = [
    "ETCD_MAX_TXN_OPS",
    "TOO_MANY_OPS",
    "Plan",
    "TxnPlan",
    "analyse_failure",
    "creates_parents",
    "delete_ops",
    "enc",
    "kv_node",
    "mod_cmp",
    "plan_create",
    "plan_transaction",
    "put_op",
    "range_op",
    "read_states",
    "separate_request",
    "separate_room",
    "subtree_prefix",
    "transaction_cost",
    "version_cmp",
]

ETCD_MAX_TXN_OPS = 128  # etcd's --max-txn-ops default, per compare/success/failure list
#: the error etcd gives a request with more ops in a list than its ``--max-txn-ops``
TOO_MANY_OPS = "too many operations in txn request"

_EQ = etcdrpc.Compare.EQUAL
_GT = etcdrpc.Compare.GREATER


def enc(path: str) -> bytes:
    return path.encode("utf-8")


def subtree_prefix(path: str) -> str:
    """The key prefix of everything strictly below ``path``."""
    return "/" if path == "/" else path + "/"


def kv_node(kv: Any) -> Node:
    return Node(value=bytes(kv.value), version=int(kv.mod_revision), ephemeral=kv.lease != 0)


def version_cmp(path: str, result: int, version: int) -> Any:
    return etcdrpc.Compare(key=enc(path), target=etcdrpc.Compare.VERSION, result=result, version=version)


def mod_cmp(path: str, mod_revision: int) -> Any:
    return etcdrpc.Compare(key=enc(path), target=etcdrpc.Compare.MOD, result=_EQ, mod_revision=mod_revision)


def put_op(key: bytes, value: bytes, *, lease: int = 0, keep_lease: bool = False) -> Any:
    # ignore_lease keeps the lifetime of an existing key: a put must not turn an
    # ephemeral node persistent or the reverse (pyetcd's Put cannot express it)
    request = etcdrpc.PutRequest(key=key, value=value, lease=lease, ignore_lease=keep_lease)
    return etcdrpc.RequestOp(request_put=request)


def range_op(key: bytes, range_end: bytes = b"") -> Any:
    return etcdrpc.RequestOp(request_range=etcdrpc.RangeRequest(key=key, range_end=range_end))


def delete_ops(path: str) -> list[Any]:
    below = enc(subtree_prefix(path))
    return [
        etcdrpc.RequestOp(request_delete_range=etcdrpc.DeleteRangeRequest(key=enc(path))),
        etcdrpc.RequestOp(
            request_delete_range=etcdrpc.DeleteRangeRequest(key=below, range_end=prefix_range_end(below))
        ),
    ]


def read_states(paths: Sequence[str], responses: Iterable[Any]) -> dict[str, Any]:
    """Map each path to its kv (or ``None``) from the range responses read for them."""
    states: dict[str, Any] = {}
    for path, response in zip(paths, responses, strict=True):
        kvs = response.response_range.kvs
        states[path] = kvs[0] if kvs else None
    return states


@dataclass
class Plan:
    """One etcd transaction and the keys its failure branch reads, in order."""

    compares: list[Any]
    success: list[Any]
    reads: list[str]
    guarded: list[str]  # parents pinned by compares (their failure means: re-plan)
    # ``version > 0`` guards of parents that exist; dropped only when a transaction of
    # etcd's maximum size leaves no room for them (see plan_transaction)
    optional: list[Any] = field(default_factory=list)

    def guards_fit(self) -> bool:
        return len(self.compares) + len(self.optional) <= ETCD_MAX_TXN_OPS

    def request(self) -> Any:
        """The request; without the optional guards if they do not fit (the caller must
        then have read the parents: see ``guards_fit``)."""
        compares = self.compares + self.optional if self.guards_fit() else self.compares
        _check_size("compares", len(compares))
        _check_size("operations", len(self.success))
        _check_size("reads", len(self.reads))
        return etcdrpc.TxnRequest(
            compare=compares,
            success=self.success,
            failure=[range_op(enc(p)) for p in self.reads],
        )


def _parent_guards(parents: Sequence[str], missing: set[str]) -> tuple[list[str], list[str]]:
    """The parents a write relies on, split by how they are pinned: those to create (put,
    guarded by ``version == 0``: never clobber one that appeared) and the present ones to
    guard by ``version > 0`` — only those with no other present parent below them: deletes
    are recursive, so while the deeper one exists so does it."""
    present = [p for p in parents if p not in missing]
    covered = {a for p in present for a in ancestors(p)} if len(present) > 1 else set()
    return [p for p in parents if p in missing], [p for p in present if p not in covered]


def _guard_parents(parents: Sequence[str], missing: set[str], plan: Plan) -> None:
    """Pin the parents a write relies on (``_parent_guards``)."""
    create, guard = _parent_guards(parents, missing)
    for parent_path in create:
        plan.compares.append(version_cmp(parent_path, _EQ, 0))
        plan.success.append(put_op(enc(parent_path), b""))
    plan.optional.extend(version_cmp(parent_path, _GT, 0) for parent_path in guard)
    plan.guarded.extend(create + guard)


def plan_create(path: str, value: bytes, lease: int, missing: set[str]) -> Plan:
    """Create ``path`` if absent, with the parents in ``missing`` (the rest must exist).

    The failure branch reads the node and every parent, so a re-plan knows them exactly.
    """
    parents = ancestors(path)
    plan = Plan(compares=[version_cmp(path, _EQ, 0)], success=[], reads=[path, *parents], guarded=[])
    _guard_parents(parents, missing, plan)
    plan.success.append(put_op(enc(path), value, lease=lease))
    return plan


#: a compare of ``plan_transaction``: (key, target, result, version or mod revision)
_Cmp = tuple[bytes, int, int, int]
#: an op of ``plan_transaction``: (key, value, lease, keep the lease) puts, (key, None, 0,
#: False) deletes the key and everything below it
_Put = tuple[bytes, bytes | None, int, bool]

_VERSION = etcdrpc.Compare.VERSION
_MOD = etcdrpc.Compare.MOD


@dataclass
class TxnPlan:
    """``plan_transaction``'s request, kept as plain tuples and built into one
    ``TxnRequest`` in place by ``request()``: protobuf messages made one by one and then
    copied into the request cost twice as much, and every fire's mark passes here."""

    compares: list[_Cmp]
    success: list[_Put]
    reads: list[str]  # the ops' paths, read only once the transaction failed
    optional: list[_Cmp] = field(default_factory=list)  # as ``Plan.optional``
    #: parents no watch has reported, each put by a nested transaction if absent
    ensured: list[bytes] = field(default_factory=list)
    limit: int = ETCD_MAX_TXN_OPS  # ops per list the server takes

    def guards_fit(self) -> bool:
        return len(self.compares) + len(self.optional) <= self.limit

    def fits(self) -> bool:
        """Every guard fits, and each nested transaction has room: etcd allows it the
        limit less the longest outer list."""
        if not self.guards_fit():
            return False
        if not self.ensured:
            return True
        longest = max(len(self.compares) + len(self.optional), self._operations())
        return longest < self.limit

    def nestable(self) -> bool:
        """Fits its limit with every guard and nests no transaction of its own: it can be
        one of the transactions of a shared request (``separate_request``)."""
        return not self.ensured and self.guards_fit() and self._operations() <= self.limit

    def _operations(self) -> int:
        return sum(1 if value is not None else 2 for _, value, _, _ in self.success) + len(self.ensured)

    def request(self) -> Any:
        """As ``Plan.request``; a plan with nested transactions must ``fit``."""
        request = etcdrpc.TxnRequest()
        self.fill(request)
        return request

    def fill(self, request: Any) -> None:
        """Write the request into the empty ``TxnRequest`` ``request``, in place (a
        nested transaction of a shared request: ``separate_request``)."""
        if self.ensured and not self.fits():
            raise ValueError("no room for the nested transactions: plan with the parents read instead")
        compares = self.compares + self.optional if self.guards_fit() else self.compares
        _check_size("compares", len(compares), self.limit)
        _check_size("operations", self._operations(), self.limit)
        add_compare = request.compare.add
        for key, target, result, number in compares:
            if target == _VERSION:
                add_compare(key=key, target=target, result=result, version=number)
            else:
                add_compare(key=key, target=target, result=result, mod_revision=number)
        add_op = request.success.add
        for key, value, lease, keep in self.success:
            if value is None:
                add_op().request_delete_range.key = key
                removal = add_op().request_delete_range
                removal.key = key + b"/"
                removal.range_end = key + b"0"  # prefix_range_end(key + b"/"): "/" + 1 is "0"
                continue
            put = add_op().request_put
            put.key = key
            put.value = value
            if lease:
                put.lease = lease
            if keep:
                put.ignore_lease = True
        for key in self.ensured:
            nested = add_op().request_txn
            nested.compare.add(key=key, target=_VERSION, result=_EQ, version=0)
            nested.success.add().request_put.key = key


def plan_transaction(
    ops: Sequence[Op],
    lease: int,
    missing: set[str],
    limit: int = ETCD_MAX_TXN_OPS,
    unseen: Callable[[str], bool] | None = None,
) -> TxnPlan:
    """The etcd transaction applying ``ops`` (stored paths); ``missing``: absent parents;
    ``unseen``: true of a parent a watch covers and has not reported (ensured, not guarded).

    etcd bounds each list of a request to ``limit`` (its ``--max-txn-ops``), nested
    transactions included, and a registry transaction may hold as many ops. When the ops
    leave no room for the guards of parents that exist (``guards_fit()`` is false), those
    guards are left out, so the caller must first have read which parents exist; a
    recursive delete of such a parent racing with the transaction could then leave the new
    nodes without their parent key.
    The request has no failure branch: ``reads`` are the ops' paths, for the caller to read
    once it failed (``analyse_failure``); after a guard failed it re-reads the parents.
    """
    plan = TxnPlan(compares=[], success=[], reads=[], limit=limit)
    compares, success = plan.compares, plan.success
    targets: dict[str, bytes] = {}
    created: list[str] = []
    for op in ops:
        path = op.path
        key = targets[path] = enc(path)
        if isinstance(op, Create):
            compares.append((key, _VERSION, _EQ, 0))
            success.append((key, op.value, lease if op.ephemeral else 0, False))
            created.append(path)
        elif op.version is not None:
            # etcd compares an absent key's mod revision as 0, so ``MOD == 0`` would pass
            # for a node that does not exist: a version below 1 names no node, and is
            # compared as -1, which no key matches
            compares.append((key, _MOD, _EQ, op.version if op.version > 0 else -1))
        else:
            compares.append((key, _VERSION, _GT, 0))
        if isinstance(op, Set):
            success.append((key, op.value, 0, True))
        elif isinstance(op, Delete):
            success.append((key, None, 0, False))
    plan.reads = list(targets)
    create, ensure, guard = _pin_parents(created, targets, missing, unseen)
    for parent_path in create:
        key = enc(parent_path)
        compares.append((key, _VERSION, _EQ, 0))
        success.append((key, b"", 0, False))
    plan.ensured = [enc(parent_path) for parent_path in ensure]
    plan.optional.extend((enc(parent_path), _VERSION, _GT, 0) for parent_path in guard)
    return plan


#: the key of ``separate_request``'s put that never runs: outside every namespace (a stored
#: path starts with "/"), and never written
_QUOTA_PROBE = b"\x00shardjob-quota-probe"


def separate_room(count: int, limit: int = ETCD_MAX_TXN_OPS) -> int:
    """The ops per list each of ``count`` transactions nested in one request may hold:
    etcd checks a nested transaction's lists against the limit less the outer request's
    longest list, here the ``count`` nested transactions themselves."""
    return limit - count


def separate_request(plans: Sequence[TxnPlan], limit: int = ETCD_MAX_TXN_OPS) -> Any:
    """One request applying each of ``plans`` as a transaction of its own, nested in an
    outer one that checks nothing: each nested one succeeds or fails alone (its
    ``succeeded`` in the answer), so one whose check fails costs the others nothing.
    Each plan is made with ``separate_room(len(plans), limit)`` as its limit and nests no
    transaction of its own."""
    _check_size("nested transactions", len(plans), limit)
    room = separate_room(len(plans), limit)
    request = etcdrpc.TxnRequest()
    # Hazard: etcd charges a transaction against its space quota (NOSPACE) by the puts of
    # its costlier branch, top level only: a nested transaction's puts count for nothing,
    # so a request of nested ones alone would write on past a full database. The trick:
    # a put in the failure branch, which never runs (no compare can fail), makes it cost.
    request.failure.add().request_put.key = _QUOTA_PROBE
    add_op = request.success.add
    for plan in plans:
        if plan.ensured or plan.limit > room:
            raise ValueError("a nested transaction must leave the outer list its room and nest none of its own")
        plan.fill(add_op().request_txn)
    return request


def _pin_parents(
    created: Sequence[str],
    targets: Container[str],
    missing: Container[str],
    unseen: Callable[[str], bool] | None = None,
) -> tuple[list[str], list[str], list[str]]:
    """The parents the nodes in ``created`` rely on: those to create, those to ensure, and
    the present ones to guard by ``version > 0``, as ``_parent_guards`` splits them, found
    without listing every ancestor of every node (each fire's mark passes here).

    A walk up from each node's parent creates each missing parent and goes on, ensures each
    ``unseen`` one and goes on, and stops at the first present one (guarded), at an op's
    own path (that op pins it: a check or a write needs it present, a create makes it), or
    at a parent already walked. Deletes are recursive, so while a present parent exists so
    do all its ancestors: those are marked covered, and a guard or an ensure that a guard
    covers is dropped. At most one guard per node in ``created``, as ``transaction_cost``
    counts.
    """
    to_create: dict[str, None] = {}
    to_ensure: dict[str, None] = {}
    guards: dict[str, None] = {}
    covered: set[str] = set()
    for path in created:
        node = parent(path)
        while node != "/" and node not in targets and node not in covered:
            if node in to_create or node in guards or node in to_ensure:
                break  # walked already
            if node in missing:
                to_create[node] = None
                node = parent(node)
                continue
            if unseen is not None and unseen(node):
                to_ensure[node] = None
                node = parent(node)
                continue
            guards[node] = None
            above = parent(node)
            while above != "/" and above not in covered:
                covered.add(above)
                above = parent(above)
            break
    return (
        list(to_create),
        [node for node in to_ensure if node not in covered],
        [node for node in guards if node not in covered],
    )


def transaction_cost(ops: Sequence[Op]) -> int:
    """The longest of the three lists ``plan_transaction`` makes of ``ops`` when their
    parents exist: a compare per op plus a guard per created node's parent, a write per
    Create or Set and two per Delete (the key and the range below it), a read per path.
    Costs of several transactions add up to at most the lists of their union, so requests
    whose costs sum to the server's limit fit one etcd transaction with every guard. A
    batch of creates whose parents are missing may still overflow; ``EtcdRegistry`` then
    reads the parents and leaves the guards out, or refuses the batch as too large
    (nothing applied)."""
    compares = writes = len(ops)
    for op in ops:
        if isinstance(op, Create):
            compares += 1
        elif isinstance(op, Delete):
            writes += 1
        elif not isinstance(op, Set):
            writes -= 1  # a Check writes nothing
    return max(compares, writes)


def creates_parents(ops: Sequence[Op]) -> list[str]:
    """Every parent of every Create in ``ops``, for an exact re-read after a guard failed."""
    found: dict[str, None] = {}
    for op in ops:
        if isinstance(op, Create):
            found.update((p, None) for p in ancestors(op.path))
    return list(found)


def analyse_failure(ops: Sequence[Op], states: Mapping[str, Any]) -> None:
    """Raise ``TxnOpFailed`` for the first op (in caller order) whose compare fails
    against ``states`` (each op's path -> its kv or None, read after the transaction failed).

    Returning means no op's check fails now: a parent guard failed, or what refused the
    transaction changed before the read. The caller re-reads the parents and re-plans.
    """

    def version_of(path: str) -> int | None:
        kv = states.get(path)
        return None if kv is None else int(kv.mod_revision)

    raise_first_failed_op(ops, version_of)


def _check_size(name: str, count: int, limit: int = ETCD_MAX_TXN_OPS) -> None:
    if count > limit:
        raise TransactionError(f"transaction needs {count} etcd {name}; etcd allows at most {limit} per list")
