"""A run whose running mark is answered after the session's deadline is not started, on
memory, ZooKeeper and etcd: the answer may have been held on its way past the session's
end, and the items handed on since. The fire is tried again once its mark, still in
place while the session lasts, has been removed as stale; it then runs, once.

The registry under test is the real one, wrapped so that one mark's answer is reported
late (``session_deadline`` in the past when the runner asks); how each backend computes
its deadline is ``tests/registry/test_session_deadline.py``'s."""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Callable, Sequence

import pytest

from registry.backends.base import BaseRegistry
from registry.counting import CountingRegistry
from registry.errors import RegistryConnectionError
from registry.protocol import Create, Delete, Op, Set
from scheduler import JobConfig, Scheduler, ShardingContext
from sharding.failover import FailoverEntry
from sharding.layout import JobPaths
from tests.waiting import wait_for

EVERY_SECOND = "* * * * * ?"
FAILOVER_QUEUE = JobPaths("job").failover_items.rpartition("/job")[2]


def _marks(ops: Sequence[Op]) -> bool:
    return any(isinstance(op, Create) and "/running/" in op.path for op in ops)


def _claims(ops: Sequence[Op]) -> bool:
    """A mark that claims failover entries: it rewrites the queue in the same transaction."""
    return _marks(ops) and any(isinstance(op, Set | Delete) and op.path.endswith(FAILOVER_QUEUE) for op in ops)


class _LateOnce(CountingRegistry):
    """Once ``arm(which)`` is called, the next transaction ``which`` picks is applied and
    the session's deadline then reads as passed, once: what the runner sees when that
    answer came after the session's end. With ``lost``, that transaction's answer is
    lost instead (applied, and the caller told the registry could not be reached)."""

    def __init__(self, inner: BaseRegistry) -> None:
        super().__init__(inner)
        self._backend = inner
        self._which: Callable[[Sequence[Op]], bool] | None = None
        self._late = False
        self._lose = False
        #: when the picked transaction was applied (``time.time()``); None until then
        self.told_at: float | None = None

    def arm(self, which: Callable[[Sequence[Op]], bool] = _marks, *, lost: bool = False) -> None:
        self._lose = lost
        self._which = which

    def transaction(self, ops: Sequence[Op]) -> None:
        super().transaction(ops)
        which = self._which
        if which is not None and which(ops):
            self._which = None
            self.told_at = time.time()
            if self._lose:
                raise RegistryConnectionError("the test lost this transaction's answer")
            self._late = True

    def session_deadline(self) -> float:
        if self._late:
            self._late = False
            return -math.inf
        return self._backend.session_deadline()


def test_a_run_whose_mark_is_answered_after_the_session_deadline_runs_later_once(
    reg: BaseRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    registry = _LateOnce(reg)
    runs: list[tuple[float, float]] = []  # (fire time, start)
    lock = threading.Lock()

    def job(ctx: ShardingContext) -> None:
        with lock:
            runs.append((ctx.fire_time, time.time()))

    with Scheduler(registry, instance_id="10.0.0.1@-@late", max_workers=2) as sched:
        sched.add_job(JobConfig(name="job", cron=EVERY_SECOND, sharding_total_count=1), job)
        sched.start()
        wait_for(lambda: len(runs) >= 2, 20, message=lambda: f"{len(runs)} runs before the late answer")
        registry.arm()
        wait_for(lambda: registry.told_at is not None, 10, message="no mark was answered after arming")
        told_at = registry.told_at
        assert told_at is not None
        wait_for(lambda: _late_fires(caplog), 10, message="the runner never said it held a run back")
        (late_fire,) = _late_fires(caplog)
        wait_for(
            lambda: any(fire >= late_fire + 2 for fire, _ in runs),
            20,
            message=lambda: f"no run two fires past the late one {late_fire}: {sorted(runs)}",
        )
    with lock:
        starts = [start for fire, start in runs if fire == late_fire]
        fires = [fire for fire, _ in runs]
    assert len(starts) == 1, f"fire {late_fire} ran {len(starts)} times: {sorted(runs)}"
    # not at its answer: once the mark it left was removed as stale, and it was tried again
    removed = [r.created for r in caplog.records if "removed a stale running mark" in r.getMessage()]
    assert removed, "the late mark was never removed"
    assert told_at < removed[0] < starts[0]
    assert len(fires) == len(set(fires)), f"a fire ran twice: {sorted(fires)}"


def _late_fires(caplog: pytest.LogCaptureFixture) -> list[float]:
    """The fires the runner did not start for a late answer, as its log names them."""
    pattern = re.compile(r"run of fire (\d+\.\d+) not started, its mark was answered after")
    return [float(m.group(1)) for r in list(caplog.records) if (m := pattern.search(r.getMessage()))]


@pytest.mark.parametrize("lost", [False, True], ids=["answered-late", "answer-lost"])
def test_a_failover_run_not_started_after_its_claim_puts_the_claims_back(
    reg: BaseRegistry, caplog: pytest.LogCaptureFixture, lost: bool
) -> None:
    """A claim applied whose answer came late, or was lost: its entries go back to the
    queue and run once as failover, and its fire is not replayed as this job's own."""
    caplog.set_level(logging.INFO)
    registry = _LateOnce(reg)
    runs: list[tuple[float, bool]] = []  # (fire time, failover)
    lock = threading.Lock()

    def job(ctx: ShardingContext) -> None:
        with lock:
            runs.append((ctx.fire_time, ctx.failover))

    with Scheduler(registry, instance_id="10.0.0.1@-@late", max_workers=2) as sched:
        sched.add_job(JobConfig(name="job", cron=EVERY_SECOND, sharding_total_count=1, failover=True), job)
        sched.start()
        wait_for(lambda: runs, 20, message="no run before the failover entry")
        lost_fire = float(int(time.time()) - 30)  # a fire a departed instance never ran
        registry.arm(_claims, lost=lost)
        queued = sched.runner("job").sharding.queue_failover([FailoverEntry(lost_fire, 0, "gone")], "a test")
        assert queued == 1
        wait_for(
            lambda: (lost_fire, True) in runs,
            20,
            message=lambda: f"the failover run never ran: {sorted(runs)}",
        )
        told_at = registry.told_at
    assert told_at is not None, "no claim was answered late"
    assert runs.count((lost_fire, True)) == 1, sorted(runs)
    messages = [r.getMessage() for r in caplog.records]
    why = "of unknown outcome" if lost else "answered after the session's deadline"
    assert any(f"claimed by a mark {why}: queued for failover" in m for m in messages), messages
    # the mark the claim left is removed with it: the next claims are not refused by it
    # one after the other (dozens a second) until a fire of the job's own removes it
    refused = sum("run refused, already running" in m for m in messages)
    assert refused < 3, f"{refused} claims refused by the mark left in place"
    fires = [fire for fire, failover in runs if not failover]
    assert lost_fire not in fires, f"the claimed fire ran as this job's own: {sorted(runs)}"
    assert len(fires) == len(set(fires)), f"a fire ran twice: {sorted(fires)}"
