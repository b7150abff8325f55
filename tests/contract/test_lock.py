"""Contract: ``lock`` excludes every other client and is freed when its holder's session ends."""

from __future__ import annotations

import threading
import time

import pytest

from registry.backends.base import BaseRegistry
from registry.errors import LockTimeout
from tests.harness import Harness

from . import PROMPT, SLACK, namespace_of, peer, session_timeout

LOCK = "/locks/job"


def test_exclusion_between_two_clients(harness: Harness, reg: BaseRegistry) -> None:
    other = peer(harness, reg)
    with reg.lock(LOCK):
        start = time.monotonic()
        with pytest.raises(LockTimeout), other.lock(LOCK, timeout=0.5):
            pytest.fail("both clients hold the lock")
        waited = time.monotonic() - start
        assert 0.4 <= waited < 0.5 + SLACK, f"LockTimeout after {waited:.2f}s for a 0.5 s timeout"
    with other.lock(LOCK, timeout=PROMPT), pytest.raises(LockTimeout), reg.lock(LOCK, timeout=0):
        pytest.fail("both clients hold the lock")


def test_free_lock_is_taken_with_zero_timeout(reg: BaseRegistry) -> None:
    with reg.lock(LOCK, timeout=0):
        pass
    with reg.lock(LOCK, timeout=0):
        pass


def test_negative_timeout_is_a_value_error(reg: BaseRegistry) -> None:
    with pytest.raises(ValueError), reg.lock(LOCK, timeout=-1):
        pass


def test_mutual_exclusion_under_contention(harness: Harness, reg: BaseRegistry) -> None:
    clients = [reg, peer(harness, reg)]
    guard = threading.Lock()
    inside = 0
    overlaps = 0
    entries = 0
    errors: list[BaseException] = []

    def worker(client: BaseRegistry) -> None:
        nonlocal inside, overlaps, entries
        try:
            for _ in range(5):
                with client.lock(LOCK, timeout=30):
                    with guard:
                        inside += 1
                        entries += 1
                        overlaps += inside > 1
                    # hold the lock a moment, so that an overlap would show
                    time.sleep(0.01)
                    with guard:
                        inside -= 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(c,), daemon=True) for c in clients for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads), "a lock worker is stuck"
    assert errors == []
    assert entries == 20
    assert overlaps == 0


def test_released_when_the_block_raises(harness: Harness, reg: BaseRegistry) -> None:
    other = peer(harness, reg)
    with pytest.raises(RuntimeError, match="inside"), reg.lock(LOCK):
        raise RuntimeError("inside the lock")
    with other.lock(LOCK, timeout=PROMPT):
        pass


def test_a_timed_out_waiter_does_not_block_later_ones(harness: Harness, reg: BaseRegistry) -> None:
    waiter = peer(harness, reg, session_timeout=60)  # stays connected throughout
    late = peer(harness, reg)
    with reg.lock(LOCK), pytest.raises(LockTimeout), waiter.lock(LOCK, timeout=0.3):
        pass
    # a waiting entry left behind by ``waiter`` would stand in front of ``late``
    with late.lock(LOCK, timeout=5):
        pass


def test_freed_when_holder_session_expires(harness: Harness, reg: BaseRegistry) -> None:
    holder = peer(harness, reg, session_timeout=session_timeout(harness))
    acquired = threading.Event()
    release = threading.Event()

    def hold() -> None:
        try:
            with holder.lock(LOCK):
                acquired.set()
                release.wait(PROMPT * 3)
        except Exception:
            pass  # leaving a lock whose session is gone may fail; the holder must not matter

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    try:
        assert acquired.wait(PROMPT)
        harness.expire_session(holder)
        with reg.lock(LOCK, timeout=PROMPT):
            pass
    finally:
        release.set()
        thread.join(PROMPT)


def test_participant_lock_freed_when_killed(harness: Harness, reg: BaseRegistry) -> None:
    timeout = session_timeout(harness)
    participant = harness.participant(harness.url(namespace_of(reg), session_timeout=timeout), "lock", LOCK)
    killed = False
    try:
        assert participant.ready(PROMPT + timeout), "participant did not take the lock"
        with pytest.raises(LockTimeout), reg.lock(LOCK, timeout=0.3):
            pytest.fail("the lock held by the participant was granted")
        start = time.monotonic()
        participant.kill()
        killed = True
        with reg.lock(LOCK, timeout=timeout + SLACK):
            waited = time.monotonic() - start
        assert waited < timeout + SLACK
    finally:
        if not killed:
            participant.kill()


def test_participant_lock_freed_on_clean_stop(harness: Harness, reg: BaseRegistry) -> None:
    # a session timeout longer than the wait: only a clean release can free it in time
    participant = harness.participant(harness.url(namespace_of(reg), session_timeout=30), "lock", LOCK)
    stopped = False
    try:
        assert participant.ready(PROMPT), "participant did not take the lock"
        with pytest.raises(LockTimeout), reg.lock(LOCK, timeout=0.3):
            pytest.fail("the lock held by the participant was granted")
        participant.stop()
        stopped = True
        with reg.lock(LOCK, timeout=PROMPT):
            pass
    finally:
        if not stopped:
            participant.kill()


def test_lock_paths_are_independent(harness: Harness, reg: BaseRegistry) -> None:
    other = peer(harness, reg)
    with reg.lock("/locks/a"), other.lock("/locks/b", timeout=PROMPT):
        pass
