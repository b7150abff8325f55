"""Wiring of a scheduler's observability: its run history, its metrics, its HTTP
endpoints, and the snapshot of its state they read.

Invariant: nothing here runs on a fire's path except the observers themselves; the
snapshot reads only the scheduler's local cache and session state, never the registry,
so a scrape or a probe costs no round trip and works while the registry is cut.
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scheduler.events import Observers
from sharding import InstanceIdentity

if TYPE_CHECKING:
    from scheduler.history import HistoryWriter
    from scheduler.http import HttpEndpoint
    from scheduler.metrics import MetricsObserver
    from scheduler.runtime import Runtime
    from scheduler.scheduler import Scheduler

__all__ = ["HttpEndpoint", "JobState", "SchedulerState", "enable_metrics", "make_history", "serve_http", "snapshot"]

#: a /healthz older than this since the timer's last heartbeat means the timer is stuck
HEARTBEAT_STALE = 5.0
_HEARTBEAT_KEY = ("__shardjob__", "heartbeat")


def make_history(history: str | HistoryWriter | None, identity: InstanceIdentity, observers: Observers) -> HistoryWriter | None:
    """A writer for ``history`` (a URL or a writer made by the caller) subscribed to the
    scheduler's events; None when history is off."""
    if history is None:
        return None
    from scheduler.history import HistoryRecorder, HistoryWriter

    writer = history if isinstance(history, HistoryWriter) else HistoryWriter(history)
    observers.add(HistoryRecorder(writer, identity))
    return writer


_metrics: weakref.WeakKeyDictionary[Scheduler, MetricsObserver] = weakref.WeakKeyDictionary()
_heartbeats: weakref.WeakKeyDictionary[Scheduler, list[float]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def enable_metrics(sched: Scheduler) -> MetricsObserver:
    """The scheduler's metrics (made and subscribed on the first call)."""
    from scheduler.metrics import MetricsObserver

    with _lock:
        found = _metrics.get(sched)
        if found is None:
            found = _metrics[sched] = MetricsObserver(sched)
            sched.observers.add(found)
        return found


@dataclass(frozen=True)
class JobState:
    name: str
    registered: bool
    leader: bool
    failover_queued: int
    epoch: int
    cached: dict[str, str]


@dataclass(frozen=True)
class SchedulerState:
    instance_id: str
    started: bool
    connected: bool
    jobs: tuple[JobState, ...]
    failed_jobs: dict[str, str]


def _runtime(sched: Scheduler) -> Runtime | None:
    return sched.runtime


def snapshot(sched: Scheduler, *, with_cache: bool = False) -> SchedulerState:
    """This instance's cached view: session, and per job its registration, leadership,
    failover queue and (``with_cache``) the cached nodes under the job."""
    from registry.protocol import SessionState

    rt = _runtime(sched)
    connected = rt is not None and rt.reg.state in (SessionState.CONNECTED, SessionState.RECONNECTED)
    jobs: list[JobState] = []
    if rt is not None:
        for name in sched.jobs:
            try:
                runner = sched.runner(name)
                service = runner.sharding
            except (KeyError, RuntimeError):
                jobs.append(JobState(name, False, False, 0, 0, {}))
                continue
            cache = rt.cache
            cached: dict[str, str] = {}
            if with_cache:
                _walk(cache, runner.paths.root, cached)
            assignment = service.current()
            # the queue is ONE node holding every entry (sharding.failover), not children
            queue = cache.get_node(runner.paths.failover_items)
            jobs.append(
                JobState(
                    name=name,
                    registered=bool(service.registered),
                    leader=bool(service.is_leader),
                    failover_queued=0 if queue is None else len(service.marks.queue(queue).entries),
                    epoch=0 if assignment is None else assignment.epoch,
                    cached=cached,
                )
            )
    return SchedulerState(
        instance_id=sched.instance_id,
        started=rt is not None and sched.running,
        connected=connected,
        jobs=tuple(jobs),
        failed_jobs={k: str(v) for k, v in sched.failed_jobs.items()},
    )


def _walk(cache: Any, path: str, out: dict[str, str], depth: int = 0) -> None:
    value = cache.get(path)
    if value is not None:
        out[path] = value.decode("utf-8", "replace")
    if depth > 8:
        return
    for child in cache.children(path):
        _walk(cache, f"{path.rstrip('/')}/{child}", out, depth + 1)


def heartbeat_age(sched: Scheduler) -> float | None:
    """Seconds since the timer last ran the heartbeat entry (scheduled on first use); None
    before the scheduler started."""
    rt = _runtime(sched)
    if rt is None:
        return None
    with _lock:
        beat = _heartbeats.get(sched)
        if beat is None:
            beat = _heartbeats[sched] = [time.monotonic()]

            def tick(_: float) -> None:
                beat[0] = time.monotonic()
                if not rt.stopping.is_set():
                    rt.timer.schedule(_HEARTBEAT_KEY, time.time() + 1.0, tick)

            rt.timer.schedule(_HEARTBEAT_KEY, time.time(), tick)
    return time.monotonic() - beat[0]


def serve_http(sched: Scheduler, address: str) -> HttpEndpoint:
    from scheduler.http import HttpEndpoint

    enable_metrics(sched)
    return HttpEndpoint.start(sched, address)
