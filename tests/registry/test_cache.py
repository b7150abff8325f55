"""TreeCache (registry/recipes/cache.py): waits on it end when what they wait for shows up,
and at once when the cache is closed — a closed cache never changes again, so a waiter that
went on waiting would hold its owner's shutdown up for its whole timeout."""

from __future__ import annotations

import functools
import sys
import threading
import time
import zlib

import pytest

from registry.backends.base import BaseRegistry
from registry.protocol import Create, Event, EventKind, Node, Set
from registry.recipes.cache import TreeCache
from tests.waiting import blocked_in, wait_for

#: far longer than any wait below may take: a waiter still waiting after PROMPT is stuck
LONG = 60.0
PROMPT = 10.0


class _Waiter:
    """``cache.wait_until(predicate, LONG)`` on a thread of its own, its answer kept."""

    def __init__(self, cache: TreeCache, path: str, under: str | None = None) -> None:
        self.answer: bool | None = None
        self.took = 0.0
        self.checks = 0
        self.thread = threading.Thread(target=self._wait, args=(cache, path, under), daemon=True)
        self.thread.start()

    def _wait(self, cache: TreeCache, path: str, under: str | None) -> None:
        started = time.monotonic()

        def present() -> bool:
            self.checks += 1
            return cache.exists(path)

        self.answer = cache.wait_until(present, LONG, under=under)
        self.took = time.monotonic() - started

    def finished(self) -> bool:
        self.thread.join(PROMPT)
        return not self.thread.is_alive()


def test_wait_until_ends_when_the_change_arrives(reg: BaseRegistry) -> None:
    cache = TreeCache(reg, "/c").start()
    try:
        waiter = _Waiter(cache, "/c/later")
        reg.put("/c/later", b"1")
        assert waiter.finished(), "the waiter did not see the node appear"
        assert waiter.answer is True
    finally:
        cache.close()


def test_close_wakes_waiters_at_once(reg: BaseRegistry) -> None:
    cache = TreeCache(reg, "/c").start()
    waiter = _Waiter(cache, "/c/never")
    # the waiter is inside its wait when the cache closes (a wait begun after the close is
    # test_a_closed_cache_answers_waits_at_once)
    wait_for(
        lambda: blocked_in(waiter.thread, "wait_until"), PROMPT, message="the waiter never began to wait"
    )
    cache.close()
    assert waiter.finished(), f"a waiter on a closed cache still waits (its timeout is {LONG:g}s)"
    assert waiter.answer is False


def test_a_closed_cache_answers_waits_at_once(reg: BaseRegistry) -> None:
    cache = TreeCache(reg, "/c").start()
    cache.close()
    started = time.monotonic()
    assert cache.wait_until(lambda: cache.exists("/c/never"), LONG) is False
    assert time.monotonic() - started < PROMPT


def test_a_wait_under_a_subtree_ends_with_a_change_there_and_ignores_the_others(reg: BaseRegistry) -> None:
    cache = TreeCache(reg, "/c").start()
    try:
        waiter = _Waiter(cache, "/c/mine/later", under="/c/mine")
        wait_for(lambda: blocked_in(waiter.thread, "wait_until"), PROMPT, message="the waiter never began to wait")
        checks = waiter.checks
        for i in range(30):
            reg.put(f"/c/other/n{i}", b"x")  # changes elsewhere: they must not wake it
        reg.put("/c/mine/marker", b"m")  # proves the changes before it were applied
        wait_for(lambda: cache.exists("/c/mine/marker"), PROMPT)
        assert waiter.checks - checks <= 2, f"woken {waiter.checks - checks} times by changes it does not follow"
        reg.put("/c/mine/later", b"1")
        assert waiter.finished(), "the waiter did not see the node appear"
        assert waiter.answer is True
    finally:
        cache.close()


def test_a_change_wakes_the_whole_cache_waiters_left_after_another_one_ended(reg: BaseRegistry) -> None:
    # a change notifies the whole cache's waiters only while there are some: the count of
    # them must go down by exactly the waiter that ended, not to zero
    cache = TreeCache(reg, "/c").start()
    try:
        first, second = _Waiter(cache, "/c/first"), _Waiter(cache, "/c/second")
        wait_for(
            lambda: blocked_in(first.thread, "wait_until") and blocked_in(second.thread, "wait_until"),
            PROMPT,
            message="the waiters never both began to wait",
        )
        reg.put("/c/first", b"1")
        assert first.finished() and first.answer is True
        reg.put("/c/second", b"1")
        assert second.finished(), "the waiter left waiting was not woken by its change"
        assert second.answer is True
    finally:
        cache.close()


