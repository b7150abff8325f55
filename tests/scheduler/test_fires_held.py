"""Fires wait for a real group commit: the timer reads the backlog of a
``TransactionBatcher`` over memory, ZooKeeper and etcd, holds due fires while a
transaction the registry has not answered keeps the backlog at its bound, and starts
them again, in due order, once the registry answers. ``test_timer.py`` proves the rule
against a backlog set by hand; this, the pair as ``Scheduler.start`` composes it (its
timer reads its group commit's ``backlog``) over each real registry."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest

from registry.backends.base import BaseRegistry
from registry.counting import CountingRegistry
from registry.protocol import Create, Op
from registry.recipes.batch import TransactionBatcher
from scheduler.timer import Timer
from tests.outcomes import Outcomes
from tests.waiting import wait_for

BOUND = 8
FIRES = 30


class _Unanswered(CountingRegistry):
    """The registry under test, whose transactions get no answer until ``answer`` is
    set: what a server that stopped answering looks like to the group commit."""

    def __init__(self, inner: BaseRegistry) -> None:
        super().__init__(inner)
        self.sent = threading.Event()
        self.answer = threading.Event()

    def transaction(self, ops: Sequence[Op]) -> None:
        self.sent.set()
        if not self.answer.wait(30):
            raise AssertionError("the test never let the registry answer")
        super().transaction(ops)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    executor = ThreadPoolExecutor(2, thread_name_prefix="held-test")
    yield executor
    executor.shutdown(wait=False, cancel_futures=True)


def test_fires_wait_while_the_registry_has_not_answered_and_all_run_once_it_does(
    reg: BaseRegistry, pool: ThreadPoolExecutor
) -> None:
    registry = _Unanswered(reg)
    batcher = TransactionBatcher(registry, max_delay=0, committers=1).start()
    timer = Timer(pool, max_drains=1, stall=5.0, backlog=batcher.backlog, max_backlog=BOUND)
    fired: list[int] = []
    applied = Outcomes[int]()

    def fire(n: int, _due: float) -> None:
        """What a fire costs the group commit: one request, its mark."""
        fired.append(n)
        batcher.submit([Create(f"/fires/{n}", b"")], functools.partial(applied.record, n))

    plain: list[float] = []

    def passed_every_fire_due() -> None:
        """A plain callback due after every fire has run: fires held by then stay held."""
        timer.schedule("plain", max(base + FIRES * 0.001, time.time()) + 0.01, plain.append)
        wait_for(lambda: plain, 5, message="a plain callback ran while fires were held")

    base = time.time() + 0.1
    for n in range(FIRES):
        timer.schedule(("fire", n), base + n * 0.001, functools.partial(fire, n), fire=True)
    timer.start()
    try:
        assert registry.sent.wait(10), "the first fire's request never reached the registry"
        wait_for(lambda: len(fired) == BOUND, 5, message=lambda: f"{len(fired)} fires started, not {BOUND}")
        passed_every_fire_due()
        assert len(fired) == BOUND, "a fire started while the backlog was at its bound"
        assert batcher.backlog() == BOUND
        assert not reg.exists("/fires"), "a request was applied before the registry answered"
        registry.answer.set()
        wait_for(lambda: len(fired) == FIRES, 10, message=lambda: f"{len(fired)} of {FIRES} fires started")
        assert batcher.flush(30), "the group commit never caught up"
    finally:
        registry.answer.set()
        timer.stop()
        batcher.close()
    assert fired == list(range(FIRES)), "fires started out of due order"
    assert applied.by_key == dict.fromkeys(range(FIRES)), "a fire's request was refused"
    assert sorted(reg.children("/fires"), key=int) == [str(n) for n in range(FIRES)]
