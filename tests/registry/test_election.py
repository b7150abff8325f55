"""``LeaderElection``: a candidate campaigns again when the leader node goes, unless it
has withdrawn — then deleting the job's nodes (an operator's ``remove``) must not make it
create them again; with ``defer``, off the registry's shared threads; with a cache, the
version of the term it won (its fencing token) comes from the cache, not a read. Run on
the three backends."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from registry.backends.base import BaseRegistry
from registry.backends.zookeeper import ZooKeeperRegistry
from registry.protocol import Event, EventKind, Node
from registry.recipes.cache import TreeCache
from registry.recipes.election import LeaderElection
from tests.contract import PROMPT, EventLog, peer, wait_for
from tests.harness import Harness

ROOT = "/job"
LEADER = f"{ROOT}/leader/election/instance"
TERM = f"{ROOT}/leader/election/term"


class Followed:
    """An election whose changes come from a watch of the test's own (``follow=False``,
    as a sharding service hands its elections what its cache hears), so that a test can
    wait until that watch has reported the leader node before it deletes it: a node
    deleted before its watch saw it is the gap of ``test_a_leader_whose_node_went_...``."""

    def __init__(self, reg: BaseRegistry, **options: Any) -> None:
        self.reg = reg
        self.election = LeaderElection(reg, LEADER, "a", follow=False, **options)
        self.log = EventLog()
        self._watch = reg.watch(LEADER, self._heard)
        reg.add_listener(self.election.on_session)

    def _heard(self, event: Event) -> None:
        self.log(event)
        self.election.on_event(event)

    def start(self) -> LeaderElection:
        self.election.start()
        assert self.election.is_leader
        self.log.wait(EventKind.CREATED, LEADER, b"a")  # the watch saw the node: armed on it
        return self.election

    def stop(self) -> None:
        self.election.stop()
        self._watch.cancel()
        self.reg.remove_listener(self.election.on_session)


@pytest.fixture
def election(reg: BaseRegistry) -> Iterator[LeaderElection]:
    followed = Followed(reg)
    yield followed.start()
    followed.stop()


def test_a_candidate_campaigns_again_when_its_node_is_deleted(
    harness: Harness, reg: BaseRegistry, election: LeaderElection
) -> None:
    other = peer(harness, reg)
    other.delete(ROOT)
    wait_for(
        lambda: other.get(LEADER) == b"a" and election.is_leader,
        PROMPT,
        message=lambda: (
            f"leader {election.is_leader}, participating {election.participating}; "
            f"the registry holds {sorted(other.read_tree(ROOT))}"
        ),
    )


def test_a_withdrawn_leader_leads_until_stopped_and_never_campaigns_again(
    harness: Harness, reg: BaseRegistry, election: LeaderElection
) -> None:
    other = peer(harness, reg)
    election.withdraw()
    assert election.is_leader and other.get(LEADER) == b"a"
    other.delete(ROOT)
    wait_for(lambda: not election.is_leader, PROMPT)
    assert reg.flush_events(PROMPT), "events were not drained in time"
    assert other.read_tree(ROOT) == {}, "a withdrawn candidate re-created the deleted nodes"
    election.stop()
    assert other.read_tree(ROOT) == {}


def test_with_defer_a_campaign_runs_where_it_is_put_not_on_the_event_thread(
    harness: Harness, reg: BaseRegistry
) -> None:
    """The deleted leader node is heard of on the registry's shared event thread: the
    campaign it calls for is handed to ``defer``, and until that runs the thread goes on
    delivering every other watch's events."""
    deferred: list[Callable[[], object]] = []
    followed = Followed(reg, defer=deferred.append)
    made = followed.start()
    try:
        log = EventLog()
        reg.watch("/elsewhere", log)
        other = peer(harness, reg)
        other.delete(LEADER)
        wait_for(lambda: bool(deferred), PROMPT)
        assert not made.is_leader and other.get(LEADER) is None  # nothing campaigned inline
        other.put("/elsewhere/x", b"1")
        log.wait(EventKind.CREATED, "/elsewhere/x", b"1")
        for campaign in deferred:
            campaign()
        assert made.is_leader and other.get(LEADER) == b"a"
    finally:
        followed.stop()


