"""ZooKeeper multi requests encoded by this backend, and their answers decoded, in one pass.

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

Nothing is kept per path: most paths a client writes are written once (a job's start-up
nodes), so kept encodings would cost memory per job for next to no saving.

Hazard: sending goes through ``KazooClient._call``, kazoo's private entry to its request
queue (the one ``TransactionRequest.commit_async`` uses): a kazoo release that changes it
fails every ZooKeeper transaction of the contract suite, not silently.
"""

from __future__ import annotations

import struct
from typing import Any

from kazoo.exceptions import EXCEPTIONS
from kazoo.protocol.serialization import Transaction, ZnodeStat
from kazoo.security import ACL

from registry.errors import RegistryError

__all__ = ["EncodedMulti", "MultiEncoder", "request_size", "send_multi"]

_INT = struct.Struct("!i")
_HEADER = struct.Struct("!iBi")  # op type, done flag, error: ahead of every op
_STAT = struct.Struct("!qqqqiiiqiiq")
_CREATE, _DELETE, _SET, _CHECK = 1, 2, 5, 13
_ERROR = -1
#: the header that closes a multi request
MULTI_END = _HEADER.pack(-1, 1, -1)
#: request bytes ahead of the ops: the xid and the request type
REQUEST_HEADER = 8

_CHECK_HEADER, _DELETE_HEADER = _HEADER.pack(_CHECK, 0, -1), _HEADER.pack(_DELETE, 0, -1)
_CREATE_HEADER, _SET_HEADER = _HEADER.pack(_CREATE, 0, -1), _HEADER.pack(_SET, 0, -1)
_EPHEMERAL, _PERSISTENT = _INT.pack(1), _INT.pack(0)  # a create's flags
_NONE = _INT.pack(-1)


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
        results: list[Any] = []
        unpack_header, unpack_int = _HEADER.unpack_from, _INT.unpack_from
        while True:
            op_type, done, _ = unpack_header(data, offset)
            offset += 9
            if done:
                return results
            if op_type in (_CHECK, _DELETE):
                results.append(True)
            elif op_type == _CREATE:
                (length,) = unpack_int(data, offset)
                offset += 4
                if length <= 0:  # kazoo keeps no result for an empty or absent path
                    continue
                results.append(data[offset : offset + length].decode("utf-8"))
                offset += length
            elif op_type == _SET:
                results.append(ZnodeStat._make(_STAT.unpack_from(data, offset)))
                offset += _STAT.size
            elif op_type == _ERROR:
                (code,) = unpack_int(data, offset)
                offset += 4
                results.append(EXCEPTIONS[code]())
            else:
                # not a ValueError: the server may have applied the multi, and a caller that
                # takes ValueError for "refused before sending" must not send it again
                raise RegistryError(
                    f"ZooKeeper answered a multi with op type {op_type}, which it was never sent; "
                    "whether it was applied is unknown"
                )


def request_size(operations: list[bytes]) -> int:
    """Bytes of the multi request as sent (without the 4-byte length prefix)."""
    return REQUEST_HEADER + sum(map(len, operations)) + len(MULTI_END)


def send_multi(client: Any, operations: list[bytes]) -> Any:
    """Queue the multi on ``client``'s connection; kazoo's async result of its answer."""
    result = client.handler.async_result()
    client._call(EncodedMulti(operations), result)
    return result
