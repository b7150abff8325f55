"""Contract: a watch delivers every change at or below its path, in order per node, and
survives server restarts and session expiry (the missed changes arrive as events)."""

from __future__ import annotations

import logging
import random
import threading

import pytest

from registry.backends.base import BaseRegistry
from registry.protocol import Event, EventKind
from tests.harness import Harness

from . import PROMPT, EventLog, peer, session_timeout, wait_for, wait_marker

CREATED, UPDATED, DELETED = EventKind.CREATED, EventKind.UPDATED, EventKind.DELETED

#: Bound for a client to come back after a server restart or a new session.
RECOVERY = 25.0


def test_created_updated_deleted_with_values(harness: Harness, reg: BaseRegistry) -> None:
    writer = peer(harness, reg)
    log = EventLog()
    reg.watch("/w", log)
    writer.create("/w/a", b"1")
    created = log.wait(CREATED, "/w/a", b"1")
    node = writer.get_node("/w/a")
    assert node is not None and created.version == node.version
    writer.put("/w/a", b"2")
    updated = log.wait(UPDATED, "/w/a", b"2")
    node = writer.get_node("/w/a")
    assert node is not None and updated.version == node.version
    writer.delete("/w/a")
    deleted = log.wait(DELETED, "/w/a")
    assert deleted.value is None
    assert [(e.kind, e.value) for e in log.of("/w/a")] == [(CREATED, b"1"), (UPDATED, b"2"), (DELETED, None)]
    assert all(isinstance(e, Event) for e in log.events)


def test_changes_by_the_watching_client_are_delivered(reg: BaseRegistry) -> None:
    log = EventLog()
    reg.watch("/w", log)
    reg.put("/w/own", b"1")
    log.wait(CREATED, "/w/own", b"1")
    reg.delete("/w/own")
    log.wait(DELETED, "/w/own")


def test_order_per_node(harness: Harness, reg: BaseRegistry) -> None:
    writer = peer(harness, reg)
    log = EventLog()
    reg.watch("/w", log)
    count = 30
    for i in range(count):
        writer.put("/w/n", str(i).encode())
        writer.put("/w/m", str(i).encode())
    for path in ("/w/n", "/w/m"):
        log.wait(UPDATED, path, str(count - 1).encode(), timeout=PROMPT)
        events = log.of(path)
        # a burst may be coalesced into its latest state, but never reordered or repeated
        assert events[0].kind is CREATED
        assert all(e.kind is UPDATED for e in events[1:])
        numbers = [int(e.value or b"-1") for e in events]
        assert numbers == sorted(set(numbers)), numbers
        assert numbers[-1] == count - 1


def test_watched_node_itself(harness: Harness, reg: BaseRegistry) -> None:
    writer = peer(harness, reg)
    log = EventLog()
    reg.watch("/w", log)
    writer.create("/w", b"1")
    log.wait(CREATED, "/w", b"1")
    writer.put("/w", b"2")
    log.wait(UPDATED, "/w", b"2")
    writer.delete("/w")
    log.wait(DELETED, "/w")
    writer.create("/w", b"3")
    log.wait(CREATED, "/w", b"3")
    assert [(e.kind, e.value) for e in log.of("/w")] == [
        (CREATED, b"1"),
        (UPDATED, b"2"),
        (DELETED, None),
        (CREATED, b"3"),
    ]


def test_depth(harness: Harness, reg: BaseRegistry) -> None:
    writer = peer(harness, reg)
    log = EventLog()
    reg.watch("/w", log)
    writer.put("/w/a/b/c", b"deep")
    log.wait(CREATED, "/w/a/b/c", b"deep")
    log.wait(CREATED, "/w/a/b", b"")
    log.wait(CREATED, "/w/a", b"")
    writer.put("/w/a/b/c", b"deeper")
    log.wait(UPDATED, "/w/a/b/c", b"deeper")
    writer.put("/w/a/b/c/d/e", b"e")
    log.wait(CREATED, "/w/a/b/c/d/e", b"e")
    writer.delete("/w/a")
    for path in ("/w/a/b/c/d/e", "/w/a/b/c/d", "/w/a/b/c", "/w/a/b", "/w/a"):
        log.wait(DELETED, path)
    assert not log.has(DELETED, "/w")


