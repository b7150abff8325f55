"""What the etcd backend's transactions cost, counted at the server (``/metrics``, the KV
service's share).

Parents: a parent a watch has reported is guarded (``version > 0``); one it has not is
put by a nested transaction if absent, so a new subtree is written in one request, not a
refused guard, a read of the parents and a second try. The hint is only a hint: these
tests pin that it never changes an outcome.

Failures: a transaction is sent without a failure branch (every fire's mark and its
removal pass here, and almost all of them apply); only once it failed are its ops' keys
read, in a second request, to name an op whose check fails. A refusal whose cause is gone
by that read names no op: the transaction is planned and tried again, and applies if its
checks now pass."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import registry
from benchmarks.server_counters import read_count
from registry.backends.etcd import EtcdRegistry
from registry.errors import BadVersionError, NodeExistsError, TransactionError
from registry.protocol import Check, Create, Event, Op, Set
from tests.servers.external import skip_unless_counted_alone
from tests.waiting import wait_for

#: new subtrees written one transaction each
SUBTREES = 10


@pytest.fixture
def pair(etcd_server: Any) -> Iterator[tuple[EtcdRegistry, EtcdRegistry]]:
    namespace = "/etcdreq" + uuid.uuid4().hex[:10]
    ours = registry.connect(f"etcd://{etcd_server.address}{namespace}")
    other = registry.connect(f"etcd://{etcd_server.address}{namespace}")
    assert isinstance(ours, EtcdRegistry) and isinstance(other, EtcdRegistry)
    try:
        yield ours, other
    finally:
        ours.close()
        other.close()


def _kv_requests(reg: EtcdRegistry) -> int:
    host, port = registry.parse_url(reg.url).hosts[0]
    skip_unless_counted_alone("etcd", f"{host}:{port}")
    count = read_count("etcd", f"{host}:{port}")
    assert count.kv is not None
    return count.kv


@contextlib.contextmanager
def _watching(reg: EtcdRegistry, reported: str) -> Iterator[None]:
    """A watch of the whole namespace, once it has reported ``reported``."""
    seen: list[Event] = []
    watch = reg.watch("/", seen.append, initial=True)
    try:
        wait_for(
            lambda: any(e.path == reported for e in seen), timeout=10, message=f"the watch never reported {reported}"
        )
        yield
    finally:
        watch.cancel()


def _new_subtree(n: int) -> list[Create]:
    return [Create(f"/jobs/j{n}/config", b"c"), Create(f"/jobs/j{n}/servers/h", b"s")]


def test_new_subtrees_under_a_watch_are_written_in_one_request_each(
    pair: tuple[EtcdRegistry, EtcdRegistry],
) -> None:
    ours, other = pair
    ours.put("/jobs", b"")
    with _watching(ours, "/jobs"):
        before = _kv_requests(ours)
        for n in range(SUBTREES):
            ours.transaction(_new_subtree(n))
        requests = _kv_requests(ours) - before
    # one transaction each (a few more from other clients of the session's server); with
    # the parents guarded as present, each took a refused try, a read and a second try: 30
    assert requests <= SUBTREES + 3, requests
    for n in range(SUBTREES):
        assert other.get(f"/jobs/j{n}") == b"" and other.get(f"/jobs/j{n}/servers") == b""
        assert other.get(f"/jobs/j{n}/config") == b"c" and other.get(f"/jobs/j{n}/servers/h") == b"s"


def test_a_present_parent_the_hint_missed_keeps_its_value_and_version(
    pair: tuple[EtcdRegistry, EtcdRegistry], monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, other = pair
    other.create("/jobs/a", b"kept")
    version = other.get_node("/jobs/a")
    assert version is not None
    # as when a watch lags behind the write that made the parent
    monkeypatch.setattr(ours, "_unseen", lambda stored_path: True)
    ours.transaction([Create("/jobs/a/config", b"1"), Create("/jobs/b/config", b"2")])
    assert other.get_node("/jobs/a") == version  # neither its value nor its version moved
    assert other.get("/jobs/a/config") == b"1" and other.get("/jobs/b") == b""


def test_a_parent_deleted_after_its_watch_reported_it_is_created_again(
    pair: tuple[EtcdRegistry, EtcdRegistry],
) -> None:
    ours, other = pair
    ours.create("/jobs/a/config", b"1")
    with _watching(ours, "/jobs/a"):
        other.delete("/jobs")  # the guard of /jobs/a fails: read, planned again, created
        ours.transaction([Create("/jobs/a/servers/h", b"2")])
    assert other.get("/jobs/a/servers/h") == b"2" and other.get("/jobs/a") == b""


def test_an_applied_transaction_is_one_request_and_a_refused_one_is_named_by_a_read(
    pair: tuple[EtcdRegistry, EtcdRegistry],
) -> None:
    ours, _ = pair
    ours.put("/job/sharding", b"a")
    ours.put("/job/running", b"")
    ours.put("/job/config", b"c")
    version = ours.get_node("/job/sharding")
    assert version is not None
    mark: list[Op] = [
        Check("/job/sharding", version.version),
        Create("/job/running/i", b"fire 1", ephemeral=True),
    ]
    before = _kv_requests(ours)
    ours.transaction(mark)
    applied = _kv_requests(ours) - before
    before = _kv_requests(ours)
    with pytest.raises(TransactionError) as refused:
        ours.transaction([Set("/job/config", b"d"), *mark])  # the mark's create: present
    failed = _kv_requests(ours) - before
    assert (ours.get("/job/running/i"), ours.get("/job/config")) == (b"fire 1", b"c")  # nothing applied
    error = refused.value
    assert (error.index, error.op) == (2, mark[1])
    assert isinstance(error.cause, NodeExistsError) and error.cause.path == "/job/running/i"
    # a few more from other clients of the session's server (its lease keepalives count
    # elsewhere): the transaction alone, then the transaction and the read that names its op
    assert applied <= 1 + 2, applied
    assert 2 <= failed <= 2 + 2, failed


def test_a_version_check_that_fails_is_named_with_the_version_it_expected(
    pair: tuple[EtcdRegistry, EtcdRegistry],
) -> None:
    ours, other = pair
    ours.put("/job/sharding", b"a")
    node = ours.get_node("/job/sharding")
    assert node is not None
    other.put("/job/sharding", b"b")
    with pytest.raises(TransactionError) as refused:
        ours.transaction([Create("/job/running/i", b"f"), Check("/job/sharding", node.version)])
    assert refused.value.index == 1
    cause = refused.value.cause
    assert isinstance(cause, BadVersionError) and cause.expected == node.version
    assert ours.get_node("/job/running/i") is None


def test_a_refusal_whose_cause_is_gone_by_the_read_is_tried_again_and_applies(
    pair: tuple[EtcdRegistry, EtcdRegistry], monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, other = pair
    ours.put("/job/running/i", b"stale")
    ours.put("/job/config", b"c")
    reads: list[list[str]] = []
    read = ours._read

    def read_after_the_cause_went(paths: list[str]) -> dict[str, Any]:
        if not reads:
            other.delete("/job/running/i")  # what refused the create is gone before the read
        reads.append(list(paths))
        return read(paths)

    monkeypatch.setattr(ours, "_read", read_after_the_cause_went)
    ours.transaction([Create("/job/running/i", b"fire 2"), Set("/job/config", b"d")])
    # refused once; its ops' keys read (no op's check failing now), then its parents for
    # the new plan, which applied
    assert [path.partition("/job/")[2] for path in reads[0]] == ["running/i", "config"]
    assert len(reads) == 2
    assert (other.get("/job/running/i"), other.get("/job/config")) == (b"fire 2", b"d")


def _marks(jobs: range, versions: dict[int, int]) -> list[list[Op]]:
    """Each job's fenced mark, as a fire writes it: its instance checked, the mark made."""
    return [[Check(f"/jobs/j{n}/instances/i", versions[n]), Create(f"/jobs/j{n}/running/i", b"m")] for n in jobs]


