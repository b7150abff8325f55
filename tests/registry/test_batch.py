"""Group commit (``registry.recipes.batch``) on every backend: independent transactions
share commits within every backend's limits, and one refused transaction is told alone
while the others in its batch are applied."""

from __future__ import annotations

import collections
import functools
import sys
import threading
import uuid
from collections.abc import Iterable, Sequence

import pytest

import registry
from registry.backends.base import MAX_TXN_BYTES, MAX_TXN_OPS, BaseRegistry
from registry.counting import CountingRegistry
from registry.errors import TransactionError
from registry.protocol import Check, Create, Delete, Op
from registry.recipes.batch import _NESTED_GROUPS, BatcherClosed, TransactionBatcher, _Request
from tests.harness import Harness
from tests.outcomes import Outcomes
from tests.servers.etcd import ROOMY_TXN_OPS


class _Recording(CountingRegistry):
    """Counts, and keeps the op count and value bytes of every transaction sent, its
    ``transaction_cost`` and whether the backend refused it."""

    def __init__(self, inner: BaseRegistry) -> None:
        super().__init__(inner)
        self.sent: list[tuple[int, int]] = []
        self.costs: list[int] = []
        self.refused: list[BaseException] = []

    def transaction(self, ops: Sequence[Op]) -> None:
        self.sent.append((len(ops), sum(len(getattr(op, "value", b"")) for op in ops)))
        self.costs.append(self.transaction_cost(ops))
        try:
            super().transaction(ops)
        except Exception as exc:
            self.refused.append(exc)
            raise


def _run_all(batcher: TransactionBatcher, requests: dict[object, list[Op]]) -> Outcomes[object]:
    outcomes = Outcomes[object]()
    for key, ops in requests.items():
        batcher.submit(ops, functools.partial(outcomes.record, key))
    batcher.start()
    outcomes.wait(len(requests))
    return outcomes


def test_one_refused_transaction_leaves_the_others_of_its_batch_applied(reg: BaseRegistry) -> None:
    reg.put("/jobs/b", b"v1")
    stale = reg.get_node("/jobs/b")
    assert stale is not None
    reg.put("/jobs/b", b"v2")  # b's plan below checks the version before this write
    recording = _Recording(reg)
    requests: dict[object, list[Op]] = {
        "a": [Create("/marks/a", b"a")],
        "b": [Create("/marks/b", b"b"), Check("/jobs/b", stale.version)],
        "c": [Create("/marks/c", b"c"), Create("/marks/c2", b"c")],
    }
    # queued before the committer starts, and room for all three: one batch
    batcher = TransactionBatcher(recording, max_ops=sum(map(reg.transaction_cost, requests.values())))
    try:
        outcomes = _run_all(batcher, requests)
    finally:
        batcher.close()
    refused = outcomes.by_key["b"]
    assert isinstance(refused, TransactionError)
    assert refused.index == 1 and refused.op is requests["b"][1]  # its own op, by its own index
    assert outcomes.by_key["a"] is None and outcomes.by_key["c"] is None
    assert [reg.exists(f"/marks/{p}") for p in ("a", "b", "c", "c2")] == [True, False, True, True]
    assert [count for count, _ in recording.sent] == [5, 3]  # the shared one, then the rest at once


def test_doomed_requests_are_told_their_error_and_never_sent(reg: BaseRegistry) -> None:
    """Requests whose caller knows before sending that they must fail (a hundred fires
    fenced on a registration their session took away) cost no round trip, and the
    request queued behind them is applied in the first transaction sent."""
    recording = _Recording(reg)
    lost = TransactionError("the registration is gone", index=0)
    outcomes = Outcomes[object]()
    batcher = TransactionBatcher(recording)
    checked: list[int] = []

    def doomed(n: int) -> BaseException | None:
        checked.append(n)
        return lost

    try:
        for n in range(100):
            batcher.submit(
                [Create(f"/marks/doomed-{n}", b"x")],
                functools.partial(outcomes.record, n),
                doomed=functools.partial(doomed, n),
            )
        batcher.submit([Create("/marks/kept", b"k")], functools.partial(outcomes.record, "kept"), doomed=lambda: None)
        batcher.start()
        outcomes.wait(101)
    finally:
        batcher.close()
    assert all(outcomes.by_key[n] is lost for n in range(100))
    assert outcomes.by_key["kept"] is None and reg.exists("/marks/kept")
    assert not any(reg.exists(f"/marks/doomed-{n}") for n in range(100))
    assert sorted(checked) == list(range(100))
    assert recording.sent == [(1, 1)], "doomed requests were sent"