def test_close_wakes_a_wait_under_a_subtree(reg: BaseRegistry) -> None:
    cache = TreeCache(reg, "/c").start()
    waiter = _Waiter(cache, "/c/mine/never", under="/c/mine")
    wait_for(lambda: blocked_in(waiter.thread, "wait_until"), PROMPT, message="the waiter never began to wait")
    cache.close()
    assert waiter.finished(), "a waiter under a subtree of a closed cache still waits"
    assert waiter.answer is False


def test_a_wait_may_read_the_cache_in_its_predicate(reg: BaseRegistry) -> None:
    # the predicate runs under the cache's lock; reading children (which takes that lock
    # too) must not deadlock the waiter or the cache's event thread
    cache = TreeCache(reg, "/c").start()
    try:
        answers: list[bool] = []
        thread = threading.Thread(
            target=lambda: answers.append(cache.wait_until(lambda: cache.children("/c") == ["n"], LONG)),
            daemon=True,
        )
        thread.start()
        wait_for(lambda: blocked_in(thread, "wait_until"), PROMPT, message="the waiter never began to wait")
        reg.put("/c/n", b"1")
        thread.join(PROMPT)
        assert answers == [True], "the waiter did not see the child appear (deadlocked on the cache's lock?)"
        assert cache.exists("/c/n")
    finally:
        if not thread.is_alive():  # a deadlocked waiter holds the lock close() needs
            cache.close()


def test_a_cache_with_leaves_holds_them_and_refuses_reads_below(reg: BaseRegistry) -> None:
    reg.put("/c/job/config", b"1")
    reg.put("/c/job/config/stray", b"2")  # a child the caller said would not be there
    cache = TreeCache(reg, "/c", leaves=lambda p: p.endswith("/config")).start()
    try:
        node = cache.get_node("/c/job/config")
        assert node is not None and node.value == b"1"
        assert cache.children("/c/job/config") == []
        with pytest.raises(ValueError, match="leaf"):
            cache.get_node("/c/job/config/stray")
        reg.put("/c/job/config", b"3")
        assert cache.wait_until(lambda: (n := cache.get_node("/c/job/config")) is not None and n.value == b"3", PROMPT)
    finally:
        cache.close()


def test_each_cached_path_is_held_once_by_the_cache_and_the_watch(reg: BaseRegistry) -> None:
    """The cache's node, its parent's child entry and the watch's reported version are
    keyed by the one shared ``str`` of the path (``registry.paths.shared``), for nodes
    loaded at the start and for nodes that arrive as events: a dozen paths per job are
    otherwise stored once per map. Under a namespace the watch keys them by the caller's
    path too, not by the stored one (a second string per node)."""
    for i in range(2):
        reg.put(f"/s/n{i}", b"v")
    cache = TreeCache(reg, "/s").start()
    try:
        reg.put("/s/n2", b"v")  # arrives as an event
        wait_for(lambda: cache.exists("/s/n2"), PROMPT)
        (registration,) = [r for r in reg._watches if r.root == reg._ns.to_server("/s")]
        for i in range(3):
            path = "".join(["/s/n", str(i)])  # equal, but a str of its own
            key = next(k for k in cache._nodes if k == path)
            assert key is sys.intern(path), path
            assert next(c for c in cache._kids.of("/s") if c == path) is key
            assert next(k for k in registration.versions if k == path) is key
        assert sorted(registration.versions) == ["/s", "/s/n0", "/s/n1", "/s/n2"]
    finally:
        cache.close()


def _cached_version_is(cache: TreeCache, path: str, version: int) -> bool:
    return cache.version(path) == version


