"""``LeaderElection``: a candidate campaigns again when the leader node goes, unless it
has withdrawn — then deleting the job's nodes (an operator's ``remove``) must not make it
create them again; with ``defer``, off the registry's shared threads; with a cache, the
version of the term it won (its fencing token) comes from the cache, not a read. Run on
the three backends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from registry.backends.base import BaseRegistry
from registry.protocol import EventKind, Node
from registry.recipes.cache import TreeCache
from registry.recipes.election import LeaderElection
from tests.contract import PROMPT, EventLog, peer, wait_for
from tests.harness import Harness

ROOT = "/job"
LEADER = f"{ROOT}/leader/election/instance"
TERM = f"{ROOT}/leader/election/term"


@pytest.fixture
def election(reg: BaseRegistry) -> Iterator[LeaderElection]:
    made = LeaderElection(reg, LEADER, "a")
    made.start()
    assert made.is_leader
    yield made
    made.stop()


def test_a_candidate_campaigns_again_when_its_node_is_deleted(
    harness: Harness, reg: BaseRegistry, election: LeaderElection
) -> None:
    other = peer(harness, reg)
    other.delete(ROOT)
    wait_for(lambda: other.get(LEADER) == b"a" and election.is_leader, PROMPT)


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
    made = LeaderElection(reg, LEADER, "a", defer=deferred.append)
    made.start()
    try:
        assert made.is_leader
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