def test_requests_that_clash_only_when_shared_are_each_applied(reg: BaseRegistry) -> None:
    """One request deletes a subtree, another writes inside it: valid alone, refused
    together by every backend; both are applied, each on its own, and the rest with them."""
    reg.put("/jobs/a/old", b"o")
    recording = _Recording(reg)
    batcher = TransactionBatcher(recording)
    requests: dict[object, list[Op]] = {
        "delete": [Delete("/jobs/a")],
        "write": [Create("/jobs/a/new", b"n")],
        "other": [Create("/marks/x", b"x")],
    }
    try:
        outcomes = _run_all(batcher, requests)
    finally:
        batcher.close()
    assert outcomes.by_key == {"delete": None, "write": None, "other": None}
    assert not reg.exists("/jobs/a/old") and reg.get("/marks/x") == b"x"
    assert recording.sent[0][0] == 3  # tried shared first, then split


def test_ten_thousand_marks_share_commits_within_every_limit(reg: BaseRegistry) -> None:
    jobs = [f"/job-{n:05d}" for n in range(10_000)]
    recording = _Recording(reg)
    creator = TransactionBatcher(recording)
    try:
        # each job's marks parent is there, as after its first fire
        created = _run_all(
            creator, {job: [Create(f"{job}/instances/i", b"{}"), Create(f"{job}/running", b"")] for job in jobs}
        )
    finally:
        creator.close()
    assert set(created.by_key.values()) == {None}
    versions = {job: reg.get_node(f"{job}/instances/i") for job in jobs[:: len(jobs) // 20]}
    # the shape of a fire's fenced mark: two checks and the mark, with a trace as its value
    trace = b'{"state":"running","items":"0-9","fire_time":1764000000.0,"failover":false}' * 2

    def mark_ops(job: str) -> list[Op]:
        return [Check(f"{job}/instances/i"), Check(f"{job}/instances/i"), Create(f"{job}/running/i", trace, ephemeral=True)]

    marks = TransactionBatcher(recording)
    recording.sent.clear()
    recording.costs.clear()
    recording.refused.clear()  # creating the jobs' parents may overflow a batch (split)
    try:
        marked = _run_all(marks, {job: mark_ops(job) for job in jobs})
    finally:
        marks.close()
    assert set(marked.by_key.values()) == {None}
    assert recording.refused == []  # no shared transaction was too large for the backend
    # 42 marks per commit on ZooKeeper and memory (3 ops each), 32 on etcd (4 compares
    # each: the mark's parent is guarded); never one each
    per_commit = MAX_TXN_OPS // reg.transaction_cost(mark_ops(jobs[0]))
    assert len(recording.sent) <= 1.5 * len(jobs) / per_commit
    assert MAX_TXN_OPS // 2 < max(recording.costs) <= MAX_TXN_OPS  # filled past half, never past the limit
    assert max(size for _, size in recording.sent) <= MAX_TXN_BYTES
    assert all(reg.exists(f"{job}/running/i") for job in versions)


def test_ten_thousand_marks_through_the_registry_itself_stay_within_its_limits(
    reg: BaseRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batcher as the scheduler makes it, on the registry itself: on etcd each mark is
    one of ``_NESTED_GROUPS`` joined transactions nested in a shared request (each leaves the
    others one entry of the outer list), elsewhere one joined transaction. Every shared
    request within the server's limit per list, and on etcd about 124 marks a request
    where a joined transaction held 32."""
    jobs = [f"/job-{n:05d}" for n in range(10_000)]
    creator = TransactionBatcher(_Recording(reg))
    try:
        created = _run_all(creator, {job: [Create(f"{job}/instances/i", b"{}"), Create(f"{job}/running", b"")] for job in jobs})
    finally:
        creator.close()
    assert set(created.by_key.values()) == {None}
    shared: list[list[Sequence[Op]]] = []
    refused: list[BaseException] = []
    separate = reg.transactions

    def recording(groups: list[Sequence[Op]]) -> list[BaseException | None]:
        shared.append(groups)
        outcomes = separate(groups)
        refused.extend(outcome for outcome in outcomes if outcome is not None)
        return outcomes

    monkeypatch.setattr(reg, "transactions", recording)

    def mark_ops(job: str) -> list[Op]:
        return [Check(f"{job}/instances/i"), Check(f"{job}/instances/i"), Create(f"{job}/running/i", b"{}", ephemeral=True)]

    batcher = TransactionBatcher(reg)
    try:
        marked = _run_all(batcher, {job: mark_ops(job) for job in jobs})
    finally:
        batcher.close()
    assert set(marked.by_key.values()) == {None} and refused == []
    cost = reg.transaction_cost(mark_ops(jobs[0]))
    if reg.separate_transactions:
        assert max(len(groups) for groups in shared) == _NESTED_GROUPS  # requests of several
        for groups in shared:
            assert len(groups) <= _NESTED_GROUPS
            assert max(reg.transaction_cost(ops) for ops in groups) + len(groups) <= MAX_TXN_OPS
        per_request = _NESTED_GROUPS * ((MAX_TXN_OPS - _NESTED_GROUPS) // cost)  # 124 on etcd
    else:
        assert shared == []  # joined: ``transactions`` is not the batcher's way here
        per_request = MAX_TXN_OPS // cost
    assert batcher.commits <= 1.5 * len(jobs) / per_request
    assert all(reg.exists(f"{job}/running/i") for job in jobs[::500])


def test_a_raised_max_txn_ops_fills_shared_transactions_past_the_default(harness: Harness) -> None:
    # the suite's etcd server takes ROOMY_TXN_OPS ops per list; ZooKeeper and memory any number
    roomy = harness.connect(max_txn_ops=ROOMY_TXN_OPS)
    jobs = [f"/job-{n:04d}" for n in range(2_000)]
    setup = TransactionBatcher(roomy)
    try:
        made = _run_all(setup, {job: [Create(f"{job}/instances/i", b"{}"), Create(f"{job}/running", b"")] for job in jobs})
    finally:
        setup.close()
    assert set(made.by_key.values()) == {None}

    def mark_ops(job: str) -> list[Op]:
        return [Check(f"{job}/instances/i"), Check(f"{job}/instances/i"), Create(f"{job}/running/i", b"{}", ephemeral=True)]

    recording = _Recording(roomy)
    marks = TransactionBatcher(recording)
    assert marks.max_ops == ROOMY_TXN_OPS  # the registry's limit, not the protocol's default
    try:
        marked = _run_all(marks, {job: mark_ops(job) for job in jobs})
    finally:
        marks.close()
    assert set(marked.by_key.values()) == {None}
    assert recording.refused == []  # the server took every shared transaction
    assert MAX_TXN_OPS < max(recording.costs) <= ROOMY_TXN_OPS
    per_commit = ROOMY_TXN_OPS // roomy.transaction_cost(mark_ops(jobs[0]))
    assert len(recording.sent) <= 1.5 * len(jobs) / per_commit
    assert all(roomy.exists(f"{job}/running/i") for job in jobs[::100])


def test_a_closed_batcher_commits_what_is_queued_and_refuses_more(reg: BaseRegistry) -> None:
    batcher = TransactionBatcher(reg, max_delay=30.0)
    outcomes = Outcomes[object]()
    batcher.submit([Create("/queued", b"q")], functools.partial(outcomes.record, "queued"))
    batcher.start()
    batcher.close()  # long before the 30 s the request would wait for company
    assert outcomes.by_key == {"queued": None} and reg.exists("/queued")
    with pytest.raises(BatcherClosed):
        batcher.submit([Create("/late", b"l")], functools.partial(outcomes.record, "late"))


def test_a_submit_racing_close_is_refused_never_stranded(reg: BaseRegistry) -> None:
    """``submit`` queues without the lock: here ``close`` runs, and every committer leaves,
    between its check of ``closed`` and its append. Nobody would ever tell that request,
    so the submit must refuse it rather than return."""
    batcher = TransactionBatcher(reg).start()
    outcomes = Outcomes[object]()

    class _CloseFirst(collections.deque[object]):
        def append(self, item: object) -> None:
            batcher.close()  # the committers find the queue empty and leave
            super().append(item)

    batcher._pending = _CloseFirst()  # type: ignore[assignment]
    with pytest.raises(BatcherClosed):
        batcher.submit([Create("/raced", b"r")], functools.partial(outcomes.record, "raced"))
    assert not batcher._pending and outcomes.by_key == {} and not reg.exists("/raced")


_PRODUCERS, _EACH, _ROUNDS = 4, 5000, 3


@pytest.mark.parametrize("round_", range(_ROUNDS))
def test_submits_from_many_threads_are_each_told_once(round_: int) -> None:
    """Submits queue without the lock while committers batch them: with the interpreter
    switching threads every microsecond, every request is still told exactly once and no
    committer dies of a queue that grew under it. (The batcher's own concurrency, so on
    the memory registry, whose commits are quickest; a race shows in some rounds only.)"""
    reg = registry.connect(f"memory://batch-stress-{round_}-{uuid.uuid4().hex[:8]}")
    batcher = TransactionBatcher(reg, max_delay=0.0002, committers=4).start()
    told: collections.Counter[int] = collections.Counter()
    lock = threading.Lock()

    def record(key: int, error: BaseException | None) -> None:
        if error is None:
            with lock:
                told[key] += 1

    def produce(first: int) -> None:
        for key in range(first, first + _EACH):
            batcher.submit([Create(f"/s/{key}", b"")], functools.partial(record, key))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        producers = [threading.Thread(target=produce, args=(n * _EACH,)) for n in range(_PRODUCERS)]
        for thread in producers:
            thread.start()
        for thread in producers:
            thread.join(60)
        flushed = batcher.flush(timeout=10)
    finally:
        sys.setswitchinterval(interval)
    alive = [thread.is_alive() for thread in batcher._threads]
    batcher.close()
    reg.close()
    assert flushed and all(alive), f"committers alive: {alive}"
    assert len(told) == _EACH * _PRODUCERS and set(told.values()) == {1}


def test_commit_waits_for_its_own_outcome_while_others_share_the_transaction(reg: BaseRegistry) -> None:
    recording = _Recording(reg)
    reg.create("/taken", b"t")
    batcher = TransactionBatcher(recording, max_delay=0.05).start()
    errors: dict[int, BaseException | None] = {}
    claims = [Create(f"/c{n}", b"c") for n in range(8)] + [Create("/taken", b"again")]

    def claim(n: int) -> None:
        try:
            batcher.commit([Check("/taken"), claims[n]])
            errors[n] = None
        except TransactionError as exc:
            errors[n] = exc

    threads = [threading.Thread(target=claim, args=(n,)) for n in range(len(claims))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    batcher.close()
    refused = errors.pop(len(claims) - 1)
    assert isinstance(refused, TransactionError) and refused.index == 1 and refused.op is claims[-1]
    assert errors == dict.fromkeys(range(8)), errors
    assert all(reg.exists(f"/c{n}") for n in range(8)) and reg.get("/taken") == b"t"
    assert len(recording.sent) < len(claims), f"{len(recording.sent)} transactions for {len(claims)} commits"


def test_commit_from_a_callback_or_after_close_applies_directly(reg: BaseRegistry) -> None:
    batcher = TransactionBatcher(reg).start()
    outcomes = Outcomes[object]()

    def nested(error: BaseException | None) -> None:
        batcher.commit([Create("/from-callback", b"n")])  # a committer waiting for itself would hang
        outcomes.record("nested", error)

    batcher.submit([Create("/first", b"f")], nested)
    outcomes.wait(1, timeout=10)
    assert outcomes.by_key == {"nested": None} and reg.exists("/from-callback")
    batcher.close()
    batcher.commit([Create("/after-close", b"a")])
    assert reg.exists("/after-close")


def test_flush_returns_once_every_queued_request_is_told(reg: BaseRegistry) -> None:
    """Refused requests included: a batch one of whose requests is told apart (and the
    rest applied again) still counts as done."""
    reg.create("/f0", b"taken")
    batcher = TransactionBatcher(reg, max_delay=0.5)
    outcomes = Outcomes[object]()
    for n in range(5):
        batcher.submit([Create(f"/f{n}", b"f")], functools.partial(outcomes.record, n))
    assert not batcher.flush(timeout=0.05), "flush returned with nothing committed"
    batcher.start()
    assert batcher.flush(timeout=30)
    assert isinstance(outcomes.by_key.pop(0), TransactionError)
    assert outcomes.by_key == dict.fromkeys(range(1, 5))
    batcher.submit([Create("/f0", b"again")], functools.partial(outcomes.record, "again"))
    assert batcher.flush(timeout=30), "a refused request left the batcher busy"
    batcher.close()


def test_backlog_counts_requests_queued_and_in_flight_until_told(reg: BaseRegistry) -> None:
    """What the timer holds fires back on: every request submitted and not yet told."""
    sending = threading.Event()
    release = threading.Event()

    class _Held(CountingRegistry):
        def transaction(self, ops: Sequence[Op]) -> None:
            sending.set()
            release.wait(30)
            super().transaction(ops)

    batcher = TransactionBatcher(_Held(reg), max_ops=2, max_delay=0, committers=1)
    outcomes = Outcomes[object]()
    for n in range(5):
        batcher.submit([Create(f"/backlog{n}", b"b")], functools.partial(outcomes.record, n))
    assert batcher.backlog() == 5
    batcher.start()
    try:
        assert sending.wait(30), "the committer never sent a transaction"
        assert batcher.backlog() == 5, "requests in a transaction not yet applied left the backlog"
    finally:
        release.set()
    assert batcher.flush(timeout=30)
    assert batcher.backlog() == 0
    assert outcomes.by_key == dict.fromkeys(range(5))
    batcher.close()


def test_backlog_never_misses_a_request_while_a_committer_takes_it(reg: BaseRegistry) -> None:
    """``backlog()`` is read without the lock, so it must hold at every step of a take:
    looked at just after each request leaves the queue, and after one goes back (it did
    not fit, or it writes a path the batch writes), it counts every request not yet told.
    Counted in flight only once the take was over, it missed the requests being taken."""
    outcomes = Outcomes[object]()
    seen: list[tuple[int, int]] = []  # (backlog, requests not yet told)

    class _Watched(collections.deque[_Request]):
        def _look(self) -> None:
            # the committer takes and tells on one thread: the count told stays put here
            seen.append((batcher.backlog(), requests - len(outcomes.by_key)))

        def popleft(self) -> _Request:
            request = super().popleft()
            self._look()
            return request

        def appendleft(self, request: _Request) -> None:
            super().appendleft(request)
            self._look()

        def extendleft(self, kept: Iterable[_Request]) -> None:
            super().extendleft(kept)
            self._look()

    batcher = TransactionBatcher(reg, max_ops=3, max_delay=0, committers=1)
    batcher._pending = _Watched()
    # three to a transaction, so the fourth goes back; /taken1 twice, so one waits
    paths = ["/taken0", "/taken1", "/taken1", "/taken2", "/taken3", "/taken4", "/taken5"]
    requests = len(paths)
    for n, path in enumerate(paths):
        op = Create(path, b"b") if n != 2 else Delete(path)
        batcher.submit([op], functools.partial(outcomes.record, n))
    batcher.start()
    assert batcher.flush(timeout=30)
    batcher.close()
    assert outcomes.by_key == dict.fromkeys(range(requests))
    assert len(seen) > requests, "no request went back to the queue"
    missed = [(counted, untold) for counted, untold in seen if counted < untold]
    assert missed == [], f"backlog() missed requests being taken: {missed}"