def test_a_node_with_an_empty_value_is_cached_as_its_bare_version(reg: BaseRegistry) -> None:
    """Seven of a job's thirteen nodes are parents with an empty value: the cache keeps
    such a node as its version alone, and reads it back as the registry has it, also
    when its value turns empty or non-empty later."""
    reg.put("/s/parent/child", b"v")
    cache = TreeCache(reg, "/s").start()
    try:
        for value in (b"", b"x", b""):
            reg.put("/s/parent", value)
            expected = reg.get_node("/s/parent")
            assert expected is not None
            version = expected.version
            wait_for(functools.partial(_cached_version_is, cache, "/s/parent", version), PROMPT)
            assert cache.get("/s/parent") == value
            assert cache.get_node("/s/parent") == expected
            assert cache.exists("/s/parent")
            assert isinstance(cache._nodes["/s/parent"], int) is (value == b"")
        assert cache.get("/s/parent/child") == b"v"
        reg.delete("/s/parent")
        wait_for(lambda: not cache.exists("/s/parent"), PROMPT)
        assert cache.get("/s/parent") is None
        assert cache.get_node("/s/parent") is None
        assert cache.version("/s/parent") is None
    finally:
        cache.close()


def _written_and_read_back(reg: BaseRegistry, cache: TreeCache, path: str, value: bytes | None) -> Node:
    """Put ``value`` at ``path`` (None: leave it as it is), wait for the cache to show the
    registry's version, and check that every read of the cache agrees with the registry's."""
    if value is not None:
        reg.put(path, value)
    expected = reg.get_node(path)
    assert expected is not None
    wait_for(functools.partial(_cached_version_is, cache, path, expected.version), PROMPT)
    assert cache.get(path) == expected.value
    assert cache.get_node(path) == expected
    assert cache.version(path) == expected.version
    return expected


def test_a_node_of_version_0_is_cached_as_its_bare_value(reg: BaseRegistry) -> None:
    """A node never changed since it was made has version 0 on ZooKeeper (a job's config,
    registration, election and servers): the cache keeps its value alone, and reads it
    back as the registry has it, also once a change gives it a version of its own. On
    memory and etcd a version is a revision, never 0: the reads agree there too."""
    reg.put("/s/fresh", b"v")
    cache = TreeCache(reg, "/s").start()
    try:
        for value in (None, b"w", b""):
            expected = _written_and_read_back(reg, cache, "/s/fresh", value)
            entry = cache._nodes["/s/fresh"]
            assert isinstance(entry, bytes) is (expected.version == 0 and expected.value != b"")
            assert isinstance(entry, int) is (expected.value == b"")
    finally:
        cache.close()


def test_equal_values_of_nodes_are_one_object_in_the_cache(reg: BaseRegistry) -> None:
    """A value many nodes hold (``ENABLED`` in every job's servers node) is kept once,
    whether the node was loaded at the start or arrived as an event, though each read
    and event made its own bytes of it."""
    reg.put("/s/a", bytes(bytearray(b"ENABLED")))  # two equal values, two objects
    cache = TreeCache(reg, "/s").start()
    try:
        reg.put("/s/b", bytes(bytearray(b"ENABLED")))
        wait_for(lambda: cache.exists("/s/b"), PROMPT)
        assert cache.get("/s/a") == b"ENABLED"
        assert cache.get("/s/a") is cache.get("/s/b")
    finally:
        cache.close()


def test_a_watch_remembers_the_paths_it_leaves_out_and_no_node_it_reports(reg: BaseRegistry) -> None:
    """Every change a watch with ``exclude`` hears is asked "is this mine": it remembers
    the paths it left out (a running mark changes on every fire), but not the nodes it
    reports, which its versions hold already (a second map of every node)."""
    reg.put("/s/keep/a", b"v")
    reg.put("/s/skip/a", b"v")
    events: list[Event] = []
    reg.watch("/s", events.append, initial=True, exclude=lambda p: p == "/s/skip")
    reg.put("/s/skip/b", b"v")
    reg.put("/s/keep/b", b"v")
    wait_for(lambda: any(e.path == "/s/keep/b" for e in events), PROMPT)
    (registration,) = [r for r in reg._watches if r.root == reg._ns.to_server("/s")]
    assert sorted(registration.versions) == ["/s", "/s/keep", "/s/keep/a", "/s/keep/b"]
    assert not set(registration._left_out) & set(registration.versions)
    assert not [e for e in events if e.path.startswith("/s/skip")]
    registration._left_out.clear()  # as when the memo is full: the answers are found again
    assert not registration.covers(reg._ns.to_server("/s/skip/c/d"))
    assert registration.covers(reg._ns.to_server("/s/keep/c"))
    assert registration.covers(reg._ns.to_server("/s/keep"))
    assert sorted(registration._left_out) == ["/s/skip", "/s/skip/c", "/s/skip/c/d"]


