"""etcd streams every change in a watched key range: a watch's excluded subtrees must be
cut out of the ranges it asks the server for, or every running mark written would still
reach every watching client (the cost ``exclude`` exists to remove). Read from the watch
supervisor's count of the events the server sent — the only place this shows."""

from __future__ import annotations

import uuid
from typing import Any

import registry
from registry.backends.etcd import EtcdRegistry
from registry.backends.etcd_watch import _Delivery
from registry.protocol import Create, EventKind
from tests.contract import EventLog, wait_marker
from tests.waiting import wait_for


def _received(reg: EtcdRegistry) -> int:
    return reg._supervisor.events_received


def _watchers(reg: EtcdRegistry) -> int:
    """Watchers subscribed at the server (pieces of ranges waiting to subscribe aside)."""
    return sum(1 for sub in reg._supervisor._subs if sub.watch_id is not None and sub.retry_at is None)


def test_an_excluded_subtree_is_not_sent_by_the_server(etcd_server: Any) -> None:
    namespace = "/excl" + uuid.uuid4().hex[:10]
    reg = registry.connect(f"etcd://{etcd_server.address}{namespace}")
    writer = registry.connect(f"etcd://{etcd_server.address}{namespace}")
    try:
        assert isinstance(reg, EtcdRegistry)
        writer.put("/a/running/old", b"0")  # in the snapshot: cut out from the start
        log = EventLog()
        reg.watch("/", log, initial=True, exclude=lambda p: p.endswith("/running"))
        # a subtree first seen in an event: cut out once that event arrives
        writer.put("/b/running/x", b"1")
        wait_marker(reg, log, writer, "/b/marker")
        wait_for(lambda: _watchers(reg) == 3, 10, message="the watch split into 3 ranges")
        # a range per job at 10,000 jobs: each is a slotted subscription, and its stream
        # callback a slotted object, not a closure
        for sub in reg._supervisor._subs:
            assert not hasattr(sub, "__dict__")
            assert sub.stream is not None and sub.watch_id is not None
            assert type(sub.stream._callbacks[sub.watch_id]) is _Delivery
        before = _received(reg)
        for n in range(20):
            writer.put(f"/a/running/m{n}", b"m")
            writer.put(f"/b/running/m{n}", b"m")
        wait_marker(reg, log, writer, "/b/marker2")
        assert _received(reg) - before == 1, "the server still sends the excluded subtrees"
        assert not [e for e in log.events if "/running" in e.path], log.events
    finally:
        writer.close()
        reg.close()


def test_nothing_is_lost_or_repeated_while_a_range_is_split(etcd_server: Any) -> None:
    """The change that reveals a hole shares its revision with covered changes, and more
    follow at once: each covered node's events arrive exactly once, in order."""
    namespace = "/excl" + uuid.uuid4().hex[:10]
    reg = registry.connect(f"etcd://{etcd_server.address}{namespace}")
    writer = registry.connect(f"etcd://{etcd_server.address}{namespace}")
    try:
        log = EventLog()
        reg.watch("/", log, exclude=lambda p: p.endswith("/running"))
        writer.transaction([Create("/j/running/x", b"r"), Create("/j/a", b"0"), Create("/k/z", b"0")])
        for n in range(1, 30):
            writer.put("/j/a", str(n).encode())
            writer.put("/k/z", str(n).encode())
            writer.put(f"/j/running/m{n}", b"m")
        wait_marker(reg, log, writer, "/j/zz-marker")
        for path in ("/j/a", "/k/z"):
            values = [e.value for e in log.events if e.path == path]
            assert values == [str(n).encode() for n in range(30)], (path, values)
            kinds = [e.kind for e in log.events if e.path == path]
            assert kinds[0] is EventKind.CREATED and set(kinds[1:]) == {EventKind.UPDATED}
        assert not [e for e in log.events if "/running" in e.path]
    finally:
        writer.close()
        reg.close()


def test_hundreds_of_excluded_subtrees_are_all_cut_at_the_server(etcd_server: Any) -> None:
    """A scheduler's cache excludes every job's running marks: past a few hundred jobs
    each must still be cut out (a cap of 256 once let the rest stream back)."""
    namespace = "/excl" + uuid.uuid4().hex[:10]
    reg = registry.connect(f"etcd://{etcd_server.address}{namespace}")
    writer = registry.connect(f"etcd://{etcd_server.address}{namespace}")
    jobs = [f"/job-{n:03d}" for n in range(300)]
    try:
        assert isinstance(reg, EtcdRegistry)
        for start in range(0, len(jobs), 40):  # every subtree in the snapshot: cut from the start
            writer.transaction([Create(f"{job}/running/old", b"0") for job in jobs[start : start + 40]])
        log = EventLog()
        reg.watch("/", log, initial=True, exclude=lambda p: p.endswith("/running"))
        wait_for(lambda: _watchers(reg) == len(jobs) + 1, 30, message="one range between each two holes")
        before = _received(reg)
        for start in range(0, len(jobs), 40):
            writer.transaction([Create(f"{job}/running/new", b"m") for job in jobs[start : start + 40]])
        wait_marker(reg, log, writer, "/zz-marker")
        assert _received(reg) - before == 1, "the server still sends excluded subtrees"
    finally:
        writer.close()
        reg.close()