def _set_up_jobs(reg: EtcdRegistry, jobs: range) -> dict[int, int]:
    for n in jobs:
        reg.transaction([Create(f"/jobs/j{n}/instances/i", b"i"), Create(f"/jobs/j{n}/running", b"")])
    versions: dict[int, int] = {}
    for n in jobs:
        node = reg.get_node(f"/jobs/j{n}/instances/i")
        assert node is not None
        versions[n] = node.version
    return versions


def test_separate_transactions_go_in_one_request_each_applied_alone(
    pair: tuple[EtcdRegistry, EtcdRegistry],
) -> None:
    """``transactions``: each group its own transaction, all nested in ONE request (where a
    joined transaction held at most 32 fenced marks, one request holds them all here); a
    group whose check fails is named by a read and told alone, the others applied."""
    ours, other = pair
    jobs = range(100)
    versions = _set_up_jobs(ours, jobs)
    groups = _marks(jobs, versions)
    assert sum(ours.transaction_cost(group) for group in groups) > 2 * ours.max_txn_ops  # more than one joined
    before = _kv_requests(ours)
    assert ours.transactions(groups) == [None] * len(groups)
    assert _kv_requests(ours) - before == 1
    assert all(other.get(f"/jobs/j{n}/running/i") == b"m" for n in jobs)

    other.put("/jobs/j7/instances/i", b"re-registered")  # job 7's fence moves
    for n in jobs:
        other.delete(f"/jobs/j{n}/running/i")
    before = _kv_requests(ours)
    outcomes = ours.transactions(groups)
    assert _kv_requests(ours) - before == 2  # the request, and the read naming job 7's op
    fenced = outcomes[7]
    assert isinstance(fenced, TransactionError) and fenced.index == 0 and fenced.op == groups[7][0]
    assert isinstance(fenced.cause, BadVersionError)
    assert [n for n, outcome in zip(jobs, outcomes, strict=True) if outcome is not None] == [7]
    assert other.get("/jobs/j7/running/i") is None
    assert all(other.get(f"/jobs/j{n}/running/i") == b"m" for n in jobs if n != 7)


def test_a_request_of_separate_transactions_is_charged_against_etcds_space_quota(
    pair: tuple[EtcdRegistry, EtcdRegistry],
) -> None:
    """etcd charges a request against its space quota by its top-level puts only: the
    shared request of nested transactions carries one in its failure branch, which never
    runs and writes nothing (``tests/registry/test_etcd_space.py`` runs it against a full
    database)."""
    ours, other = pair
    versions = _set_up_jobs(ours, range(2))
    sent: list[Any] = []
    write = ours._write

    def recording(request: Any, action: str) -> Any:
        sent.append(request)
        return write(request, action)

    ours._write = recording  # type: ignore[method-assign]
    assert ours.transactions(_marks(range(2), versions)) == [None, None]
    (request,) = sent
    assert not request.compare and [op.WhichOneof("request") for op in request.success] == ["request_txn"] * 2
    (probe,) = request.failure
    assert probe.WhichOneof("request") == "request_put"
    assert other.get("/jobs/j0/running/i") == other.get("/jobs/j1/running/i") == b"m"
    probe_key = bytes(probe.request_put.key).decode()
    assert not probe_key.startswith("/")  # outside every namespace
    assert ours._read([probe_key]) == {probe_key: None}  # and never written
