"""Group commit: independent transactions of many callers applied in shared ones.

Callers submit a transaction's ops with a completion callback. A committer thread takes
what is queued — at most ``max_ops`` of the backend's ``transaction_cost`` (ops on
ZooKeeper and memory, the longest list of etcd's compares, writes and reads) and
``max_bytes`` of values, waiting at most
``max_delay`` for more once the oldest request is queued — and applies it as ONE registry
transaction: a thousand jobs firing in the same second cost a few dozen round trips, not a
thousand. ``committers`` threads keep that many shared transactions in flight: a server
that syncs its log to disk before it answers takes milliseconds per transaction whatever
its size, and lets concurrent ones share the sync.

Where the registry sends several transactions in one request, each applied or refused
alone (``separate_transactions``: etcd's nested transactions), a shared request carries
up to ``_NESTED_GROUPS`` joined transactions side by side: etcd bounds each list of a
request, and each nested transaction's lists by the limit less the outer list's length,
so four of 124 carry 124 fires' marks where one transaction carried 32. A refused one
costs the others nothing: only its own requests go again.

Invariants:

- Each caller's transaction stays all-or-nothing and independent of the others. When the
  shared transaction fails because of one op, the registry names it
  (``TransactionError.index``); the caller that owns it alone is told, with a
  ``TransactionError`` naming its own op by its own index, and the rest is applied again at
  once. One fenced-out caller never stops the others.
- A failure that leaves the outcome unknown (connection lost) is told to every caller of
  that transaction and retried for none: such a write is never silently repeated. A
  ``TransactionError`` that names no op applied nothing (the backend found the shared
  transaction too large once expanded, e.g. etcd's compares guarding missing parents):
  each half is applied on its own, down to single requests.
- No transaction writes a path twice (every backend refuses it): a request that writes a
  path another queued request of the batch writes waits for the next batch. Nor does one
  write inside a subtree it deletes: a shared transaction refused for that (a
  ``ValueError``, nothing applied) is split and each half applied on its own.
- A request never waits more than ``max_delay`` for others to join it, plus the time the
  transactions ahead of it take.
- Transactions of different batches may be applied in any order (several are in flight):
  a caller that needs an order submits its next transaction once the previous is told.
- A request whose caller knows, by the time it would be sent, that it must fail (its
  ``doomed`` returns the error) is told that error and never sent. Without it, a queue of
  transactions that all fail (every fire queued when the session was lost, each fenced on
  the registration that went with it) cost one round trip each, since a failed shared
  transaction names one failing op; whatever was queued behind them waited that long.

Hazard: callbacks run on a committer thread, one after the other. They must be quick
and must never wait on the registry or on this batcher; slow work goes to a pool.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from registry.errors import RegistryError, TransactionError
from registry.protocol import Check, Delete, Op, RegistryCenter

__all__ = ["BatcherClosed", "Commit", "CommitCallback", "TransactionBatcher"]

log = logging.getLogger("registry.batch")

#: called with None once the caller's ops are applied, or with the error that refused them
CommitCallback = Callable[[BaseException | None], None]

#: applies one transaction: ``RegistryCenter.transaction`` or ``TransactionBatcher.commit``
Commit = Callable[[Sequence[Op]], None]


class BatcherClosed(RegistryError):
    """The batcher was closed: the request was not submitted."""


@dataclass(eq=False, slots=True)
class _Request:
    ops: Sequence[Op]
    callback: CommitCallback
    size: int
    cost: int  # reg.transaction_cost(ops)
    queued: float
    written: frozenset[str] = field(default_factory=frozenset)
    #: the error the request is sure to meet, if known before sending (``submit``)
    doomed: Callable[[], BaseException | None] | None = None


class TransactionBatcher:
    """Group commit of independent transactions over ``reg`` (module docstring).

    The defaults fill a shared transaction to the registry's ``max_txn_ops`` (128 unless
    its URL raises it) of the backend's ``transaction_cost`` and half of its 1 MB of values.
    """

    def __init__(
        self,
        reg: RegistryCenter,
        *,
        max_ops: int | None = None,
        max_bytes: int = 500_000,
        max_delay: float = 0.002,
        committers: int = 4,
        name: str = "shardjob-commit",
    ) -> None:
        if max_ops is None:
            max_ops = reg.max_txn_ops
        if max_ops < 1 or max_bytes < 1 or max_delay < 0 or committers < 1:
            raise ValueError("max_ops, max_bytes and committers must be >= 1 and max_delay >= 0")
        self._reg = reg
        #: ``reg.transactions`` where it sends each caller's transaction as one of its own
        #: in the shared request (``BaseRegistry.separate_transactions``); else None, and
        #: they are joined into one transaction
        self._separate: Callable[[list[Sequence[Op]]], list[BaseException | None]] | None = (
            getattr(reg, "transactions", None) if getattr(reg, "separate_transactions", False) else None
        )
        self.max_ops = max_ops
        self.max_bytes = max_bytes
        self.max_delay = max_delay
        self._name = name
        self._committers = committers
        self._pending: collections.deque[_Request] = collections.deque()
        self._wake = threading.Condition()
        self._closed = False
        self._idle = 0  # committers waiting for a request (guarded by _wake)
        self._live = 0  # committers started and not yet left (guarded by _wake)
        self._threads: list[threading.Thread] = []
        self._in_flight = 0  # requests taken by a committer and not yet told
        self._stats = threading.Lock()
        #: shared transactions sent and caller transactions applied (for benchmarks and tests)
        self.commits = 0
        self.applied = 0

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> TransactionBatcher:
        with self._wake:
            if not self._threads:
                for n in range(self._committers):
                    thread = threading.Thread(target=self._run, name=f"{self._name}-{n}", daemon=True)
                    self._threads.append(thread)
                    self._live += 1
                    thread.start()
        return self

    def close(self, timeout: float | None = 10.0) -> None:
        """Commit what is queued, then stop; later submits raise ``BatcherClosed``."""
        with self._wake:
            self._closed = True
            self._wake.notify_all()
            threads = list(self._threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout)

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Wait until every request submitted so far has been told; False on timeout."""
        with self._wake:
            return self._wake.wait_for(lambda: not self._pending and not self._in_flight, timeout)

    def backlog(self) -> int:
        """Requests submitted and not yet told: queued, or in a transaction in flight. Read
        without the lock (a fire's timer looks before each fire): a moment's count, which
        may count a request being taken twice but never misses one (``_take``)."""
        return len(self._pending) + self._in_flight

    # -- submitting -----------------------------------------------------------------------
    def submit(
        self,
        ops: Sequence[Op],
        callback: CommitCallback,
        *,
        doomed: Callable[[], BaseException | None] | None = None,
    ) -> None:
        """Queue ``ops`` as one transaction; ``callback(None)`` once applied, else
        ``callback(error)`` (on the committer thread, see the module's hazard).

        ``doomed``, called on the committer thread each time the request is about to be
        sent (quick, no waiting, as a callback), returns the error it would certainly
        meet, or None: such a request is told that error instead of being sent."""
        if not ops:
            raise ValueError("a transaction needs at least one op")
        size = 0
        paths: list[str] = []
        for op in ops:  # a plain loop: every fire's mark and its removal pass here
            if not isinstance(op, Check):
                paths.append(op.path)
                if not isinstance(op, Delete):
                    size += len(op.value)
        if self._closed:
            raise BatcherClosed("the transaction batcher is closed")
        request = _Request(
            ops, callback, size, self._reg.transaction_cost(ops), time.monotonic(), frozenset(paths), doomed
        )
        # No lock on this path (every fire passes here twice): the append is atomic, and a
        # committer announces itself in ``_idle`` BEFORE it looks at the queue, so either
        # it sees this request or this sees it idle and wakes it.
        self._pending.append(request)
        if self._idle:
            with self._wake:
                self._wake.notify()
        if self._closed:
            self._unless_stranded(request)

    def _unless_stranded(self, request: _Request) -> None:
        """Raise ``BatcherClosed`` for ``request`` if ``close`` raced its append and every
        committer has already left: none would ever tell it. A committer leaves only once
        it has found the queue empty under the lock, so one still live will take it."""
        with self._wake:
            if self._live or request not in self._pending:
                self._wake.notify_all()
                return
            self._pending.remove(request)
        raise BatcherClosed("the transaction batcher is closed")

    def commit(self, ops: Sequence[Op]) -> None:
        """``submit`` and wait: the caller's own transaction, applied together with what
        other threads have queued; raises what ``reg.transaction(ops)`` would (a
        ``TransactionError`` names the caller's own op). Start-up and shutdown of many
        jobs write through it: N jobs' registrations cost N / batch round trips.

        From a committer thread (a callback), or once closed, the transaction is applied
        directly: waiting there for a committer would wait for itself."""
        if threading.current_thread() in self._threads:
            self._reg.transaction(ops)
            return
        done = threading.Event()
        outcome: list[BaseException | None] = []

        def told(error: BaseException | None) -> None:
            outcome.append(error)
            done.set()

        try:
            self.submit(ops, told)
        except BatcherClosed:
            self._reg.transaction(ops)
            return
        done.wait()  # every submitted request is told, whatever happens to it
        if outcome[0] is not None:
            raise outcome[0]

    # -- the committer ----------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._pending and not self._closed:
                    self._idle += 1
                    if not self._pending:  # checked after announcing: see ``submit``
                        self._wake.wait()
                    self._idle -= 1
                if not self._pending:
                    self._live -= 1
                    return  # closed, and everything queued is committed
                deadline = self._pending[0].queued + self.max_delay
                while not self._closed and not self._full():
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._wake.wait(remaining)
                batch = self._take()
                taken = len(batch)  # _commit consumes the list: count it now
            if batch:  # another committer may have taken everything meanwhile
                try:
                    self._commit(batch)
                finally:
                    with self._wake:
                        self._in_flight -= taken
                        self._wake.notify_all()

    def _full(self) -> bool:
        # By index, not by iterating: submits append without the lock, and an iterator
        # raises once the deque has grown. Only committers, under the lock, take from the
        # left, so the first indices stay put; a request costs at least 1, so the loop
        # ends within the packing's capacity.
        pending = self._pending
        packing = self._packing()
        return any(not packing.add(pending[index].cost) or packing.full for index in range(len(pending)))

    def _packing(self) -> _Packing:
        return _Packing(self.max_ops, _NESTED_GROUPS if self._separate is not None else 1)

    def _take(self) -> list[_Request]:
        """The oldest requests that fit together (lock held); the first always goes. They
        count as in flight from here until told.

        Hazard: ``backlog()`` reads the queue and the count in flight without the lock. A
        request counted in flight only after it left the queue would be missed by a read
        in between, and the timer would start fires at the bound; so each request is
        counted BEFORE it is taken, and a request put back is uncounted only once it is
        in the queue again: a read in between counts it twice, which holds fires a moment
        longer."""
        batch: list[_Request] = []
        kept: collections.deque[_Request] = collections.deque()
        packing = self._packing()
        size = 0
        written: set[str] = set()
        while self._pending:
            self._in_flight += 1
            request = self._pending.popleft()
            if batch and not written.isdisjoint(request.written):
                kept.append(request)  # writes a path this batch writes: the next batch
                continue
            if batch and (size + request.size > self.max_bytes or not packing.add(request.cost)):
                self._pending.appendleft(request)
                self._in_flight -= 1
                break
            if not batch:
                packing.add(request.cost)  # the first always goes
            batch.append(request)
            size += request.size
            written |= request.written
        self._pending.extendleft(reversed(kept))
        self._in_flight -= len(kept)
        return batch

    def _commit(self, batch: list[_Request]) -> None:
        if self._separate is not None:
            self._commit_separately(batch, self._separate)
        else:
            self._commit_joined(batch)

    def _commit_separately(
        self, batch: list[_Request], transactions: Callable[[list[Sequence[Op]]], list[BaseException | None]]
    ) -> None:
        """``batch`` in one request of up to ``_NESTED_GROUPS`` transactions, each joining
        the requests ``_Packing`` puts in it (``BaseRegistry.transactions``). A group that
        failed on one op tells its owner and goes again without it (in the next request,
        with any other such group); one refused whole goes joined (``_commit_joined``,
        which splits it); an unknown outcome is told to its group alone."""
        part = self._unless_doomed(batch)
        while part:
            groups = _groups(part, self.max_ops - _NESTED_GROUPS)
            with self._stats:
                self.commits += 1
            try:
                outcomes = transactions([[op for request in group for op in request.ops] for group in groups])
            except ValueError:
                # one writes inside a subtree another deletes: not in one request, nothing sent
                self._commit_joined(part)
                return
            except Exception as exc:  # outcome unknown
                self._finish(part, exc)
                return
            again: list[_Request] = []
            for group, outcome in zip(groups, outcomes, strict=True):
                if outcome is None:
                    with self._stats:
                        self.applied += len(group)
                    self._finish(group, None)
                elif isinstance(outcome, TransactionError) and outcome.index is not None:
                    owner, error = _attribute(group, outcome)
                    group.remove(owner)
                    self._finish([owner], error)
                    again += group  # the others at once: their ops were not at fault
                elif isinstance(outcome, (TransactionError, ValueError)):
                    self._commit_joined(group)  # refused whole, nothing applied: split
                else:
                    self._finish(group, outcome)  # outcome unknown
            part = self._unless_doomed(again)

    def _commit_joined(self, batch: list[_Request]) -> None:
        parts = [batch]
        while parts:
            part = self._unless_doomed(parts.pop())
            if not part:
                continue
            ops = [op for request in part for op in request.ops]
            try:
                with self._stats:
                    self.commits += 1
                self._reg.transaction(ops)
            except TransactionError as exc:
                if exc.index is None:
                    # refused as a whole (what the backend makes of it is too large): it
                    # applied nothing, so each half is tried on its own
                    self._split_or_finish(part, parts, exc)
                    continue
                owner, error = _attribute(part, exc)
                part.remove(owner)
                self._finish([owner], error)
                if part:
                    parts.append(part)  # the others at once: their ops were not at fault
            except ValueError as exc:
                # refused before sending, nothing applied: requests valid alone may clash
                # (one writes inside a subtree another deletes), so each half on its own
                self._split_or_finish(part, parts, exc)
            except Exception as exc:  # outcome unknown
                self._finish(part, exc)
            else:
                with self._stats:
                    self.applied += len(part)
                self._finish(part, None)

    def _unless_doomed(self, part: list[_Request]) -> list[_Request]:
        """``part`` without the requests whose ``doomed`` names an error: those are told it."""
        kept: list[_Request] = []
        for request in part:
            error = None
            if request.doomed is not None:
                try:
                    error = request.doomed()
                except Exception:
                    log.exception("a request's doomed check raised; the request is sent")
            if error is None:
                kept.append(request)
            else:
                self._finish([request], error)
        return kept

    def _split_or_finish(self, part: list[_Request], parts: list[list[_Request]], error: BaseException) -> None:
        """``part`` applied nothing: a lone request is told ``error``, else its halves
        are queued in ``parts`` to be tried on their own."""
        if len(part) == 1:
            self._finish(part, error)
        else:
            half = len(part) // 2
            parts += [part[half:], part[:half]]

    def _finish(self, requests: list[_Request], error: BaseException | None) -> None:
        for request in requests:
            try:
                request.callback(error)
            except Exception:
                log.exception("a commit callback raised; the batcher goes on")


