"""The benchmarks that start jobs on a server (``scheduler_lateness``, ``memory_census``)
delete each child's namespace once the child has ended, so every child finds its registry
server holding its own jobs only, whatever ran before it."""

from __future__ import annotations

from benchmarks.common import delete_namespace
from tests.harness import Harness


def test_the_ended_childs_namespace_is_deleted_and_nothing_else(server: Harness) -> None:
    ended, other = server.fresh_namespace(), server.fresh_namespace()
    left = server.connect(ended)
    left.create("/job-00000/config", b"{}")
    left.create("/job-00000/sharding/0/instance", b"host@-@1")
    kept = server.connect(other)
    kept.create("/job-00000/config", b"{}")

    delete_namespace(server.url(), ended)

    root = server.connect("")
    assert not root.exists(ended)
    assert root.exists(other)
    assert kept.get("/job-00000/config") == b"{}"
