"""``session_deadline()``: until when a client's session is known to hold, from the
answers the server gave it. ZooKeeper expires a session its granted timeout after it last
heard from the client, so the latest applied transaction's send time plus that timeout
bounds it; etcd ends a lease its TTL after the last refresh it applied, so the latest
answered refresh does; an in-process store's answers cannot come late. A session that
ended vouches for nothing. The runner's use of it: ``tests/scheduler/test_late_answer.py``."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import pytest

import registry
from registry.backends.base import BaseRegistry
from registry.backends.zookeeper import ZooKeeperRegistry
from registry.backends.zookeeper_connect import granted_timeout
from registry.protocol import Create, SessionState
from tests.conftest import close_harness, make_harness
from tests.harness import Harness
from tests.waiting import wait_for

#: above the test server's maxSessionTimeout (60 s): the server grants 60
ASKED_ABOVE_THE_SERVER = 90.0


@pytest.fixture
def zk(request: pytest.FixtureRequest) -> Iterator[Harness]:
    made = make_harness("zookeeper", request)
    yield made
    close_harness(made)


@pytest.fixture
def etcd(request: pytest.FixtureRequest) -> Iterator[Harness]:
    made = make_harness("etcd", request)
    yield made
    close_harness(made)


@pytest.fixture(params=["zookeeper", "etcd"])
def server(request: pytest.FixtureRequest) -> Iterator[Harness]:
    made = make_harness(request.param, request)
    yield made
    close_harness(made)


def _applied(reg: BaseRegistry, path: str) -> tuple[float, float]:
    """(just before, just after) a transaction ``reg`` applied, on ``time.monotonic()``."""
    before = time.monotonic()
    reg.transaction([Create(path, b"")])
    return before, time.monotonic()


def test_memory_vouches_always() -> None:
    with registry.connect("memory://session-deadline/ns") as reg:
        assert isinstance(reg, BaseRegistry)
        assert reg.session_deadline() == math.inf


def test_zookeeper_counts_from_the_latest_transaction_with_the_granted_timeout(zk: Harness) -> None:
    reg = zk.connect(session_timeout=ASKED_ABOVE_THE_SERVER)
    assert isinstance(reg, ZooKeeperRegistry)
    granted = granted_timeout(reg._client)
    assert granted == 60.0  # the server's bound, not the 90 asked for
    first = _applied(reg, "/a")
    assert first[0] + granted <= reg.session_deadline() <= first[1] + granted
    second = _applied(reg, "/b")
    assert second[0] + granted <= reg.session_deadline() <= second[1] + granted


def test_zookeeper_asked_below_the_grant_counts_what_it_asked(zk: Harness) -> None:
    reg = zk.connect(session_timeout=3.0)
    before, after = _applied(reg, "/a")
    assert before + 3.0 <= reg.session_deadline() <= after + 3.0


def test_etcd_moves_with_each_refresh_of_the_lease(etcd: Harness) -> None:
    reg = etcd.connect(session_timeout=3.0)  # TTL 3 s, refreshed every second
    first = reg.session_deadline()
    assert time.monotonic() < first <= time.monotonic() + 3.0
    wait_for(lambda: reg.session_deadline() > first, 5, message="no refresh moved the deadline")
    assert reg.session_deadline() <= time.monotonic() + 3.0


def test_an_ended_session_vouches_for_nothing_it_answered(server: Harness) -> None:
    reg = server.connect(session_timeout=3.0)
    states: list[SessionState] = []
    reg.add_listener(states.append)
    _applied(reg, "/a")
    before = time.monotonic()
    server.expire_session(reg)
    wait_for(lambda: SessionState.CONNECTED in states, 15, message=lambda: f"no new session: {states}")
    if isinstance(reg, ZooKeeperRegistry):
        # only what is answered in the new session counts
        assert reg.session_deadline() == -math.inf
        start, end = _applied(reg, "/b")
        assert start + 3.0 <= reg.session_deadline() <= end + 3.0
    else:
        # the new lease's grant, sent after the old one ended
        assert before < reg.session_deadline() - 3.0 <= time.monotonic()