#: joined transactions nested in one request where the registry sends them separately:
#: each may hold the server's limit less this many ops per list (``separate_room``)
_NESTED_GROUPS = 4


class _Packing:
    """Requests, in order, into ``groups`` joined transactions of at most ``limit`` cost
    each (``limit - groups`` when nested in one request); one group is a plain joined
    transaction of ``limit``. The first request goes whatever its cost."""

    __slots__ = ("_filled", "_groups", "_limit", "_used")

    def __init__(self, limit: int, groups: int) -> None:
        self._limit = limit if groups == 1 else limit - groups
        self._groups = groups
        self._filled = 0  # groups closed
        self._used = 0  # cost in the open group

    @property
    def full(self) -> bool:
        """Nothing more fits: the last group is filled to its limit."""
        return self._filled + 1 >= self._groups and self._used >= self._limit

    def add(self, cost: int) -> bool:
        """Place a request of ``cost``; False (nothing placed) when it fits no group."""
        if self._used and self._used + cost > self._limit:
            if self._filled + 1 >= self._groups or cost > self._limit:
                return False
            self._filled += 1
            self._used = 0
        self._used += cost
        return True


def _groups(requests: list[_Request], limit: int) -> list[list[_Request]]:
    """``requests``, in order, into joined transactions of at most ``limit`` cost each (a
    request over it alone). ``_take`` took them to fit ``_NESTED_GROUPS`` of them; should
    those left (not doomed, not yet told) make more, each nested transaction only has less
    room (``separate_room``), and one short of it is applied on its own."""
    groups: list[list[_Request]] = []
    used = 0
    for request in requests:
        if not groups or (used and used + request.cost > limit):
            groups.append([])
            used = 0
        groups[-1].append(request)
        used += request.cost
    return groups


def _attribute(batch: list[_Request], exc: TransactionError) -> tuple[_Request, TransactionError]:
    """The request owning the shared transaction's failed op ``exc.index``, and the error
    as that request's own transaction would have raised it."""
    assert exc.index is not None
    offset = 0
    for request in batch:
        if exc.index < offset + len(request.ops):
            index = exc.index - offset
            op = request.ops[index]
            if exc.cause is not None:
                return request, TransactionError.for_op(index, op, exc.cause)
            return request, TransactionError(str(exc), index=index, op=op)
        offset += len(request.ops)
    raise AssertionError(f"failed op {exc.index} lies outside a batch of {offset} ops")