def test_a_resync_reports_what_went_away_children_first_up_to_a_namespace_root(reg: BaseRegistry) -> None:
    """A resync after a gap reports the nodes gone, deepest first. A watch on a namespace's
    root keys it as the caller's ``/``, which lies above ``/a`` though both hold one slash."""
    reg.put("/a/b", b"v")
    events: list[Event] = []
    reg.watch("/", events.append, initial=True)
    assert reg.flush_events(PROMPT)
    (registration,) = [r for r in reg._watches if r.root == reg._ns.to_server("/")]
    known = sorted(registration.versions)
    # the namespace's root is a node where the server keeps parents (ZooKeeper, memory)
    assert known in (["/", "/a", "/a/b"], ["/a", "/a/b"])
    reg._resync(registration, {})  # the snapshot a re-read finds once the namespace is gone
    assert reg.flush_events(PROMPT)
    assert [e.path for e in events if e.kind is EventKind.DELETED] == sorted(known, reverse=True)
    assert registration.versions == {}


def test_the_memo_of_checked_paths_shrinks_once_its_paths_are_cached(reg: BaseRegistry) -> None:
    """Jobs starting read their nodes before they exist, so the memo peaks then; once
    those nodes are cached it holds none of them, and its table is no larger than what it
    holds (a set alone keeps the table of its peak)."""
    cache = TreeCache(reg, "/m").start()
    paths = [f"/m/flag{n}" for n in range(1000)]
    try:
        empty = sys.getsizeof(cache._checked)
        assert all(cache.get(path) is None for path in paths)
        assert len(cache._checked) == len(paths)
        peak = sys.getsizeof(cache._checked)
        for start in range(0, len(paths), 100):
            reg.transaction([Create(path, b"1") for path in paths[start : start + 100]])
        wait_for(lambda: all(cache.exists(path) for path in paths), PROMPT)
        assert cache._checked == set()
        assert sys.getsizeof(cache._checked) <= empty < peak
    finally:
        cache.close()


def test_the_cache_remembers_a_checked_path_only_while_it_is_absent(reg: BaseRegistry) -> None:
    """A read of an absent path checks it (inside the cached subtree, not excluded) and
    remembers it, since a fire reads the same absent flags every time; once the node is
    cached the memo lets it go (a cached node needs no check). Paths that fail the checks
    are refused every time, never remembered."""
    reg.put("/s/kept", b"v")
    cache = TreeCache(reg, "/s", exclude=lambda p: p == "/s/skip").start()
    try:
        assert cache.get("/s/flag") is None
        assert cache.children("/s") == ["kept"]
        assert cache._checked == {"/s/flag"}
        reg.put("/s/flag", b"up")
        wait_for(lambda: cache.exists("/s/flag"), PROMPT)
        assert cache._checked == set()
        assert cache.get("/s/flag") == b"up"
        reg.delete("/s/flag")
        wait_for(lambda: not cache.exists("/s/flag"), PROMPT)
        assert cache._checked == {"/s/flag"}
        for refused in ("/elsewhere", "/s/skip/a", "/s//x"):
            for _ in range(2):
                with pytest.raises(ValueError):
                    cache.get(refused)
        assert cache._checked == {"/s/flag"}
    finally:
        cache.close()