def test_nothing_from_outside_the_path(harness: Harness, reg: BaseRegistry) -> None:
    writer = peer(harness, reg)
    writer.put("/w/a", b"")
    log = EventLog()
    reg.watch("/w/a", log)
    for path in ("/w", "/w/b", "/w/ab", "/w/a-x", "/w/b/a", "/x/w/a", "/wa"):
        writer.put(path, b"outside")
    writer.delete("/w/b")
    wait_marker(reg, log, writer, "/w/a/marker")
    assert log.paths() == ["/w/a/marker"], log.events


def test_watch_on_root_sees_everything(harness: Harness, reg: BaseRegistry) -> None:
    writer = peer(harness, reg)
    log = EventLog()
    reg.watch("/", log)
    writer.put("/x", b"1")
    writer.put("/y/z", b"2")
    log.wait(CREATED, "/x", b"1")
    log.wait(CREATED, "/y/z", b"2")


def test_initial_replays_present_nodes_parents_first(harness: Harness, reg: BaseRegistry) -> None:
    for path, value in (("/w/c", b"c"), ("/w/a/b", b"ab"), ("/w/a", b"a"), ("/w/a/b/d", b"abd")):
        reg.put(path, value)
    reg.put("/outside", b"o")
    log = EventLog()
    reg.watch("/w", log, initial=True)
    assert reg.flush_events(PROMPT)
    events = log.wait_count(5)
    assert {(e.kind, e.path, e.value) for e in events} == {
        (CREATED, "/w", b""),
        (CREATED, "/w/a", b"a"),
        (CREATED, "/w/a/b", b"ab"),
        (CREATED, "/w/a/b/d", b"abd"),
        (CREATED, "/w/c", b"c"),
    }
    paths = log.paths()
    assert len(paths) == 5, events
    for child in paths:
        for parent in paths:
            if child.startswith(parent + "/"):
                assert paths.index(parent) < paths.index(child), paths
    # and then the changes as usual, with no repeat of the replayed state
    peer(harness, reg).put("/w/c", b"c2")
    log.wait(UPDATED, "/w/c", b"c2")
    assert len(log.of("/w/c")) == 2


def test_without_initial_present_nodes_are_not_replayed(harness: Harness, reg: BaseRegistry) -> None:
    reg.put("/w/old", b"o")
    log = EventLog()
    reg.watch("/w", log)
    wait_marker(reg, log, peer(harness, reg), "/w/new")
    assert log.paths() == ["/w/new"], log.events


def test_initial_on_absent_path_replays_nothing(reg: BaseRegistry) -> None:
    log = EventLog()
    reg.watch("/nothing", log, initial=True)
    wait_marker(reg, log, reg, "/nothing/marker")
    assert log.has(CREATED, "/nothing/marker")
    assert set(log.paths()) <= {"/nothing", "/nothing/marker"}


def test_cancel_stops_delivery(harness: Harness, reg: BaseRegistry) -> None:
    writer = peer(harness, reg)
    cancelled_log, live_log = EventLog(), EventLog()
    watch = reg.watch("/w", cancelled_log)
    reg.watch("/w", live_log)
    writer.put("/w/a", b"1")
    cancelled_log.wait(CREATED, "/w/a")
    live_log.wait(CREATED, "/w/a")
    assert watch.active
    watch.cancel()
    assert not watch.active
    watch.cancel()  # idempotent
    writer.put("/w/a", b"2")
    writer.put("/w/b", b"3")
    wait_marker(reg, live_log, writer, "/w/marker")
    late = [e for e in cancelled_log.events if e.value != b"1" and e.path != "/w"]
    assert late == [], f"events after cancel(): {late}"


def test_cancel_from_inside_the_callback(harness: Harness, reg: BaseRegistry) -> None:
    writer = peer(harness, reg)
    seen: list[Event] = []
    live = EventLog()

    def once(event: Event) -> None:
        seen.append(event)
        watch.cancel()

    watch = reg.watch("/w/a", once)
    reg.watch("/w", live)
    writer.put("/w/a", b"1")
    live.wait(CREATED, "/w/a")
    writer.put("/w/a", b"2")
    wait_marker(reg, live, writer, "/w/marker")
    assert [e.value for e in seen] == [b"1"]
    assert not watch.active


