"""ZooKeeper multi requests encoded by this backend, and their answers decoded, in one pass;
and ZooKeeper 3.6's ``multiRead``, many reads in one request, which kazoo does not offer.

kazoo encodes a multi op by op at every send (a header named tuple, the path, the version,
the ACL of a create: a dozen small ``bytes`` concatenated each), on its connection thread,
and decodes the answer op by op into named tuples. A group commit of a thousand fires a
second spent most of that thread's time there. ``MultiEncoder`` writes each op's bytes
with its header in a few ``struct`` packs, the client's ACL encoded once; ``EncodedMulti``
sends the joined bytes as kazoo's own ``Transaction`` (same request type, same answer) and
decodes the answer in one loop.

Invariants:

- the bytes are exactly kazoo's (``tests/registry/test_zookeeper_wire.py`` compares
  them op type by op type), so the request's length is known before it is sent, exactly,
  for the ``jute.maxbuffer`` check;
- the decoded answer equals ``Transaction.deserialize``'s: per op ``True`` (check,
  delete), the created path (create), a ``ZnodeStat`` (set), or the op's exception
  instance when the server refused the multi; an op type this module never sends fails
  the request (kazoo hands the error to its caller) rather than misreading what follows.

A ``multiRead`` (``EncodedMultiRead``) carries data and children reads (``get_data``,
``get_children``, no watch: a multiRead arms none) and is answered op by op, each read on
its own: a node missing is that op's ``NoNodeError`` instance, the others are answered.
A whole-namespace read of 10,000 jobs (130,000 nodes) took two requests per node; in
multiReads it takes a few hundred.

Nothing is kept per path: most paths a client writes are written once (a job's start-up
nodes), so kept encodings would cost memory per job for next to no saving.

Hazard: sending goes through ``KazooClient._call``, kazoo's private entry to its request
queue (the one ``TransactionRequest.commit_async`` uses): a kazoo release that changes it
fails every ZooKeeper transaction of the contract suite, not silently.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import EXCEPTIONS
from kazoo.protocol.serialization import Transaction, ZnodeStat
from kazoo.security import ACL

from registry.errors import RegistryError

__all__ = [
    "EncodedMulti",
    "EncodedMultiRead",
    "MultiEncoder",
    "ReadAnswers",
    "decode_read_answers",
    "get_children",
    "get_data",
    "request_size",
    "send_multi",
    "send_multi_read",
]

_INT = struct.Struct("!i")
_HEADER = struct.Struct("!iBi")  # op type, done flag, error: ahead of every op
_STAT = struct.Struct("!qqqqiiiqiiq")
_CREATE, _DELETE, _SET, _CHECK = 1, 2, 5, 13
_GET_DATA, _GET_CHILDREN = 4, 8
_MULTI_READ = 22  # the request type of ZooKeeper 3.6's multiRead
_ERROR = -1
#: the header that closes a multi request
MULTI_END = _HEADER.pack(-1, 1, -1)
#: request bytes ahead of the ops: the xid and the request type
REQUEST_HEADER = 8

_CHECK_HEADER, _DELETE_HEADER = _HEADER.pack(_CHECK, 0, -1), _HEADER.pack(_DELETE, 0, -1)
_CREATE_HEADER, _SET_HEADER = _HEADER.pack(_CREATE, 0, -1), _HEADER.pack(_SET, 0, -1)
_EPHEMERAL, _PERSISTENT = _INT.pack(1), _INT.pack(0)  # a create's flags
_NONE = _INT.pack(-1)
_GET_DATA_HEADER, _GET_CHILDREN_HEADER = _HEADER.pack(_GET_DATA, 0, -1), _HEADER.pack(_GET_CHILDREN, 0, -1)
_NO_WATCH = b"\x00"


def _string(text: str) -> bytes:
    if not text:  # as kazoo's write_string: an empty string goes as none (length -1)
        return _NONE
    data = text.encode("utf-8")
    return _INT.pack(len(data)) + data


class MultiEncoder:
    """Each op of a multi as ZooKeeper reads it, header included; one per client (a
    create carries that client's ACL)."""

    def __init__(self, acl: list[ACL]) -> None:
        self._acl = _INT.pack(len(acl)) + b"".join(
            _INT.pack(entry.perms) + _string(entry.id.scheme) + _string(entry.id.id) for entry in acl
        )

    @staticmethod
    def check(path: str, version: int) -> bytes:
        return b"".join((_CHECK_HEADER, _string(path), _INT.pack(version)))

    @staticmethod
    def delete(path: str, version: int) -> bytes:
        return b"".join((_DELETE_HEADER, _string(path), _INT.pack(version)))

    @staticmethod
    def set(path: str, value: bytes, version: int) -> bytes:
        return b"".join((_SET_HEADER, _string(path), _INT.pack(len(value)), value, _INT.pack(version)))

    def create(self, path: str, value: bytes, ephemeral: bool) -> bytes:
        return b"".join(
            (_CREATE_HEADER, _string(path), _INT.pack(len(value)), value, self._acl, _EPHEMERAL if ephemeral else _PERSISTENT)
        )


class EncodedMulti(Transaction):  # type: ignore[misc]  # kazoo is untyped
    """kazoo's ``Transaction`` whose ``operations`` are ``MultiEncoder`` bytes."""

    __slots__ = ()

    def serialize(self) -> bytes:
        return b"".join(self.operations) + MULTI_END

    @classmethod
    def deserialize(cls, data: bytes, offset: int) -> list[Any]:
        return _answers(data, offset, _write_result)


def get_data(path: str) -> bytes:
    """A multiRead's data read of ``path``: answered ``(value, ZnodeStat)``."""
    return b"".join((_GET_DATA_HEADER, _string(path), _NO_WATCH))


def get_children(path: str) -> bytes:
    """A multiRead's children read of ``path``: answered with the child names."""
    return b"".join((_GET_CHILDREN_HEADER, _string(path), _NO_WATCH))


class ReadAnswers(list[Any]):
    """A multiRead's answers, in order, and ``zxid``: its answer's zxid."""

    zxid: int = 0


class EncodedMultiRead:
    """A ``multiRead`` of ``get_data`` and ``get_children`` bytes: one answer per op, in
    order: ``(value, ZnodeStat)`` (an absent value as ``b""``), a list of child names, or
    the op's exception instance. kazoo routes it as any request; only a multi (type 14)
    has its answer rewritten (``Transaction.unchroot``), and this one carries no path.

    The answers' ``zxid`` is the zxid of the answer's header: the last transaction the
    server had applied when it began the reads (ZooKeeper 3.6+ takes it before serving
    a read), so every change to a node after its read has a later zxid. A watch armed by
    SetWatches relative to it misses no change after the read. The trick: kazoo's
    connection thread sets ``client.last_zxid`` from each answer's header and then, on
    the same thread, calls that request's ``deserialize``, which reads it there; read
    later, another answer may have moved it past changes never seen. A kazoo that set it
    after ``deserialize``, or never, would give an older zxid: a change reported twice,
    never one lost (``tests/registry/test_zookeeper_wire.py`` pins the order)."""

    __slots__ = ("client", "operations")
    type = _MULTI_READ

    def __init__(self, operations: list[bytes], client: Any) -> None:
        self.operations = operations
        self.client = client

    def serialize(self) -> bytes:
        return b"".join(self.operations) + MULTI_END

    def deserialize(self, data: bytes, offset: int) -> ReadAnswers:
        answers = ReadAnswers(decode_read_answers(data, offset))
        answers.zxid = self.client.last_zxid
        return answers


def decode_read_answers(data: bytes, offset: int) -> list[Any]:
    """A multiRead's answers (``EncodedMultiRead``) from its answer's bytes."""
    return _answers(data, offset, _read_result)


_NO_RESULT = object()  # an op kazoo keeps no result for
_ResultReader = Callable[[int, bytes, int], tuple[Any, int]]


def _answers(data: bytes, offset: int, result_of: _ResultReader) -> list[Any]:
    """The results of a multi's (or multiRead's) answer: an op's exception instance where
    the server refused it, else what ``result_of(op type, data, offset)`` reads."""
    results: list[Any] = []
    unpack_header, unpack_int = _HEADER.unpack_from, _INT.unpack_from
    while True:
        op_type, done, _ = unpack_header(data, offset)
        offset += 9
        if done:
            return results
        if op_type == _ERROR:
            (code,) = unpack_int(data, offset)
            offset += 4
            results.append(EXCEPTIONS[code]())
            continue
        result, offset = result_of(op_type, data, offset)
        if result is not _NO_RESULT:
            results.append(result)


def _write_result(op_type: int, data: bytes, offset: int) -> tuple[Any, int]:
    if op_type in (_CHECK, _DELETE):
        return True, offset
    if op_type == _CREATE:
        (length,) = _INT.unpack_from(data, offset)
        offset += 4
        if length <= 0:  # kazoo keeps no result for an empty or absent path
            return _NO_RESULT, offset
        return data[offset : offset + length].decode("utf-8"), offset + length
    if op_type == _SET:
        return ZnodeStat._make(_STAT.unpack_from(data, offset)), offset + _STAT.size
    # not a ValueError: the server may have applied the multi, and a caller that takes
    # ValueError for "refused before sending" must not send it again
    raise RegistryError(
        f"ZooKeeper answered a multi with op type {op_type}, which it was never sent; "
        "whether it was applied is unknown"
    )


def _read_result(op_type: int, data: bytes, offset: int) -> tuple[Any, int]:
    unpack_int = _INT.unpack_from
    if op_type == _GET_DATA:
        (length,) = unpack_int(data, offset)
        offset += 4 + max(length, 0)
        value = data[offset - length : offset] if length > 0 else b""
        return (value, ZnodeStat._make(_STAT.unpack_from(data, offset))), offset + _STAT.size
    if op_type == _GET_CHILDREN:
        (count,) = unpack_int(data, offset)
        offset += 4
        names: list[str] = []
        for _ in range(max(count, 0)):
            (length,) = unpack_int(data, offset)
            offset += 4
            names.append(data[offset : offset + length].decode("utf-8"))
            offset += length
        return names, offset
    raise RegistryError(f"ZooKeeper answered a multiRead with op type {op_type}, which it was never sent")


def request_size(operations: list[bytes]) -> int:
    """Bytes of the multi request as sent (without the 4-byte length prefix)."""
    return REQUEST_HEADER + sum(map(len, operations)) + len(MULTI_END)


def send_multi(client: Any, operations: list[bytes]) -> Any:
    """Queue the multi on ``client``'s connection; kazoo's async result of its answer."""
    result = client.handler.async_result()
    client._call(EncodedMulti(operations), result)
    return result


def send_multi_read(client: Any, operations: list[bytes]) -> Any:
    """Queue the multiRead on ``client``'s connection; kazoo's async result of its
    ``ReadAnswers``."""
    result = client.handler.async_result()
    client._call(EncodedMultiRead(operations, client), result)
    return result