def test_a_held_read_answers_as_get_node_and_remembers_nothing(reg: BaseRegistry) -> None:
    """``held`` reads a node as ``get_node`` does, and an absent path as absent, without
    checking it or remembering it: a path the cache could never hold is absent too."""
    reg.put("/h/kept", b"v")
    cache = TreeCache(reg, "/h", exclude=lambda p: p == "/h/skip").start()
    try:
        assert cache.held("/h/kept") == cache.get_node("/h/kept") == reg.get_node("/h/kept")
        assert cache.held("/h") == cache.get_node("/h")
        for absent in ("/h/flag", "/elsewhere", "/h/skip/a", "/h//x"):
            assert cache.held(absent) is None
        assert cache._checked == set()
        reg.put("/h/flag", b"up")
        wait_for(lambda: cache.held("/h/flag") is not None, PROMPT)
        assert cache.held("/h/flag") == reg.get_node("/h/flag")
        reg.delete("/h/flag")
        wait_for(lambda: cache.held("/h/flag") is None, PROMPT)
        assert cache._checked == set()
    finally:
        cache.close()


class _DeflateBig:
    """A packing of the values under ``/s/big``: zlib, when it shrinks them."""

    def pack(self, path: str, value: bytes) -> bytes | None:
        if not path.startswith("/s/big"):
            return None
        packed = zlib.compress(value)
        return packed if len(packed) < len(value) else None

    def unpack(self, packed: bytes) -> bytes:
        return zlib.decompress(packed)


def _kept_value(cache: TreeCache, path: str) -> bytes:
    """The object the cache keeps of the value of ``path``, a node with a value."""
    entry = cache._nodes[path]
    assert not isinstance(entry, int)
    return entry if isinstance(entry, bytes) else entry[0]


def test_a_cache_with_packing_keeps_the_packed_form_and_reads_back_the_value(reg: BaseRegistry) -> None:
    """Values the packing takes are kept in its form and read back as the registry has
    them, through a change and a delete; a value it leaves (another path, or one that
    would not shrink) is kept as it is."""
    long_value = b'{"field": "value", "other": "value"}' * 20
    reg.put("/s/big", long_value)
    cache = TreeCache(reg, "/s", packing=_DeflateBig()).start()
    try:
        reg.put("/s/big2", b"x")  # too short to shrink
        reg.put("/s/plain", long_value)
        for value in (None, long_value + b"2", b""):
            _written_and_read_back(reg, cache, "/s/big", value)
        reg.put("/s/big", long_value)
        wait_for(lambda: cache.get("/s/big") == long_value, PROMPT)
        assert len(_kept_value(cache, "/s/big")) < len(long_value) // 4
        wait_for(lambda: cache.exists("/s/plain") and cache.exists("/s/big2"), PROMPT)
        for path, value in (("/s/plain", long_value), ("/s/big2", b"x")):
            assert _kept_value(cache, path) == value
            assert cache.get(path) == value
        reg.delete("/s/big")
        wait_for(lambda: not cache.exists("/s/big"), PROMPT)
        assert cache.get("/s/big") is None
    finally:
        cache.close()


def test_nodes_written_alike_in_one_transaction_hold_one_entry(reg: BaseRegistry) -> None:
    """Nodes with one value at one version hold one (value, version) tuple in the cache;
    at different versions, one each. One transaction gives its writes one version on
    ZooKeeper (the count of changes) and etcd (the transaction's revision), and each
    write a version of its own on memory. A packed value keeps a tuple of its own, and
    every node reads back as the registry holds it."""
    long_value = b'{"field": "value", "other": "value"}' * 20
    paths = ["/s/one", "/s/two", "/s/three"]
    packed = ["/s/big1", "/s/big2"]
    reg.transaction([Create(path, b"first") for path in paths + packed])
    cache = TreeCache(reg, "/s", packing=_DeflateBig()).start()
    try:
        reg.transaction([Set(path, b"alike") for path in paths] + [Set(path, long_value) for path in packed])
        wait_for(lambda: all(cache.get(p) == b"alike" for p in paths), PROMPT)
        wait_for(lambda: all(cache.get(p) == long_value for p in packed), PROMPT)
        nodes = {path: reg.get_node(path) for path in paths + packed}
        versions = {path: node.version for path, node in nodes.items() if node is not None}
        for path in paths:
            assert cache._nodes[path] == (b"alike", versions[path])
            for other in paths:
                assert (cache._nodes[path] is cache._nodes[other]) == (versions[path] == versions[other])
        first, second = (cache._nodes[path] for path in packed)
        assert isinstance(first, tuple) and isinstance(second, tuple) and first is not second
        for path in paths + packed:
            assert cache.get_node(path) == nodes[path]
    finally:
        cache.close()
