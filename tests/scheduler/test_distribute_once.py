"""Once-per-cluster listeners on memory, ZooKeeper and etcd: three instances of one job,
``before_all`` once per fire before any item of the fire starts anywhere, ``after_all``
once per fire after every item of it ended everywhere; a straggler of a settled fire
changes nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from registry.recipes.cache import TreeCache
from scheduler import DistributeOnceListener, JobConfig, JobRun, Scheduler, ShardingContext
from scheduler.distribute_once import OncePerCluster
from sharding.layout import JobPaths
from tests.harness import Harness
from tests.waiting import wait_for

EVERY_SECOND = "* * * * * ?"
TOTAL = 6
IDS = ("10.0.0.1@-@a", "10.0.0.2@-@b", "10.0.0.3@-@c")
#: simulated work, so that a listener running beside the items would overlap them
WORK = 0.15


class Timeline:
    """What ran where and when: item runs and the listeners' calls."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[tuple[float, int, str, float, float]] = []  # fire, item, instance, start, end
        self.calls: list[tuple[str, float, str, float, float]] = []  # kind, fire, instance, start, end

    def job(self, instance: str) -> Callable[[ShardingContext], None]:
        def run(ctx: ShardingContext) -> None:
            start = time.time()
            time.sleep(WORK)
            with self.lock:
                self.items.append((ctx.fire_time, ctx.sharding_item, instance, start, time.time()))

        return run

    def listener(self, instance: str) -> DistributeOnceListener:
        timeline = self

        class Recorder(DistributeOnceListener):
            def _record(self, kind: str, run: JobRun) -> None:
                start = time.time()
                time.sleep(WORK)
                with timeline.lock:
                    timeline.calls.append((kind, run.fire_time, instance, start, time.time()))

            def before_all(self, run: JobRun) -> None:
                self._record("before", run)

            def after_all(self, run: JobRun) -> None:
                self._record("after", run)

        return Recorder(started_timeout=5, completed_timeout=5)

    def settled_fires(self, after: float) -> list[float]:
        """Fires after ``after`` whose items all ran and whose after_all came."""
        with self.lock:
            ran: dict[float, set[int]] = {}
            for fire, item, *_ in self.items:
                ran.setdefault(fire, set()).add(item)
            closed = {fire for kind, fire, *_ in self.calls if kind == "after"}
        return sorted(f for f, items in ran.items() if f > after and len(items) == TOTAL and f in closed)


def test_before_all_and_after_all_run_once_per_fire_around_every_item(
    harness: Harness, namespace: str, made: list[Scheduler]
) -> None:
    timeline = Timeline()
    config = JobConfig(name="once", cron=EVERY_SECOND, sharding_total_count=TOTAL)
    for instance in IDS:
        sched = Scheduler(harness.url(namespace), instance_id=instance)
        made.append(sched)
        sched.add_job(config, timeline.job(instance), listeners=[timeline.listener(instance)])
        sched.start()

    def all_three_assigned() -> bool:
        current = made[0].runner("once").sharding.current()
        return current is not None and sorted(i for i, items in current.items.items() if items) == sorted(IDS)

    wait_for(all_three_assigned, 15, message="the three instances never shared the job")
    since = time.time() + 1
    wait_for(lambda: len(timeline.settled_fires(since)) >= 3, 20, message=lambda: f"calls {timeline.calls}")
    fires = timeline.settled_fires(since)[:3]
    with timeline.lock:
        items, calls = list(timeline.items), list(timeline.calls)
    for fire in fires:
        runs = [(start, end, who) for f, _, who, start, end in items if f == fire]
        befores = [(start, end) for kind, f, _, start, end in calls if kind == "before" and f == fire]
        afters = [(start, end) for kind, f, _, start, end in calls if kind == "after" and f == fire]
        assert len(befores) == 1 and len(afters) == 1, (fire, befores, afters)
        assert len({who for *_, who in runs}) == 3, "every instance ran items of the fire"
        assert befores[0][1] <= min(start for start, _, _ in runs), "an item started before before_all ended"
        assert afters[0][0] >= max(end for _, end, _ in runs), "after_all started before every item ended"
    assert not harness.connect(namespace).exists(f"{JobPaths('once').guarantee}/{fires[0]:.6f}"), "not cleaned up"


def test_a_straggler_of_a_settled_fire_changes_nothing(harness: Harness, namespace: str) -> None:
    reg = harness.connect(namespace)
    paths = JobPaths("once")
    called: list[str] = []

    class Counting(DistributeOnceListener):
        def before_all(self, run: JobRun) -> None:
            called.append("before")

        def after_all(self, run: JobRun) -> None:
            called.append("after")

    cache = TreeCache(reg, "/").start()
    try:
        def once(instance: str) -> OncePerCluster:
            return OncePerCluster(
                Counting(started_timeout=1, completed_timeout=0.2), reg, cache, paths, instance,
                lambda run: frozenset({"a", "b"}), lambda task: task(),
            )

        fire = float(int(time.time()))
        run = JobRun(job_name="once", instance_id="a", fire_time=fire, epoch=1, items=(0,))
        first, straggler = once("a"), once("b")
        late = JobRun(job_name="once", instance_id="b", fire_time=fire, epoch=1, items=(1,))
        first.before_job(run)
        straggler.before_job(late)  # takes part, then falls behind
        first.after_job(run)  # b never completes: after_all at the timeout, then cleaned up
        assert called == ["before", "after"]
        wait_for(lambda: not reg.exists(f"{paths.guarantee}/{fire:.6f}"), 5, message="fire not cleaned up")
        straggler.after_job(late)
        assert called == ["before", "after"]
        assert not reg.exists(f"{paths.guarantee}/{fire:.6f}"), "the straggler re-created the settled fire"
    finally:
        cache.close()