def test_raising_callback_keeps_the_watch(
    harness: Harness, reg: BaseRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    writer = peer(harness, reg)
    seen: list[Event] = []

    def flaky(event: Event) -> None:
        seen.append(event)
        raise RuntimeError("callback failure on purpose")

    watch = reg.watch("/w/x", flaky)
    writer.put("/w/x", b"1")
    wait_for(lambda: len(seen) >= 1, PROMPT, message="first event not delivered")
    writer.put("/w/x", b"2")
    wait_for(lambda: any(e.value == b"2" for e in seen), PROMPT, message=lambda: f"got only {seen}")
    assert watch.active
    assert any(
        r.levelno >= logging.ERROR and r.exc_info and "callback failure on purpose" in str(r.exc_info[1])
        for r in caplog.records
    ), "the raising callback was not logged"


def test_watches_add_no_threads(harness: Harness, reg: BaseRegistry) -> None:
    writer = peer(harness, reg)
    first = EventLog()
    reg.watch("/w", first)
    writer.put("/w/0", b"")
    first.wait(CREATED, "/w/0")
    baseline = threading.active_count()
    logs = [EventLog() for _ in range(20)]
    for i, log in enumerate(logs):
        reg.watch(f"/w/{i}", log)
    writer.put("/w/0/x", b"")
    logs[0].wait(CREATED, "/w/0/x")
    assert threading.active_count() <= baseline, "watches started threads of their own"


def test_watch_registered_before_the_node_exists(harness: Harness, reg: BaseRegistry) -> None:
    writer = peer(harness, reg)
    log = EventLog()
    reg.watch("/later/deep", log)
    writer.put("/later/deep/x", b"x")
    log.wait(CREATED, "/later/deep", b"")
    log.wait(CREATED, "/later/deep/x", b"x")
    assert not any(e.path == "/later" for e in log.events)
    writer.delete("/later")
    log.wait(DELETED, "/later/deep/x")
    log.wait(DELETED, "/later/deep")
    # the watch outlives the deletion of its own path
    writer.put("/later/deep", b"again")
    log.wait(CREATED, "/later/deep", b"again")


def test_two_clients_watching_the_same_path(harness: Harness, reg: BaseRegistry) -> None:
    other = peer(harness, reg)
    mine, theirs = EventLog(), EventLog()
    reg.watch("/w", mine)
    other.watch("/w", theirs)
    reg.put("/w/a", b"1")
    mine.wait(CREATED, "/w/a", b"1")
    theirs.wait(CREATED, "/w/a", b"1")


def test_changes_while_server_restarts_are_delivered(harness: Harness) -> None:
    reg = harness.connect(session_timeout=10)
    reg.put("/w/updated", b"before")
    reg.put("/w/deleted", b"before")
    log = EventLog()
    reg.watch("/w", log)
    harness.restart_server(downtime=1.0)
    writer = peer(harness, reg)  # connected after the restart, maybe before ``reg`` is back
    writer.put("/w/created", b"after")
    writer.put("/w/updated", b"after")
    writer.delete("/w/deleted")
    log.wait(CREATED, "/w/created", b"after", timeout=RECOVERY)
    log.wait(UPDATED, "/w/updated", b"after", timeout=RECOVERY)
    log.wait(DELETED, "/w/deleted", timeout=RECOVERY)
    # and the watch goes on as before
    writer.put("/w/later", b"x")
    log.wait(CREATED, "/w/later", b"x")


def test_changes_missed_during_session_expiry_are_delivered(harness: Harness) -> None:
    reg = harness.connect(session_timeout=session_timeout(harness))
    reg.put("/w/updated", b"before")
    reg.put("/w/deleted", b"before")
    log = EventLog()
    reg.watch("/w", log)
    harness.expire_session(reg)
    writer = peer(harness, reg)
    writer.put("/w/created", b"after")
    writer.put("/w/updated", b"after")
    writer.delete("/w/deleted")
    log.wait(CREATED, "/w/created", b"after", timeout=RECOVERY)
    log.wait(UPDATED, "/w/updated", b"after", timeout=RECOVERY)
    log.wait(DELETED, "/w/deleted", timeout=RECOVERY)
    writer.put("/w/later", b"x")
    log.wait(CREATED, "/w/later", b"x")
    # each change exactly once
    assert len(log.of("/w/created")) == 1
    assert len([e for e in log.of("/w/deleted") if e.kind is DELETED]) == 1


def _under_hot(path: str) -> bool:
    return path.endswith("/hot")


def test_exclude_leaves_out_the_subtree_initially_and_after(harness: Harness, reg: BaseRegistry) -> None:
    writer = peer(harness, reg)
    writer.put("/w/hot/old", b"1")
    writer.put("/w/kept", b"1")
    log = EventLog()
    reg.watch("/w", log, initial=True, exclude=_under_hot)
    log.wait(CREATED, "/w/kept", b"1")
    writer.put("/w/hot/new", b"2")
    writer.put("/w/hot/old", b"3")
    writer.put("/w/hot/deep/er", b"4")
    writer.delete("/w/hot/old")
    writer.put("/w/a/hot", b"5")  # another node of that name: excluded too, it is a predicate on paths
    writer.put("/w/hotter", b"6")  # only a prefix of the name: included
    wait_marker(reg, log, writer, "/w/marker")
    assert not [p for p in log.paths() if "/hot/" in p or p.endswith("/hot")], log.events
    assert log.has(CREATED, "/w/hotter", b"6")


def test_exclude_holds_for_a_subtree_created_after_the_watch(harness: Harness, reg: BaseRegistry) -> None:
    writer = peer(harness, reg)
    log = EventLog()
    reg.watch("/w", log, exclude=_under_hot)
    writer.put("/w/x/hot/a", b"1")
    writer.put("/w/x/hot/a", b"2")
    writer.delete("/w/x/hot")
    writer.put("/w/x/hot/b", b"3")
    wait_marker(reg, log, writer, "/w/marker")
    assert sorted({e.path for e in log.events} - {"/w/marker"}) == ["/w", "/w/x"], log.events


def test_exclude_holds_across_a_session_expiry(harness: Harness) -> None:
    reg = harness.connect(session_timeout=session_timeout(harness))
    log = EventLog()
    reg.watch("/w", log, initial=True, exclude=_under_hot)
    reg.put("/w/before", b"1")
    log.wait(CREATED, "/w/before", b"1")
    harness.expire_session(reg)
    writer = peer(harness, reg)
    writer.put("/w/hot/missed", b"2")
    writer.put("/w/missed", b"2")
    log.wait(CREATED, "/w/missed", b"2", timeout=RECOVERY)
    writer.put("/w/hot/later", b"3")
    wait_marker(reg, log, writer, "/w/marker")
    assert not [p for p in log.paths() if "/hot" in p], log.events


def _is_leaf(path: str) -> bool:
    return path.endswith("/leaf")


def test_leaves_are_reported_and_nothing_below_them(harness: Harness, reg: BaseRegistry) -> None:
    writer = peer(harness, reg)
    writer.put("/w/leaf", b"1")
    writer.put("/w/leaf/old", b"1")  # against the caller's word: left out all the same
    writer.put("/w/inner/x", b"1")
    log = EventLog()
    reg.watch("/w", log, initial=True, leaves=_is_leaf)
    log.wait(CREATED, "/w/inner/x", b"1")
    assert log.has(CREATED, "/w/leaf", b"1")
    writer.put("/w/leaf", b"2")
    log.wait(UPDATED, "/w/leaf", b"2")
    writer.put("/w/leaf/new", b"3")
    writer.put("/w/leaf/deep/er", b"4")
    writer.put("/w/inner/leaf", b"5")  # a leaf deeper down: reported, its children not
    writer.put("/w/inner/leaf/below", b"6")
    writer.put("/w/inner/y", b"7")
    writer.delete("/w/leaf")
    log.wait(DELETED, "/w/leaf")
    writer.put("/w/leaf", b"8")  # created again: reported again
    log.wait(CREATED, "/w/leaf", b"8")
    wait_marker(reg, log, writer, "/w/marker")
    assert log.has(CREATED, "/w/inner/leaf", b"5") and log.has(CREATED, "/w/inner/y", b"7")
    assert not [p for p in log.paths() if "/leaf/" in p], log.events


def test_leaves_and_exclude_together(harness: Harness, reg: BaseRegistry) -> None:
    writer = peer(harness, reg)
    log = EventLog()
    reg.watch("/w", log, exclude=_under_hot, leaves=_is_leaf)
    writer.put("/w/hot/leaf", b"1")  # excluded, though a leaf
    writer.put("/w/leaf/hot", b"2")  # below a leaf
    writer.put("/w/x/leaf", b"3")
    wait_marker(reg, log, writer, "/w/marker")
    assert sorted({e.path for e in log.events} - {"/w/marker"}) == ["/w", "/w/leaf", "/w/x", "/w/x/leaf"]


def test_leaves_must_be_a_predicate(reg: BaseRegistry) -> None:
    with pytest.raises(ValueError, match="leaves"):
        reg.watch("/w", EventLog(), leaves="/w/leaf")  # type: ignore[arg-type]


def test_exclude_must_be_a_predicate(reg: BaseRegistry) -> None:
    with pytest.raises(ValueError, match="exclude"):
        reg.watch("/w", EventLog(), exclude="/w/hot")  # type: ignore[arg-type]


@pytest.mark.parametrize("option", ["exclude", "leaves"])
def test_a_raising_predicate_includes_the_node_and_keeps_the_watch(
    harness: Harness, reg: BaseRegistry, caplog: pytest.LogCaptureFixture, option: str
) -> None:
    """A predicate that raises answers False: ``exclude`` includes the node, ``leaves``
    follows its children; the watch lives and the log names the predicate."""
    writer = peer(harness, reg)
    normal = _under_hot if option == "exclude" else _is_leaf

    def broken(path: str) -> bool:
        if path.endswith("/boom"):
            raise RuntimeError("predicate bug")
        return normal(path)

    log = EventLog()
    with caplog.at_level(logging.ERROR, logger="registry"):
        if option == "exclude":
            reg.watch("/w", log, exclude=broken)
        else:
            reg.watch("/w", log, leaves=broken)
        writer.put("/w/boom", b"1")
        writer.put("/w/boom/child", b"2")
        writer.put("/w/hot", b"2")
        writer.put("/w/leaf/child", b"3")
        log.wait(CREATED, "/w/boom", b"1")
        log.wait(CREATED, "/w/boom/child", b"2")
        wait_marker(reg, log, writer, "/w/marker")
    if option == "exclude":
        assert not log.has(CREATED, "/w/hot")
    else:
        assert log.has(CREATED, "/w/leaf") and not log.has(CREATED, "/w/leaf/child")
    assert any(f"{option} predicate raised" in r.getMessage() for r in caplog.records)


def test_the_view_built_from_events_ends_equal_to_the_tree_after_churn(
    harness: Harness, reg: BaseRegistry
) -> None:
    """Two writers create, overwrite, delete and re-create nodes and whole subtrees as
    fast as they can while the watch follows: replaying its events gives exactly the
    tree, values and versions, and within one life of a node (CREATED to DELETED) the
    versions it reports only go up."""
    log = EventLog()
    reg.watch("/w", log)
    writers = [peer(harness, reg), peer(harness, reg)]

    def churn(writer: BaseRegistry, seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(150):
            parent = f"/w/p{rng.randrange(6)}"
            roll = rng.random()
            if roll < 0.1:
                writer.delete(parent)
            elif roll < 0.25:
                writer.delete(f"{parent}/c{rng.randrange(4)}")
            else:
                writer.put(f"{parent}/c{rng.randrange(4)}", str(rng.random()).encode())

    threads = [threading.Thread(target=churn, args=(w, i)) for i, w in enumerate(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected = {path: (node.value, node.version) for path, node in writers[0].read_tree("/w").items()}

    def replayed() -> dict[str, tuple[bytes | None, int | None]]:
        view: dict[str, tuple[bytes | None, int | None]] = {}
        for event in log.events:
            if event.kind is DELETED:
                view.pop(event.path, None)
            else:
                view[event.path] = (event.value, event.version)
        return view

    wait_for(
        lambda: replayed() == expected,
        PROMPT,
        message=lambda: f"events replayed: {sorted(replayed().items())}; tree: {sorted(expected.items())}",
    )
    for path in {e.path for e in log.events}:
        life: list[int] = []
        for event in log.of(path):
            if event.kind is CREATED:
                life = [] if event.version is None else [event.version]
            elif event.kind is UPDATED and event.version is not None:
                assert not life or event.version > life[-1], (path, [(e.kind, e.version) for e in log.of(path)])
                life.append(event.version)
