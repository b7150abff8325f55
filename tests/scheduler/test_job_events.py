"""A process's one cache listener and one session listener hand each job what concerns it
(``scheduler.job_events``)."""

from __future__ import annotations

import functools
import logging
import uuid

import pytest

from registry.protocol import Event, EventKind, SessionState
from scheduler import JobConfig, Scheduler, ShardingContext
from scheduler.job_events import JobEvents
from scheduler.runner import JobRunner
from tests.waiting import wait_for


class _Recorder:
    """A follower that keeps what it was handed."""

    def __init__(self, name: str, *, fails: bool = False) -> None:
        self._name = name
        self._fails = fails
        self.events: list[Event] = []
        self.states: list[SessionState] = []

    @property
    def name(self) -> str:
        return self._name

    def on_event(self, event: Event) -> None:
        self.events.append(event)

    def on_session(self, state: SessionState) -> None:
        self.states.append(state)
        if self._fails:
            raise RuntimeError(f"{self._name} failed on purpose")


def _changed(path: str) -> Event:
    return Event(EventKind.UPDATED, path, b"v", 2)


def test_a_change_reaches_the_job_it_lies_under_only() -> None:
    events = JobEvents()
    job, longer = _Recorder("job"), _Recorder("job-2")
    events.follow(job)
    events.follow(longer)
    for path in ("/job", "/job/config", "/job/leader/election/instance", "/job-2/config", "/other/config"):
        events.on_event(_changed(path))
    events.on_event(Event(EventKind.DELETED, "/job/instances/i-1", None))
    assert [e.path for e in job.events] == [
        "/job",
        "/job/config",
        "/job/leader/election/instance",
        "/job/instances/i-1",
    ]
    assert [e.path for e in longer.events] == ["/job-2/config"]


def test_a_follower_replaced_under_its_name_leaves_its_successor_following() -> None:
    events = JobEvents()
    first, second = _Recorder("job"), _Recorder("job")
    events.follow(first)
    events.follow(second)
    events.unfollow(first)  # the replaced one leaving late must not drop the new one
    events.on_event(_changed("/job/config"))
    events.on_session(SessionState.SUSPENDED)
    assert (first.events, first.states) == ([], [])
    assert [e.path for e in second.events] == ["/job/config"]
    assert second.states == [SessionState.SUSPENDED]
    events.unfollow(second)
    events.on_event(_changed("/job/config"))
    assert len(second.events) == 1


def test_a_session_change_reaches_every_job_though_one_raises(caplog: pytest.LogCaptureFixture) -> None:
    events = JobEvents()
    followers = [_Recorder("a"), _Recorder("b", fails=True), _Recorder("c")]
    for follower in followers:
        events.follow(follower)
    with caplog.at_level(logging.ERROR, logger="scheduler"):
        events.on_session(SessionState.LOST)
    assert [f.states for f in followers] == [[SessionState.LOST]] * 3
    assert "job b: handling session lost raised" in caplog.text


def _noop(ctx: ShardingContext) -> None:
    pass


def _adopted(runner: JobRunner, description: str) -> bool:
    return runner.config.description == description


def test_a_removed_job_is_followed_no_more_and_the_others_still_are() -> None:
    sched = Scheduler(f"memory://job-events-{uuid.uuid4().hex}")
    for name in ("job", "job-2"):
        sched.add_job(JobConfig(name=name, cron="0 0 0 1 1 ?"), _noop)
    try:
        sched.start()
        runtime = sched.runtime
        assert runtime is not None
        removed, kept = sched._runners["job"], sched._runners["job-2"]
        assert set(runtime.job_events._followers) == {"job", "job-2"}
        sched.remove_job("job")
        assert set(runtime.job_events._followers) == {"job-2"}
        for runner in (removed, kept):
            stored = JobConfig(name=runner.name, cron="0 0 0 1 1 ?", description="changed")
            sched.registry.put(runner.paths.config, stored.to_json())
        wait_for(functools.partial(_adopted, kept, "changed"), 10, message="job-2 adopts its stored config")
        assert sched.registry.flush_events()
        stored_config = runtime.cache.get(removed.paths.config)
        assert stored_config is not None and b'"changed"' in stored_config  # the cache has it
        assert removed.config.description != "changed"  # the removed job was not told
    finally:
        sched.shutdown()
    assert runtime.job_events._followers == {}

