"""etcd's ``transaction_cost``: requests whose costs sum to 128 fit one etcd transaction,
every parent guard included, so a group commit never makes etcd read parents first or
refuse a batch as too large; parents a watch has not reported go into nested
transactions, which need room below the limit. Checked against the transaction
``plan_transaction`` builds, no server needed."""

from __future__ import annotations

import random
from collections.abc import Set as AbstractSet

import pytest
from pyetcd import etcdrpc
from pyetcd.utils import prefix_range_end

from registry.backends.etcd_txn import ETCD_MAX_TXN_OPS, plan_transaction, transaction_cost
from registry.errors import TransactionError
from registry.protocol import Check, Create, Delete, Op, Set


def _lists(ops: list[Op]) -> tuple[int, int]:
    """(compares with every guard, writes) of the etcd request for ``ops``; it has no
    failure branch (its keys are read only once it failed)."""
    plan = plan_transaction(ops, lease=7, missing=set())
    request = plan.request()
    assert not request.failure
    return len(plan.compares) + len(plan.optional), len(request.success)


def _mark(job: str) -> list[Op]:
    return [Check(f"/{job}/sharding", 3), Check(f"/{job}/instances/i", 4), Create(f"/{job}/running/i", b"t")]


def _random_request(rng: random.Random, job: str) -> list[Op]:
    ops: list[Op] = []
    for n in range(rng.randint(1, 5)):
        path = f"/{job}/{rng.choice(['a', 'b/c', 'd/e/f'])}/{n}"
        version = rng.choice([None, 5])
        choices: list[Op] = [
            Check(path, version),
            Create(path, b"v", ephemeral=rng.random() < 0.5),
            Set(path, b"v", version),
            Delete(path, version),
        ]
        ops.append(rng.choice(choices))
    return ops


