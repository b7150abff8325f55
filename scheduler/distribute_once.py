"""Once-per-cluster listeners (ElasticJob's ``AbstractDistributeOnceElasticJobListener``):
``before_all(run)`` on one instance before any instance starts its items of a fire,
``after_all(run)`` on one instance after every instance finished them.

How a fire goes, on every backend alike (``/{job}/guarantee/{fire}``, persistent):

1. Each instance running items of the fire tries to create ``before`` (its id). The one that
   creates it runs ``before_all`` and then sets ``before`` to ``done``; every other one
   waits (its cache, no polling) until ``before`` says done, bounded by ``started_timeout``.
   Only then does an instance start its items.
2. An instance whose items all ended creates ``completed/{instance}`` in a transaction that
   checks ``before``, then waits until every participant of the fire (the instances the
   fire's assignment gives items not disabled) completed, bounded by ``completed_timeout``.
   Whoever sees that first — or whose wait runs out first — creates ``after`` (again
   checking ``before``), runs ``after_all``, and deletes the fire's subtree.

Invariants and hazards:

- One create-if-absent per step: ``before_all`` and ``after_all`` run at most once per
  fire; ``before_all`` exactly once unless its instance dies inside it (the others go on at
  ``started_timeout``, and none runs it again), ``after_all`` exactly once while one
  participant lives, at ``completed_timeout`` when one died mid-fire.
- Every write after the first checks ``before``: once the fire's subtree is deleted, a
  straggler's completion or claim fails instead of re-creating it and running
  ``after_all`` a second time.
- O(1) round trips per fire per instance: a create, perhaps a set, a transaction to
  complete, a transaction to claim, and the winner's delete.
- Failover runs (a crashed instance's items run elsewhere) take no part: the crashed
  instance's completion is what ``completed_timeout`` stands in for.
- The wait for the others' completion holds one worker thread, not the job: the job's next
  fire starts as usual.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from registry.errors import NodeExistsError, RegistryError, TransactionError
from registry.paths import join
from registry.protocol import Check, Create, Delete, RegistryCenter
from registry.recipes.cache import TreeCache
from scheduler.handlers import JobListener, JobRun
from sharding.layout import JobPaths
from sharding.service import ShardingService

__all__ = ["DistributeOnceListener", "OncePerCluster", "bind_once_per_cluster"]

log = logging.getLogger("scheduler.jobs")

_DONE = b"done"
#: a fire's subtree left by instances that all died is deleted this long after its timeouts
_ABANDONED_AFTER = 2.0


class DistributeOnceListener(JobListener):
    """Subclass and override ``before_all`` and/or ``after_all``; give an instance to
    ``add_job(listeners=[...])`` on every instance (its job's runner binds it to the
    cluster: ``bind_once_per_cluster``). ``started_timeout``: how long instances
    wait for ``before_all`` to end; ``completed_timeout``: how long after its own items the
    instance that runs ``after_all`` waits for the others' (make it longer than a run lasts)."""

    def __init__(self, started_timeout: float = 60.0, completed_timeout: float = 600.0) -> None:
        if not started_timeout > 0 or not completed_timeout > 0:
            raise ValueError(
                f"started_timeout {started_timeout!r} and completed_timeout {completed_timeout!r}: must be > 0"
            )
        self.started_timeout = float(started_timeout)
        self.completed_timeout = float(completed_timeout)

    def before_all(self, run: JobRun) -> None:
        """Once per fire, before any instance starts its items (``run``: this instance's)."""

    def after_all(self, run: JobRun) -> None:
        """Once per fire, after every instance's items ended (``run``: this instance's;
        ``run.errors`` holds only its own failures)."""


def _fire_key(fire_time: float) -> str:
    return f"{fire_time:.6f}"


