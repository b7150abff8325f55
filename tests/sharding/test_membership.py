"""Registration of an instance (``sharding/membership.py``) on every backend, when an
answer is lost between the server and this client, or a notice reaches it late."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence

import pytest

from registry.backends.base import BaseRegistry
from registry.errors import RegistryConnectionError
from registry.protocol import Create, Op
from registry.recipes.cache import TreeCache
from sharding.errors import ShardingError
from sharding.instance import InstanceIdentity
from sharding.layout import JobPaths, is_leaf, is_running_marks
from sharding.membership import Membership
from tests.harness import Harness
from tests.waiting import wait_for


@pytest.fixture
def reg(harness: Harness) -> BaseRegistry:
    # the shortest session: a wait for a node that never goes ends (and fails) soonest
    return harness.connect(harness.fresh_namespace(), session_timeout=harness.min_session_timeout)


@pytest.fixture
def cache(reg: BaseRegistry) -> Iterator[TreeCache]:
    made = TreeCache(reg, "/", exclude=is_running_marks, leaves=is_leaf).start()
    yield made
    made.close()


def test_a_create_applied_whose_answer_was_lost_is_adopted_on_the_next_try(
    reg: BaseRegistry, cache: TreeCache
) -> None:
    """The server applies the instance's create, and the answer is lost (the connection
    drops): the node is this instance's, in its live session. The next try adopts it; it
    must not wait it out as another session's node, which never goes while the session
    lives (and fails after twice the session timeout + 5 s)."""
    identity = InstanceIdentity.create("10.0.0.1@-@1")
    answers_lost: list[Sequence[Op]] = []

    def commit(ops: Sequence[Op]) -> None:
        reg.transaction(ops)
        if not answers_lost and any(isinstance(op, Create) for op in ops):
            answers_lost.append(ops)
            raise RegistryConnectionError("connection dropped before the answer (the create was applied)")

    membership = Membership(reg, JobPaths("job"), identity, cache, commit=commit)
    with pytest.raises(RegistryConnectionError):
        membership.register()
    written = reg.get(membership.path)
    assert written is not None  # the server applied it
    membership.register()
    assert membership.registered
    assert reg.get(membership.path) == written  # adopted as it was, not replaced


def test_a_session_loss_reported_after_the_re_registration_keeps_the_node_ours(
    reg: BaseRegistry, cache: TreeCache
) -> None:
    """Watch events and session states reach a client on threads of their own, so after a
    session expired the cache can report the instance's node gone (and the instance
    register again, in the new session) before the service hears of the loss. The loss,
    heard late, must not turn the node just written into "another session's" for the next
    registration: it would wait for a node that lives as long as its own session, then
    give up, fenced out of every run until the session changed again."""
    membership = Membership(reg, JobPaths("job"), InstanceIdentity.create("10.0.0.1@-@1"), cache)
    membership.register()
    reg.delete(membership.path)  # the old session's node, gone with it
    membership.register()  # the re-registration the cache's event started: the node is back
    written = reg.get(membership.path)
    membership.lost()  # the session's loss, heard only now
    membership.register()  # the one the new session's CONNECTED starts
    assert membership.registered
    assert reg.get(membership.path) == written



class _Owner:
    """A service as its membership sees it: leaving once told to."""

    def __init__(self) -> None:
        self.stopping = threading.Event()

    def leaving(self) -> bool:
        return self.stopping.is_set()


def test_a_registration_waiting_out_another_sessions_node_ends_once_its_owner_is_leaving(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """A node of this instance's id held by another session is waited out, for up to twice
    the session timeout + 5 s; once the owning service is leaving (a shutdown), the wait
    ends at once with an error, and the other session's node is left as it was."""
    identity = InstanceIdentity.create("10.0.0.1@-@1")
    paths = JobPaths("job")
    namespace = harness.fresh_namespace()
    timeout = harness.min_session_timeout
    squatter = harness.connect(namespace, session_timeout=timeout)
    reg = harness.connect(namespace, session_timeout=timeout)
    cache = TreeCache(reg, "/", exclude=is_running_marks, leaves=is_leaf).start()
    try:
        squatter.create(paths.instance(identity.instance_id), b"another session's", ephemeral=True)
        owner = _Owner()
        membership = Membership(reg, paths, identity, cache, owner=owner)
        failed: list[BaseException] = []

        def register() -> None:
            try:
                membership.register()
            except ShardingError as exc:
                failed.append(exc)

        waiting = threading.Thread(target=register)
        with caplog.at_level(logging.WARNING, logger="sharding"):
            waiting.start()
            wait_for(lambda: "held by another session" in caplog.text, 10, message="the wait never began")
        owner.stopping.set()
        cache.wake()  # what a stopping service does: the wait looks again at once
        waiting.join(timeout)  # well inside the wait's bound (2 x timeout + 5 s)
        assert not waiting.is_alive(), "the registration went on waiting though its owner left"
        assert len(failed) == 1 and "the instance is stopping" in str(failed[0])
        assert reg.get(membership.path) == b"another session's"
    finally:
        cache.close()
        squatter.close()
        reg.close()
