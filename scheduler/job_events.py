"""Every job's changes and the session's, heard once per process and handed to each job.

A scheduler's jobs share one cache and one session. Each job followed them with listeners
of its own (its runner's cache listener, its sharding service's cache and session
listeners): a bound method each and an entry in the cache's and the registry's listener
tables, about 260 bytes a job, and a registry's list of session listeners that every
job's shutdown scanned. ``JobEvents`` is the one cache listener and the one session
listener of a process; it keeps each job's runner by name and hands it what concerns it.

Invariants: a job's runner gets every change under its job's root (``/{job}/...``, the
first segment of the path is the job's name) and every session change for as long as it
follows, in the order the cache and the registry deliver them, on their threads; the
table is read without the lock (one dict lookup, atomic), so a change delivered while a
runner is added or dropped reaches it or not, as a listener added or removed then would;
a session change reaches every other runner even when one's handling raises, as each
listener of the registry's is called on its own.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from registry.protocol import Event, SessionState

__all__ = ["JobEvents", "JobFollower"]

log = logging.getLogger("scheduler")


class JobFollower(Protocol):
    """What a job hands its changes to (``JobRunner``)."""

    @property
    def name(self) -> str: ...

    def on_event(self, event: Event) -> None: ...

    def on_session(self, state: SessionState) -> None: ...


class JobEvents:
    """The cache listener (``on_event``) and the session listener (``on_session``) of
    every job of a process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._followers: dict[str, JobFollower] = {}

    def follow(self, follower: JobFollower) -> None:
        """Hand ``follower`` its job's changes from now on."""
        with self._lock:
            self._followers[follower.name] = follower

    def unfollow(self, follower: JobFollower) -> None:
        """No more changes for ``follower``; a job of the same name that replaced it keeps
        following."""
        with self._lock:
            if self._followers.get(follower.name) is follower:
                del self._followers[follower.name]

    def on_event(self, event: Event) -> None:
        name = event.path[1:].partition("/")[0]
        follower = self._followers.get(name)
        if follower is not None:
            follower.on_event(event)

    def on_session(self, state: SessionState) -> None:
        with self._lock:
            followers = list(self._followers.values())
        for follower in followers:
            try:
                follower.on_session(state)
            except Exception:  # one job's fault must not keep the news from the others
                log.exception("job %s: handling session %s raised", follower.name, state.value)
