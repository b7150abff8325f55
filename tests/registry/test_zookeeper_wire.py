"""The ZooKeeper backend's own multi encoding (``registry/backends/zookeeper_wire.py``):
byte for byte what kazoo sends, and answers decoded as kazoo decodes them, from a real
server; and its multiRead, which kazoo lacks, answered read by read as kazoo's own reads."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.protocol.serialization import (
    CheckVersion,
    Create,
    Delete,
    GetChildren,
    GetData,
    MultiHeader,
    SetData,
    Transaction,
)
from kazoo.security import ACL, OPEN_ACL_UNSAFE, Id, Permissions, make_digest_acl

from registry.backends import zookeeper_wire
from registry.backends.zookeeper_wire import (
    EncodedMulti,
    MultiEncoder,
    decode_read_answers,
    get_children,
    get_data,
    request_size,
    send_multi,
    send_multi_read,
)
from registry.errors import RegistryError

ACLS = {
    "open": OPEN_ACL_UNSAFE,
    "digest": [make_digest_acl("user", "pw", all=True), make_digest_acl("reader", "pw2", read=True)],
    "auth": [ACL(Permissions.ALL, Id("auth", ""))],  # an empty id: kazoo sends it as none
}


def encoded(encoder: MultiEncoder, ops: list[Any]) -> list[bytes]:
    """``ops`` (kazoo's request ops) through ``encoder``."""
    out = []
    for op in ops:
        if isinstance(op, Create):
            out.append(encoder.create(op.path, op.data, bool(op.flags & 1)))
        elif isinstance(op, Delete):
            out.append(encoder.delete(op.path, op.version))
        elif isinstance(op, SetData):
            out.append(encoder.set(op.path, op.data, op.version))
        else:
            out.append(encoder.check(op.path, op.version))
    return out


@pytest.mark.parametrize("acl", sorted(ACLS))
def test_every_op_is_encoded_as_kazoo_encodes_it(acl: str) -> None:
    kazoo_ops = [
        Create("/jobs/a/running/i1", b'{"state":"running"}', ACLS[acl], 1),
        Create("/jobs/a/config", b"", ACLS[acl], 0),
        Create("/jobs/\u00e9t\u00e9/config", b"\x00\xff", ACLS[acl], 0),
        CheckVersion("/jobs/a/sharding", 7),
        CheckVersion("/jobs/a/instances/i1", -1),
        SetData("/jobs/a/failover", b"[1,2]", 3),
        Delete("/jobs/a/running/i1", -1),
        Delete("/jobs/\u00e9t\u00e9", 12),
    ]
    encoder = MultiEncoder(ACLS[acl])
    ours = encoded(encoder, kazoo_ops)
    expected = bytes(Transaction(kazoo_ops).serialize())
    assert b"".join(ours) + zookeeper_wire.MULTI_END == expected
    assert request_size(ours) == 8 + len(expected)  # xid and type ahead of the body


def test_an_answer_with_an_op_type_never_sent_is_refused() -> None:
    create2 = struct.pack("!iBi", 15, 0, -1) + struct.pack("!i", 2) + b"/x"
    with pytest.raises(RegistryError, match="op type 15"):
        EncodedMulti.deserialize(create2 + zookeeper_wire.MULTI_END, 0)


def test_a_multi_reads_ops_are_kazoos_reads_under_a_multi_header() -> None:
    for path in ["/jobs/a/config", "/jobs/\u00e9t\u00e9", "/"]:
        for ours, theirs in [(get_data(path), GetData(path, None)), (get_children(path), GetChildren(path, None))]:
            assert ours == bytes(MultiHeader(theirs.type, False, -1).serialize() + theirs.serialize())


def test_a_multi_read_answer_with_an_op_type_never_sent_is_refused() -> None:
    check = struct.pack("!iBi", 13, 0, -1)
    with pytest.raises(RegistryError, match="op type 13"):
        decode_read_answers(check + zookeeper_wire.MULTI_END, 0)


@pytest.fixture
def client(zk_server: Any) -> Iterator[tuple[KazooClient, str]]:
    kazoo = KazooClient(hosts=zk_server.address)
    kazoo.start(timeout=30)
    root = "/wire" + uuid.uuid4().hex[:10]
    kazoo.create(root + "/a", b"1", makepath=True)
    try:
        yield kazoo, root
    finally:
        kazoo.delete(root, recursive=True)
        kazoo.stop()
        kazoo.close()


def results_of(answer: list[Any]) -> list[Any]:
    """Results comparable across two runs: exceptions by type, stats by version."""
    return [
        type(r).__name__ if isinstance(r, Exception) else r.version if hasattr(r, "mzxid") else r for r in answer
    ]


def both_ways(kazoo: KazooClient, make_ops: Any) -> tuple[list[Any], list[Any]]:
    """The answers to the same multi sent by kazoo and by us, each from the same state."""
    theirs = kazoo.transaction()
    theirs.operations = make_ops()
    their_answer = theirs.commit()
    undo = make_ops(undo=True)
    if undo:
        request = kazoo.transaction()
        request.operations = undo
        request.commit()
    encoder = MultiEncoder(kazoo.default_acl or OPEN_ACL_UNSAFE)
    our_answer = send_multi(kazoo, encoded(encoder, make_ops())).get(timeout=10)
    return results_of(their_answer), results_of(our_answer)


def test_an_applied_multi_is_answered_as_kazoo_answers_it(client: tuple[KazooClient, str]) -> None:
    kazoo, root = client

    def ops(undo: bool = False) -> list[Any]:
        if undo:  # /b gone again, /a's value back (its version moves on to 2)
            return [Delete(f"{root}/b", -1), SetData(f"{root}/a", b"1", -1)]
        version = kazoo.exists(f"{root}/a").version
        return [
            CheckVersion(f"{root}/a", version),
            Create(f"{root}/b", b"mark", OPEN_ACL_UNSAFE, 0),
            SetData(f"{root}/a", b"2", version),
        ]

    theirs, ours = both_ways(kazoo, ops)
    assert theirs == [True, f"{root}/b", 1]
    assert ours[:2] == theirs[:2] and ours[2] == 3  # the undo's set moved the version on
    assert kazoo.get(f"{root}/b")[0] == b"mark"


def test_a_refused_multi_is_answered_as_kazoo_answers_it(client: tuple[KazooClient, str]) -> None:
    kazoo, root = client

    def ops(undo: bool = False) -> list[Any]:
        if undo:
            return []
        return [
            Create(f"{root}/c", b"", OPEN_ACL_UNSAFE, 0),
            CheckVersion(f"{root}/a", 99),  # fails: the server rolls the create back
            Delete(f"{root}/missing", -1),
        ]

    theirs, ours = both_ways(kazoo, ops)
    assert theirs == ["RolledBackError", "BadVersionError", "RuntimeInconsistency"]
    assert ours == theirs
    assert kazoo.exists(f"{root}/c") is None


def test_a_multi_read_answers_each_read_as_kazoos_own_read(client: tuple[KazooClient, str]) -> None:
    kazoo, root = client
    kazoo.create(f"{root}/a/x", b"")
    kazoo.create(f"{root}/a/y", "\u00e9".encode(), ephemeral=True)
    kazoo.set(f"{root}/a", b"2")
    ops = [
        get_data(f"{root}/a"),
        get_children(f"{root}/a"),
        get_data(f"{root}/missing"),  # answered on its own: the others still are
        get_children(f"{root}/missing"),
        get_data(f"{root}/a/x"),
        get_data(f"{root}/a/y"),
    ]
    answer = send_multi_read(kazoo, ops).get(timeout=10)
    assert len(answer) == len(ops)
    for read, (value, stat) in [(0, kazoo.get(f"{root}/a")), (4, kazoo.get(f"{root}/a/x")), (5, kazoo.get(f"{root}/a/y"))]:
        assert answer[read] == (value or b"", stat)
    assert sorted(answer[1]) == sorted(kazoo.get_children(f"{root}/a")) == ["x", "y"]
    assert isinstance(answer[2], NoNodeError) and isinstance(answer[3], NoNodeError)
    assert answer[5][1].ephemeralOwner == kazoo.client_id[0]


def test_a_multi_reads_zxid_is_its_own_answers(client: tuple[KazooClient, str], zk_server: Any) -> None:
    """The zxid a multiRead's answers carry is their header's: it covers a change another
    client made after this one's last answer, which the zxid this client had seen before
    the read does not (a watch armed relative to that one reports the change again)."""
    kazoo, root = client
    seen_before = kazoo.last_zxid
    other = KazooClient(hosts=zk_server.address)
    other.start(timeout=30)
    try:
        changed = other.set(f"{root}/a", b"changed")
    finally:
        other.stop()
        other.close()
    assert kazoo.last_zxid == seen_before < changed.mzxid
    answer = send_multi_read(kazoo, [get_data(f"{root}/a")]).get(timeout=10)
    assert answer[0] == (b"changed", changed)
    assert answer.zxid >= changed.mzxid
