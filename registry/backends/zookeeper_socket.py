"""kazoo's connection thread moving its bytes in bulk: answers read from a buffer filled
by large reads, queued requests sent together in one write.

kazoo's connection thread (``ConnectionHandler.zk_loop``) handles one request per turn of
its loop. To send one it selects on the socket and writes that request alone; to read one
answer it selects and reads the answer's length, then selects and reads its body. A
thousand pipelined requests (a tree watch reading a thousand nodes one by one, as it did)
cost that thread some ten system calls per request, each a release and re-take of the
GIL, and it was the busiest thread of a ZooKeeper start-up. ``BatchedSocketIO`` keeps
kazoo's loop, framing and bookkeeping, and changes only how the bytes move:

- ``_read`` serves its bytes from a buffer that reads of up to ``READ_CHUNK`` bytes fill;
  ``_read_socket`` handles every complete answer already buffered before it returns;
- ``_send_request`` takes every wake-up byte there is and sends the queued requests, up
  to ``SEND_BATCH`` of them and about ``SEND_BYTES``, each framed with its own xid (an
  authentication with kazoo's), in queue order, in one write.

Invariants:

- no complete answer waits in the buffer: the loop's select watches the socket, not the
  buffer, so ``_read_socket`` returns only once the buffer holds less than a whole answer
  (whose rest can only come from the socket);
- the buffer belongs to one socket: after a reconnect the bytes left from the old one are
  dropped, never read as answers on the new one;
- a request is pending (in ``_pending``, in xid order) before its bytes are written
  (kazoo moves one there once its write succeeded): a write that fails leaves the batch
  there, and kazoo fails it with ``ConnectionLoss`` on the drop (its outcome unknown), as
  it fails every request still queued;
- no queued request is left without a wake-up to come. kazoo's ``_call`` queues a request
  and then writes one byte, and the loop sends only when a byte is there. A batch sends
  requests whose byte may still be on its way (a later turn then finds it and nothing, or
  others, to send: a spare turn, never a lost one); a batch that leaves requests queued
  (full, or stopped at a close) writes one byte for them, without blocking: were the
  wake-up socket full, that alone makes the loop turn again. Nothing here reads the
  wake-up socket without a byte there: it blocks, and its only reader is this thread.

Hazard: these are kazoo's private methods (``_read``, ``_read_socket``, ``_send_request``,
``_xid``, the client's ``_queue`` and ``_pending``); ``zookeeper_connect.tune_connection``
installs this class only over the exact ``ConnectionHandler`` it was written against, and
``tests/registry/test_zookeeper_socket.py`` checks the answers, a full batch, a close
behind a burst and a drop against a real server.
"""

from __future__ import annotations

import socket
import ssl
import struct
from typing import Any

from kazoo.exceptions import ConnectionDropped
from kazoo.protocol.connection import AUTH_XID, CLOSE_RESPONSE, ConnectionHandler
from kazoo.protocol.serialization import Auth, Close

__all__ = ["READ_CHUNK", "SEND_BATCH", "SEND_BYTES", "BatchedSocketIO"]

#: bytes asked of the socket per read: a few hundred small answers
READ_CHUNK = 65536
#: requests sent in one write at most (and wake-up bytes read at once)
SEND_BATCH = 512
#: a batch takes no further request once it holds this many bytes (a multi may hold 1 MiB):
#: the loop reads answers between large writes, as it does between kazoo's single ones
SEND_BYTES = 1 << 20

_INT = struct.Struct("!i")
_FRAME_HEAD = struct.Struct("!iii")  # length, xid, request type


class BatchedSocketIO(ConnectionHandler):  # type: ignore[misc]  # kazoo is untyped
    """kazoo's connection handler, with reads buffered and sends batched (module docstring)."""

    _inbox: bytearray
    _inbox_socket: Any = None
    _xid: int  # kazoo's: the last xid used on this connection

    # -- reading --------------------------------------------------------------------------
    def _buffer(self) -> bytearray:
        if self._inbox_socket is not self._socket:  # a new connection: drop the old bytes
            self._inbox_socket = self._socket
            self._inbox = bytearray()
        return self._inbox

    def _read(self, length: int, timeout: float) -> bytes:
        inbox = self._buffer()
        if len(inbox) < length:
            with self._socket_error_handling():
                while len(inbox) < length:
                    sock = self._socket
                    # an SSL socket may hold decrypted bytes its file descriptor does not show
                    buffered_by_ssl = hasattr(sock, "pending") and sock.pending() > 0
                    if not buffered_by_ssl and not self.handler.select([sock], [], [], timeout)[0]:
                        raise self.handler.timeout_exception("socket time-out during read")
                    try:
                        chunk = sock.recv(max(READ_CHUNK, length - len(inbox)))
                    except ssl.SSLError as exc:
                        if exc.errno in (ssl.SSL_ERROR_WANT_READ, ssl.SSL_ERROR_WANT_WRITE):
                            continue
                        raise
                    if not chunk:
                        raise ConnectionDropped("socket connection broken")
                    inbox += chunk
        data = bytes(inbox[:length])
        del inbox[:length]  # cheap: a bytearray drops its head by moving its start
        return data

    def _answer_buffered(self) -> bool:
        inbox = self._buffer()
        return len(inbox) >= 4 and len(inbox) >= 4 + _INT.unpack_from(inbox)[0]

    def _read_socket(self, read_timeout: float) -> Any:
        while True:
            response = super()._read_socket(read_timeout)
            if response is CLOSE_RESPONSE or not self._answer_buffered():
                return response

    # -- sending --------------------------------------------------------------------------
    def _send_request(self, read_timeout: float, connect_timeout: float) -> None:
        client = self.client
        queue = client._queue
        # Called when wake-up bytes are there, so this read does not block. They are all
        # taken: every request queued is sent below, or a byte is put back for the rest.
        self._read_sock.recv(SEND_BATCH)
        pending = client._pending
        frames: list[bytes] = []
        xid: int = self._xid
        size = 0
        while queue and len(frames) < SEND_BATCH and size < SEND_BYTES:
            request, async_object = queue[0]
            if not hasattr(request, "serialize"):  # kazoo's test hooks: it raises for them
                if frames:
                    break
                super()._send_request(read_timeout, connect_timeout)
                return
            if request.type == Auth.type:
                request_xid = AUTH_XID
            else:
                xid = request_xid = (xid % 2147483647) + 1
            body = request.serialize()
            frames.append(_FRAME_HEAD.pack(len(body) + 8, request_xid, request.type) + body)
            size += len(body) + 12
            queue.popleft()
            pending.append((request, async_object, request_xid))
            if isinstance(request, Close):
                break  # the last: the loop ends at its answer
        self._xid = xid
        if queue:
            self._wake_again()
        if frames:
            self._write(b"".join(frames), connect_timeout)

    def _wake_again(self) -> None:
        """Make the loop turn again for requests left queued, without ever blocking: a full
        wake-up socket (its reader is this thread) already guarantees that turn."""
        try:
            self._write_sock.send(b"\0", socket.MSG_DONTWAIT)
        except OSError:  # full, or closed by a client stopping: either way, no byte needed
            pass
