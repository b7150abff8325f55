"""The etcd backend of the registry (``etcd://`` URLs), on etcd's v3 API through pyetcd.

Data model: a node's key is its stored path (``/ns/a/b``); parents are explicit keys with
empty values, so the hierarchy is as real as ZooKeeper's; a node's version is its
``mod_revision``; an ephemeral node is a key attached to the session's lease.

Invariants kept here (the helpers keep theirs, see their docstrings):
- every change is applied by ONE etcd transaction, which also writes the missing
  parents; when a parent appeared or vanished meanwhile the change is planned again (a
  bounded number of times), never half applied;
- a put keeps the lifetime of an existing node (``ignore_lease``);
- a write whose lease turns out lost raises ``SessionLostError`` and wakes the keeper,
  which reports ``LOST`` and opens a new session;
- ``close()`` revokes the lease first, so this client's ephemeral nodes vanish at once.

Modules: ``etcd_conn`` (channel, auth, bounded and mapped RPCs), ``etcd_session`` (the
lease keeper), ``etcd_watch``/``etcd_stream`` (watch supervision), ``etcd_txn`` (request
building), ``etcd_errors`` (error mapping).
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

from pyetcd import etcdrpc
from pyetcd.utils import prefix_range_end

from registry.backends.base import BaseRegistry
from registry.backends.etcd_conn import EtcdConnection
from registry.backends.etcd_session import LeaseKeeper, lease_ttl
from registry.backends.etcd_txn import (
    ETCD_MAX_TXN_OPS,
    TOO_MANY_OPS,
    TxnPlan,
    analyse_failure,
    creates_parents,
    delete_ops,
    enc,
    kv_node,
    mod_cmp,
    plan_create,
    plan_transaction,
    put_op,
    range_op,
    read_states,
    separate_request,
    separate_room,
    subtree_prefix,
    transaction_cost,
    version_cmp,
)
from registry.backends.etcd_watch import WatchSupervisor
from registry.backends.op_failures import TxnOpFailed, op_failed
from registry.backends.watch_registration import WatchRegistration
from registry.errors import NodeExistsError, RegistryError, SessionLostError, TransactionError
from registry.paths import ancestors, parent
from registry.protocol import Node, Op
from registry.url import RegistryURL

__all__ = ["EtcdRegistry"]

_PLAN_ATTEMPTS = 8  # re-plans after a parent changed under a write
_NESTED_PUT_MAX = 256 * 1024  # larger values are put in two steps (see _put)
_SEQUENCE_ATTEMPTS = 64  # sequential creates race on their parent's counter
_SEQUENCE_KEY = "\x00seq"  # counters live outside the path space ("/..."): no watch sees them
_SENTINEL = "/\x00alive"  # below the namespace, never a node (paths cannot hold NUL)
_GT = etcdrpc.Compare.GREATER


class EtcdRegistry(BaseRegistry):
    """A registry client on an etcd cluster; connected (session lease granted) once built.
    ``etcd://[user:password@]host:port[,host:port...][/namespace]`` (default port 2379).

    URL options: ``session_timeout`` (s, default 10: the session lease's TTL),
    ``connect_timeout`` (s, default 5), ``max_txn_ops`` (default 128, etcd's own; more
    needs the server's ``--max-txn-ops`` at least as high, checked on connecting), and
    TLS: ``ca_cert`` (the CA to trust), ``cert_key`` with ``cert_cert`` (a client
    certificate, both or neither), each a file path. ``user:password`` is etcd's user
    authentication."""

    backend_name = "etcd"
    url_options = frozenset(
        {"session_timeout", "connect_timeout", "max_txn_ops", "ca_cert", "cert_key", "cert_cert"}
    )

    def __init__(self, parsed: RegistryURL) -> None:
        super().__init__(parsed)
        self._conn = EtcdConnection(parsed)
        ttl = lease_ttl(parsed.session_timeout)
        lease_id: int | None = None
        opened = time.monotonic()
        try:
            lease_id = self._conn.open(ttl)
            if parsed.max_txn_ops > ETCD_MAX_TXN_OPS:
                self._check_txn_room(parsed.max_txn_ops)
        except BaseException:
            if lease_id is not None:
                with contextlib.suppress(RegistryError):
                    self._conn.revoke(lease_id, min(parsed.connect_timeout, 2.0))
            self._conn.close()
            self._events.stop()
            self._session_events.stop()
            raise
        tag = f"{id(self):x}"
        self._keeper = LeaseKeeper(
            self._conn, ttl, lease_id, self._set_state, f"registry-etcd-lease-{tag}", alive_until=opened + ttl
        )
        self._supervisor = WatchSupervisor(
            self._conn,
            self._notify,
            self._resync_emitting,
            self._keeper.poke,
            sentinel_key=parsed.namespace + _SENTINEL,
            name=f"registry-etcd-watch-{tag}",
        )
        self._keeper.start()
        self._supervisor.start()

    def _check_txn_room(self, ops: int) -> None:
        """Refuse to connect when the server takes fewer ops per list than the URL's
        ``max_txn_ops`` (its ``--max-txn-ops``, which no API reports): found out here by one
        read-only request of that many compares, not by the first shared transaction of a
        group commit failing with every fire in it."""
        key = enc(self._parsed.namespace + _SENTINEL)  # inside what a user with a role may read
        probe = etcdrpc.Compare(key=key, target=etcdrpc.Compare.VERSION, result=_GT, version=0)
        try:
            self._conn.txn(etcdrpc.TxnRequest(compare=[probe] * ops), idempotent=True, action="read")
        except RegistryError as exc:
            if TOO_MANY_OPS not in str(exc):
                raise
            raise RegistryError(
                f"etcd at {self.url} takes fewer than {ops} operations per transaction: start it with"
                f" --max-txn-ops {ops} (or more), or lower the URL option max_txn_ops"
            ) from exc

    @property
    def lease_id(self) -> int:
        """The session's current lease (tests revoke it from another client to expire it)."""
        return self._keeper.lease_id

    # -- reads -----------------------------------------------------------------------------
    def _get_node(self, path: str) -> Node | None:
        response = self._conn.range(enc(path))
        return kv_node(response.kvs[0]) if response.kvs else None

    def _exists(self, path: str) -> bool:
        return bool(self._conn.range(enc(path), keys_only=True).kvs)

    def _children(self, path: str) -> list[str]:
        prefix = enc(subtree_prefix(path))
        response = self._conn.range(prefix, prefix_range_end(prefix), keys_only=True)
        names = {bytes(kv.key)[len(prefix) :].split(b"/", 1)[0] for kv in response.kvs}
        return [name.decode("utf-8", "replace") for name in names if name and b"\x00" not in name]

    def _read_tree(self, path: str) -> dict[str, Node]:
        # one range read of the node and everything below it (parent keys are stored nodes)
        below = enc(subtree_prefix(path))
        reads = [range_op(below, prefix_range_end(below))]
        if path != "/":
            reads.insert(0, range_op(enc(path)))
        response = self._conn.txn(
            etcdrpc.TxnRequest(compare=[], success=reads, failure=[]), idempotent=True, action="read"
        )
        return {
            key: kv_node(kv)
            for r in response.responses
            for kv in r.response_range.kvs
            if "\x00" not in (key := bytes(kv.key).decode("utf-8", "replace"))
        }

    # -- writes ----------------------------------------------------------------------------
    def _create(self, path: str, value: bytes, ephemeral: bool) -> None:
        missing: set[str] = set()  # optimistic: parents usually exist
        for _ in range(_PLAN_ATTEMPTS):
            plan = plan_create(path, value, self._lease(ephemeral), missing)
            response = self._write(plan.request(), "create")
            if response.succeeded:
                return
            states = read_states(plan.reads, response.responses)
            if states[path] is not None:
                raise NodeExistsError(path)
            missing = {p for p in plan.guarded if states[p] is None}
        raise self._contention("create", path)

    def _put(self, path: str, value: bytes, ephemeral: bool) -> None:
        missing: set[str] = set()
        # overwrite-or-create in one round trip carries the value twice; a large one would
        # pass etcd's 1.5 MiB request limit, so it goes in two steps
        nested = len(value) <= _NESTED_PUT_MAX
        for _ in range(_PLAN_ATTEMPTS):
            create = plan_create(path, value, self._lease(ephemeral), missing)
            parents = create.reads[1:]
            request = etcdrpc.TxnRequest(
                compare=[version_cmp(path, _GT, 0)],
                success=[put_op(enc(path), value, keep_lease=True)],
                failure=[etcdrpc.RequestOp(request_txn=create.request())]
                if nested
                else [range_op(enc(p)) for p in parents],
            )
            response = self._write(request, "put")
            if response.succeeded:
                return
            if nested:
                inner = response.responses[0].response_txn
                if inner.succeeded:
                    return
                states = read_states(create.reads, inner.responses)
            else:
                known = read_states(parents, response.responses)
                create = plan_create(
                    path, value, self._lease(ephemeral), {p for p in parents if known[p] is None}
                )
                inner = self._write(create.request(), "put")
                if inner.succeeded:
                    return
                states = read_states(create.reads, inner.responses)
            # present now (created concurrently): the next round overwrites it
            missing = {p for p in create.guarded if states[p] is None}
        raise self._contention("put", path)

    def _create_sequential(self, prefix: str, value: bytes, ephemeral: bool) -> str:
        counter = _SEQUENCE_KEY + parent(prefix)
        parents = ancestors(prefix + "0")
        first = self._conn.txn(
            etcdrpc.TxnRequest(
                compare=[], success=[range_op(enc(p)) for p in (counter, *parents)], failure=[]
            ),
            idempotent=True,
            action="read",
        )
        states = read_states([counter, *parents], first.responses)
        missing = {p for p in parents if states[p] is None}
        number, counter_kv = self._sequence_number(states[counter]), states[counter]
        for attempt in range(_SEQUENCE_ATTEMPTS):
            path = f"{prefix}{number:010d}"
            plan = plan_create(path, value, self._lease(ephemeral), missing)
            guard = (
                mod_cmp(counter, counter_kv.mod_revision)
                if counter_kv
                else version_cmp(counter, etcdrpc.Compare.EQUAL, 0)
            )
            create = plan.request()
            request = etcdrpc.TxnRequest(
                compare=[guard, *create.compare],
                success=[put_op(enc(counter), str(number + 1).encode()), *create.success],
                failure=[range_op(enc(counter)), *create.failure],
            )
            response = self._write(request, "create_sequential")
            if response.succeeded:
                return path
            states = read_states([counter, *plan.reads], response.responses)
            counter_kv = states[counter]
            taken = number + 1 if states[path] is not None else 0  # a node not made by us
            number = max(self._sequence_number(counter_kv), taken)
            missing = {p for p in plan.guarded if states[p] is None}
            if attempt >= 2:
                time.sleep(random.uniform(0, 0.002 * attempt))  # spread contending clients
        raise self._contention("create_sequential", prefix)

    def _delete(self, path: str) -> None:
        request = etcdrpc.TxnRequest(compare=[], success=delete_ops(path), failure=[])
        self._write(request, "delete")

    def transaction_cost(self, ops: Sequence[Op]) -> int:
        return transaction_cost(ops)

    def _transaction(self, ops: list[Op]) -> None:
        # None: parents not read yet; those a watch reported are assumed present (guarded),
        # those it did not are created if absent (ensured)
        missing: set[str] | None = None
        for _ in range(_PLAN_ATTEMPTS):
            unseen = self._unseen if missing is None else None
            plan = plan_transaction(ops, self._keeper.lease_id, missing or set(), self.max_txn_ops, unseen)
            if missing is None and not plan.fits():
                # guards or nested transactions would be left out: know the parents first
                missing = self._absent(creates_parents(ops))
                continue
            response = self._write(plan.request(), "transaction")
            if response.succeeded:
                return
            analyse_failure(ops, self._read(plan.reads))  # raises TxnOpFailed for an op
            missing = self._absent(creates_parents(ops))
        raise TransactionError(
            "transaction kept failing on concurrent changes to parents or to its nodes that were "
            f"gone when read; gave up after {_PLAN_ATTEMPTS} attempts (nothing applied)"
        )

    #: the group commit's transactions (every fire's mark and its removal) nested side by
    #: side in one request
    separate_transactions = True

    def transactions(self, groups: Sequence[Sequence[Op]]) -> list[BaseException | None]:
        """Each of ``groups`` as a transaction of its own, nested side by side in ONE
        request (``separate_request``): etcd checks each nested transaction's lists
        against its limit less the number nested, so four carry 4 x 124 of cost where one
        transaction carries 128 (124 fires' marks, not 32); each is applied or refused
        alone, one whose check fails costing the others nothing.

        A group whose checks fail is read back to name its op (one read for all of them);
        one whose cause is gone by then, and one that needs more room or a parent its
        watch has not reported, is applied on its own (``transaction``). Raises when the
        shared request's outcome is unknown."""
        outcomes, checked = self._check_groups(groups)
        room = separate_room(len(checked), self.max_txn_ops)
        lease = self._keeper.lease_id
        nested: list[tuple[int, list[Op], list[Op], TxnPlan]] = []
        alone: list[tuple[int, list[Op]]] = []
        for index, ops, stored in checked:
            plan = plan_transaction(stored, lease, set(), room, self._unseen)
            if plan.nestable():
                nested.append((index, ops, stored, plan))
            else:
                alone.append((index, ops))
        if nested:
            response = self._call(self._transactions, separate_request([n[3] for n in nested], self.max_txn_ops))
            failed = [
                entry
                for entry, answer in zip(nested, response.responses, strict=True)
                if not answer.response_txn.succeeded
            ]
            if failed:
                states = self._read(list(dict.fromkeys(path for entry in failed for path in entry[3].reads)))
                for index, ops, stored, _ in failed:
                    try:
                        analyse_failure(stored, states)
                    except TxnOpFailed as op_failure:
                        outcomes[index] = op_failed(ops, op_failure)
                    else:
                        alone.append((index, ops))  # its cause is gone: planned again
        for index, ops in alone:
            try:
                self.transaction(ops)
            except Exception as exc:
                outcomes[index] = exc
        return outcomes

    def _transactions(self, request: Any) -> Any:
        return self._write(request, "transaction")

    # -- watches ---------------------------------------------------------------------------
    def _start_watch(self, registration: WatchRegistration, initial: bool) -> None:
        self._supervisor.add(registration, initial)

    def _stop_watch(self, registration: WatchRegistration) -> None:
        self._supervisor.remove(registration)

    def _resync_emitting(
        self, registration: WatchRegistration, snapshot: Mapping[str, Node], emit: bool
    ) -> None:
        self._resync(registration, snapshot, emit=emit)

    # -- session and life cycle -----------------------------------------------------------------
    def session_deadline(self) -> float:
        """The lease's end as its latest answered refresh (or grant) vouches for it:
        ``LeaseKeeper.alive_until``."""
        return self._keeper.alive_until

    def server_time(self) -> float:
        if self._closed:
            raise RegistryError(f"registry client {self.url} is closed")
        return self._conn.server_time()

    def _close(self) -> None:
        try:
            self._keeper.stop(revoke=True, timeout=min(self.connect_timeout, 2.0))
        finally:
            self._supervisor.stop()
            self._conn.close()

    # -- helpers ----------------------------------------------------------------------------------
    def _lease(self, ephemeral: bool) -> int:
        return self._keeper.lease_id if ephemeral else 0

    def _write(self, request: Any, action: str) -> Any:
        try:
            return self._conn.txn(request, action=action)
        except SessionLostError:
            self._keeper.poke()  # it confirms the loss, reports LOST and opens a new session
            raise

    def _unseen(self, stored_path: str) -> bool:
        """True if a watch covers ``stored_path`` and has not reported it. Only a hint (a
        watch lags its own writes; a guard or a nested transaction checks it): a node just
        created may be unseen, and one just deleted still reported."""
        for registration in self._active_watches():
            if registration.covers(stored_path):
                return registration.to_client(stored_path) not in registration.versions
        return False

    def _absent(self, paths: list[str]) -> set[str]:
        """Which of ``paths`` do not exist."""
        return {path for path, kv in self._read(paths).items() if kv is None}

    def _read(self, paths: list[str]) -> dict[str, Any]:
        """Each of ``paths`` -> its kv, or None if absent (read in transactions of
        ``max_txn_ops`` reads; each consistent in itself, not with the others)."""
        states: dict[str, Any] = {}
        for start in range(0, len(paths), self.max_txn_ops):
            chunk = paths[start : start + self.max_txn_ops]
            request = etcdrpc.TxnRequest(compare=[], success=[range_op(enc(p)) for p in chunk], failure=[])
            states.update(read_states(chunk, self._conn.txn(request, idempotent=True, action="read").responses))
        return states

    def _sequence_number(self, kv: Any) -> int:
        if kv is None:
            return 0
        try:
            return int(bytes(kv.value))
        except ValueError:
            raise RegistryError(
                f"etcd sequence counter {bytes(kv.key)!r} holds {bytes(kv.value)[:40]!r}, not a number"
            ) from None

    def _contention(self, action: str, path: str) -> RegistryError:
        return RegistryError(
            f"etcd {action} of {self._client_path(path)!r} kept conflicting with concurrent changes; gave up"
        )