def test_32_marks_fit_one_etcd_transaction_with_their_guards_and_33_do_not() -> None:
    assert transaction_cost(_mark("j")) == 4  # 3 compares and the guard of its parent
    fitting = [op for n in range(ETCD_MAX_TXN_OPS // 4) for op in _mark(f"job-{n}")]
    assert _lists(fitting)[0] == ETCD_MAX_TXN_OPS
    assert plan_transaction(fitting, lease=7, missing=set()).guards_fit()
    over = fitting + _mark("one-more")
    assert not plan_transaction(over, lease=7, missing=set()).guards_fit()


def test_a_removal_costs_its_two_deletes() -> None:
    ops: list[Op] = [Delete("/j/running/i")]
    assert transaction_cost(ops) == 2 == _lists(ops)[1]  # the key and the range below it


def test_requests_whose_costs_sum_to_the_limit_fit_one_transaction() -> None:
    rng = random.Random(1764000000)
    jobs = iter(range(10**9))
    for _ in range(300):
        batch: list[Op] = []
        cost = 0
        while True:
            request = _random_request(rng, f"job-{next(jobs)}")
            if cost + transaction_cost(request) > ETCD_MAX_TXN_OPS:
                break
            batch += request
            cost += transaction_cost(request)
        compares, writes = _lists(batch)
        assert max(compares, writes) <= cost <= ETCD_MAX_TXN_OPS, batch
        assert plan_transaction(batch, lease=7, missing=set()).guards_fit()


def _pins(ops: list[Op], missing: AbstractSet[str] = frozenset()) -> tuple[list[bytes], list[bytes]]:
    """(parents the plan creates, parents it guards by ``version > 0``)."""
    plan = plan_transaction(ops, lease=7, missing=set(missing))
    own = {op.path.encode() for op in ops}
    created = [
        key for key, _, result, number in plan.compares if result == etcdrpc.Compare.EQUAL and number == 0
    ]
    return [key for key in created if key not in own], [key for key, _, _, _ in plan.optional]


def test_each_mark_guards_its_parent_only_as_its_checks_pin_the_rest() -> None:
    ops = _mark("a") + _mark("b")
    assert _pins(ops) == ([], [b"/a/running", b"/b/running"])


def test_missing_parents_are_created_up_to_the_first_present_one_which_is_guarded() -> None:
    created, guarded = _pins([Create("/r/a/b/c", b"v")], missing={"/r/a/b", "/r/a"})
    assert sorted(created) == [b"/r/a", b"/r/a/b"]
    assert guarded == [b"/r"]


def test_a_present_parent_below_another_covers_its_guard() -> None:
    # /r/x exists, so /r does: one guard pins both creates' parents
    assert _pins([Create("/r/2", b"v"), Create("/r/x/1", b"v")]) == ([], [b"/r/x"])
    assert _pins([Create("/r/x/1", b"v"), Create("/r/2", b"v")]) == ([], [b"/r/x"])


def test_a_parent_another_op_names_needs_no_guard() -> None:
    assert _pins([Check("/r/a", 3), Create("/r/a/b", b"v")]) == ([], [])
    assert _pins([Create("/r/a", b"v"), Create("/r/a/b", b"v")], missing={"/r/a"}) == ([], [b"/r"])
    assert _pins([Set("/r/a", b"v"), Create("/r/a/b/c", b"v")], missing={"/r/a/b"}) == ([b"/r/a/b"], [])


def test_a_delete_removes_the_key_and_exactly_the_range_below_it() -> None:
    request = plan_transaction([Delete("/j/running/i")], lease=7, missing=set()).request()
    key, below = (op.request_delete_range for op in request.success)
    assert (key.key, key.range_end) == (b"/j/running/i", b"")
    assert (below.key, below.range_end) == (b"/j/running/i/", prefix_range_end(b"/j/running/i/"))


def test_a_raised_limit_fits_more_marks_with_every_guard() -> None:
    marks = [op for n in range(64) for op in _mark(f"job-{n}")]  # 4 compares each: 256
    roomy = plan_transaction(marks, lease=7, missing=set(), limit=256)
    assert roomy.guards_fit()
    assert len(roomy.request().compare) == 256
    default = plan_transaction(marks, lease=7, missing=set())
    assert not default.guards_fit()  # 192 compares without the guards: still too many
    with pytest.raises(TransactionError, match="at most 128 per list"):
        default.request()


def test_parents_a_watch_has_not_reported_are_put_by_nested_transactions_if_absent() -> None:
    plan = plan_transaction([Create("/r/a/b/c", b"v")], lease=7, missing=set(), unseen=lambda p: p != "/r")
    assert plan.ensured == [b"/r/a/b", b"/r/a"]
    assert [key for key, _, _, _ in plan.optional] == [b"/r"]  # the first one reported: guarded
    assert plan.fits()
    request = plan.request()
    assert [c.key for c in request.compare] == [b"/r/a/b/c", b"/r"]
    nested = [op.request_txn for op in request.success if op.WhichOneof("request") == "request_txn"]
    assert [txn.compare[0].key for txn in nested] == [b"/r/a/b", b"/r/a"]
    for txn in nested:
        (compare,) = txn.compare
        assert (compare.target, compare.result, compare.version) == (
            etcdrpc.Compare.VERSION, etcdrpc.Compare.EQUAL, 0,
        )  # fmt: skip
        (put,) = txn.success
        assert (put.request_put.key, put.request_put.value) == (compare.key, b"")
        assert not txn.failure  # present: left as it is, its value and version kept


def test_a_mark_whose_parent_a_watch_reported_has_no_nested_transaction() -> None:
    ops = _mark("a") + _mark("b")
    plan = plan_transaction(ops, lease=7, missing=set(), unseen=lambda p: False)
    assert plan.ensured == []
    assert plan.request() == plan_transaction(ops, lease=7, missing=set()).request()


def test_nested_transactions_need_an_outer_list_below_the_limit() -> None:
    # 127 creates and one nested transaction make 128 outer operations (and, with the
    # guard of /r, 128 compares): etcd would allow the nested one no room at all
    ops: list[Op] = [*(Create(f"/r/{n}", b"v") for n in range(126)), Create("/new/x", b"v")]
    plan = plan_transaction(ops, lease=7, missing=set(), unseen=lambda p: p == "/new")
    assert plan.ensured == [b"/new"] and not plan.fits()
    with pytest.raises(ValueError, match="no room for the nested transactions"):
        plan.request()
    fewer = plan_transaction(ops[1:], lease=7, missing=set(), unseen=lambda p: p == "/new")
    assert fewer.fits() and len(fewer.request().success) == 127
