"""A testing kit for users' own tests: a fleet of schedulers in one process on a
``memory://`` store, with the faults a real fleet meets — an instance cut off from the
registry, its session expired, the registry down, a process killed — and no server to
run. What kazoo's ``kazoo.testing`` is to ZooKeeper users, for shardjob jobs.

    from scheduler.testing import MemoryFleet, wait_for

    with MemoryFleet(session_timeout=2.0) as fleet:
        a, b = fleet.scheduler("a"), fleet.scheduler("b")
        for sched in (a, b):
            sched.add_job(JobConfig(name="sync", cron="* * * * * ?", sharding_total_count=4,
                                    failover=True), sync)
            sched.start()
        fleet.kill(a)          # b runs a's items after the session timeout
        wait_for(lambda: ..., timeout=10)

The memory backend is a product feature, not a mock: it keeps the registry protocol's
semantics (sessions, ephemeral nodes, watches, atomic transactions) exactly as ZooKeeper
and etcd do, proven by the same contract suite. Every instance of a fleet is on its own
link of the store, so a fault reaches that instance alone.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from registry.backends.memory import MemoryRegistry, MemoryStore
from scheduler.scheduler import Scheduler

__all__ = ["MemoryFleet", "wait_for"]

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float, *, interval: float = 0.02, message: str = "") -> T:
    """Poll ``predicate`` until it returns something true, and return that; ``TimeoutError``
    (with ``message``) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise TimeoutError(message or f"condition not met within {timeout:g}s")
        time.sleep(interval)


class MemoryFleet:
    """Schedulers of one fleet in this process, on a store of their own (module docstring).

    ``session_timeout`` (seconds) is how long a cut-off or killed instance keeps its
    session, as a server would grant it."""

    def __init__(self, *, session_timeout: float = 2.0, namespace: str = "/fleet") -> None:
        self.store_name = "testing-" + uuid.uuid4().hex[:12]
        self.store = MemoryStore.named(self.store_name)
        self.session_timeout = session_timeout
        self.namespace = namespace
        self._links: dict[int, str] = {}
        self._schedulers: list[Scheduler] = []
        self._counter = itertools.count(1)

    def url(self, link: str = "") -> str:
        """The registry URL of this fleet's store (on ``link``, when given)."""
        query = f"?session_timeout={self.session_timeout:g}" + (f"&link={link}" if link else "")
        return f"memory://{self.store_name}{self.namespace}{query}"

    def scheduler(self, name: str | None = None, **options: Any) -> Scheduler:
        """A new scheduler (not started) on a link of its own; ``options`` go to
        ``Scheduler`` (``max_workers``, ``wait_timeout``...). Its instance id is
        ``10.0.0.{n}@-@{name}``, so each has a server of its own too."""
        n = next(self._counter)
        name = name or f"i{n}"
        link = f"link-{n}-{uuid.uuid4().hex[:6]}"
        sched = Scheduler(self.url(link), instance_id=f"10.0.0.{n}@-@{name}", **options)
        self._links[id(sched)] = link
        self._schedulers.append(sched)
        return sched

    # -- faults ---------------------------------------------------------------------------
    def cut(self, sched: Scheduler) -> None:
        """Cut ``sched`` off the registry: SUSPENDED at once; its session expires after
        the timeout unless ``restore`` comes first."""
        self.store.cut_link(self._link(sched))

    def restore(self, sched: Scheduler) -> None:
        """Give ``sched`` its connection back (a new session if the old one expired)."""
        self.store.restore_link(self._link(sched))

    def expire(self, sched: Scheduler) -> None:
        """Expire ``sched``'s session now, as the server does after its timeout."""
        client = sched.registry
        if not isinstance(client, MemoryRegistry):
            raise TypeError("expire() needs a scheduler of this fleet, started")
        self.store.expire(client)

    def outage(self) -> None:
        """The registry goes down for every instance (sessions are kept meanwhile)."""
        self.store.outage()

    def recover(self) -> None:
        self.store.recover()

    def kill(self, sched: Scheduler) -> None:
        """``sched``'s process dies: cut off for good and stopped without handing over.
        The others see it leave once its session expires, as after a SIGKILL."""
        self.store.cut_link(self._link(sched))
        sched.shutdown(wait=False)

    # -- lifecycle --------------------------------------------------------------------------
    def close(self) -> None:
        """Shut every scheduler down and forget the store."""
        for sched in self._schedulers:
            self.store.restore_link(self._links[id(sched)])
        for sched in self._schedulers:
            sched.shutdown(wait=True)
        self._schedulers.clear()

    def __enter__(self) -> MemoryFleet:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _link(self, sched: Scheduler) -> str:
        try:
            return self._links[id(sched)]
        except KeyError:
            raise ValueError("that scheduler is not one of this fleet's") from None