class OncePerCluster(JobListener):
    """One ``DistributeOnceListener`` on one job of one instance (made by the job's runner).

    ``participants(run)``: the instances running items of the run's fire, from the cached
    assignment of the run's epoch (None when the cache has moved on: then only the timeout
    ends the wait). ``submit``: hands a task to the worker pool."""

    def __init__(
        self,
        listener: DistributeOnceListener,
        reg: RegistryCenter,
        cache: TreeCache,
        paths: JobPaths,
        instance_id: str,
        participants: Callable[[JobRun], frozenset[str] | None],
        submit: Callable[[Callable[[], None]], None],
    ) -> None:
        self.listener = listener
        self._reg = reg
        self._cache = cache
        self._paths = paths
        self._me = instance_id
        self._participants = participants
        self._submit = submit
        self._expected: dict[float, frozenset[str] | None] = {}

    def _fire(self, run: JobRun) -> str:
        return join(self._paths.guarantee, _fire_key(run.fire_time))

    # -- before ---------------------------------------------------------------------------
    def before_job(self, run: JobRun) -> None:
        if run.failover:
            return
        if time.time() - run.fire_time > self.listener.started_timeout + self.listener.completed_timeout:
            # so late that the fire may be settled and its subtree gone: taking part now
            # could run before_all a second time
            log.warning(
                "job %s fire %.3f: started too late to take part in once-per-cluster listeners",
                run.job_name,
                run.fire_time,
            )
            return
        self._expected[run.fire_time] = self._participants(run)
        before = join(self._fire(run), "before")
        if self._cache.get(before) is None:
            try:
                self._reg.create(before, self._me.encode())
            except NodeExistsError:
                pass
            else:
                try:
                    self.listener.before_all(run)
                except Exception:
                    log.exception("job %s: before_all raised; the items run", run.job_name)
                finally:
                    self._reg.put(before, _DONE)
                return
        if not self._cache.wait_until(
            lambda: self._cache.get(before) == _DONE, self.listener.started_timeout, under=self._fire(run)
        ):
            log.warning(
                "job %s fire %.3f: before_all did not end within %gs; the items run",
                run.job_name,
                run.fire_time,
                self.listener.started_timeout,
            )

    # -- after ----------------------------------------------------------------------------
    def after_job(self, run: JobRun) -> None:
        if run.failover or run.fire_time not in self._expected:
            return  # took no part (a failover run, or one that started too late)
        expected = self._expected.pop(run.fire_time)
        fire = self._fire(run)
        before = Check(join(fire, "before"))
        try:
            self._reg.transaction([before, Create(join(fire, "completed", self._me))])
        except TransactionError:
            return  # the fire was settled without us (its subtree is gone)
        except RegistryError:
            log.warning(
                "job %s fire %.3f: completion not recorded", run.job_name, run.fire_time, exc_info=True
            )
            return
        self._submit(lambda: self._settle(run, expected))

    def _settle(self, run: JobRun, expected: frozenset[str] | None) -> None:
        """Wait (a worker thread) for every participant's completion or the timeout, then
        claim ``after`` and run ``after_all`` if the claim is ours."""
        fire = self._fire(run)
        completed, after = join(fire, "completed"), join(fire, "after")

        def settled() -> bool:
            if not self._cache.exists(fire) or self._cache.exists(after):
                return True  # claimed (or settled) by someone
            return expected is not None and expected <= set(self._cache.children(completed))

        self._cache.wait_until(settled, self.listener.completed_timeout, under=fire)
        if not self._cache.exists(fire) or self._cache.exists(after):
            return
        try:
            self._reg.transaction([Check(join(fire, "before")), Create(after, self._me.encode())])
        except (TransactionError, NodeExistsError):
            return  # another instance claimed it, or the fire is settled
        except RegistryError:
            log.warning("job %s fire %.3f: after_all not claimed", run.job_name, run.fire_time, exc_info=True)
            return
        try:
            self.listener.after_all(run)
        except Exception:
            log.exception("job %s: after_all raised", run.job_name)
        finally:
            self._clean_up(run)

    def _clean_up(self, run: JobRun) -> None:
        """Delete this fire's subtree and older ones that are settled (``after`` there) or
        abandoned (past both timeouts twice over: every instance of it died)."""
        horizon = run.fire_time - _ABANDONED_AFTER * (
            self.listener.started_timeout + self.listener.completed_timeout
        )
        doomed = [self._fire(run)]
        for key in self._cache.children(self._paths.guarantee):
            try:
                fire_time = float(key)
            except ValueError:
                continue
            path = join(self._paths.guarantee, key)
            if fire_time < run.fire_time and (self._cache.exists(join(path, "after")) or fire_time < horizon):
                doomed.append(path)
        for path in doomed:
            try:
                self._reg.transaction([Delete(path)])
            except RegistryError:
                log.debug("job %s: %s not deleted", run.job_name, path, exc_info=True)


def bind_once_per_cluster(
    listeners: Sequence[JobListener],
    reg: RegistryCenter,
    cache: TreeCache,
    sharding: ShardingService,
    submit: Callable[[Callable[[], None]], None],
) -> tuple[JobListener, ...]:
    """``listeners`` with each ``DistributeOnceListener`` bound to ``sharding``'s job."""

    def participants(run: JobRun) -> frozenset[str] | None:
        current = sharding.current()
        if current is None or current.epoch != run.epoch:
            return None
        disabled = sharding.disabled_items()
        return frozenset(instance for instance, items in current.items.items() if set(items) - disabled)

    return tuple(
        OncePerCluster(
            listener, reg, cache, sharding.paths, sharding.identity.instance_id, participants, submit
        )
        if isinstance(listener, DistributeOnceListener)
        else listener
        for listener in listeners
    )