def test_a_leader_whose_node_went_before_its_watch_saw_it_campaigns_again(
    harness: Harness, reg: BaseRegistry
) -> None:
    """The election's own watch (``follow=True``) hears of its node only after winning; a
    node deleted before then must still end the term and bring a new campaign."""
    made = LeaderElection(reg, LEADER, "a")
    made.start(participate=False)  # the watch first, on a node not there yet
    other = peer(harness, reg)
    held = threading.Event()
    if isinstance(reg, ZooKeeperRegistry):
        # ZooKeeper's watches fire once and are armed again by a read: hold that read
        # until the node is gone, as a busy watch worker does; the exists watch that fired
        # is all the watch learns of the node's coming and going
        def busy() -> None:
            held.wait(PROMPT)

        reg._worker.submit(busy)
    try:
        made.resume()
        assert made.is_leader
        other.delete(ROOT)
        held.set()
        wait_for(
            lambda: other.get(LEADER) == b"a" and made.is_leader,
            PROMPT,
            message=lambda: f"leader {made.is_leader}; the registry holds {sorted(other.read_tree(ROOT))}",
        )
    finally:
        held.set()
        made.stop()


@pytest.fixture
def term_reads(reg: BaseRegistry, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths ``reg.get_node`` is asked for from now on."""
    asked: list[str] = []
    read = reg.get_node

    def recording(path: str, *args: Any, **kwargs: Any) -> Node | None:
        asked.append(path)
        return read(path, *args, **kwargs)

    monkeypatch.setattr(reg, "get_node", recording)
    return asked


def test_a_term_advanced_from_the_cache_takes_its_version_from_it_not_from_a_read(
    harness: Harness, reg: BaseRegistry, term_reads: list[str]
) -> None:
    cache = TreeCache(reg, ROOT).start()
    other = peer(harness, reg)
    try:
        for identifier, term in (("a", b"1"), ("b", b"2")):  # the first term, then one advanced
            # the cache has caught up: no leader, and the term as the last campaign left it
            wait_for(lambda: cache.get(LEADER) is None and cache.get(TERM) == other.get(TERM), PROMPT)
            term_reads.clear()
            made = LeaderElection(reg, LEADER, identifier, cache=cache)
            made.start()
            try:
                assert made.is_leader
                won = other.get_node(TERM)
                assert won is not None and won.value == term
                assert made.leader_version == won.version
                reg.transaction(made.fence_ops())  # the token fences: its checks pass
            finally:
                made.stop()
        # the first term was created, so read back; the second advanced the cached first
        assert TERM not in term_reads
    finally:
        cache.close()


def test_an_election_that_does_not_follow_reacts_only_to_what_its_owner_hands_over(
    harness: Harness, reg: BaseRegistry
) -> None:
    """``follow=False``: no listener of its own, so a deleted leader node means nothing to
    it until its owner (a sharding service, from the listeners it has anyway) hands the
    event over; then it campaigns as one that follows would."""
    cache = TreeCache(reg, ROOT).start()
    handed: list[Any] = []
    cache.add_listener(handed.append, under=LEADER)
    made = LeaderElection(reg, LEADER, "a", cache=cache, follow=False)
    made.start()
    other = peer(harness, reg)
    try:
        assert made.is_leader
        # the campaign returns once its term is cached, or after 2 s without it: a node
        # deleted before the watch read it is never reported, so the test waits for it
        wait_for(lambda: cache.exists(LEADER), PROMPT, message="the cache never showed the leader node")
        other.delete(LEADER)
        wait_for(lambda: any(e.kind is EventKind.DELETED for e in handed), PROMPT)
        assert reg.flush_events(PROMPT), "events were not drained in time"
        assert made.is_leader and other.get(LEADER) is None  # it heard nothing: no campaign
        for event in list(handed):
            made.on_event(event)
        assert made.is_leader and other.get(LEADER) == b"a"  # it lost its node and won again
    finally:
        made.stop()
        cache.close()
