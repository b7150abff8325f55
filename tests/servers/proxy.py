"""A TCP proxy on loopback that a test can sever: the "network cable" of the fault tests.

Invariant: after ``cut()`` returns, every connection that went through the proxy is
reset and every new one is reset on arrival (the listening port stays bound, so nobody
else can take it and ``restore()`` always gets it back); after ``restore()`` new
connections are forwarded again. Bytes are forwarded unchanged, so TLS and HTTP/2 pass.

``stall()`` is the other fault: connections are reset as by ``cut()``, but new ones are
accepted and then never answered, as by a server that accepts while it starts up or a
link that swallows packets. They stay silent after ``restore()``, until ``close()``.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

from tests.servers.ports import LOOPBACK

__all__ = ["TCPProxy"]

_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST


def _reset(sock: socket.socket) -> None:
    """Close with RST, as a severed link looks to the peer (not an orderly FIN)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    # SHUT_RD wakes a thread blocked in recv() without sending a FIN; close() then sends RST
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    with contextlib.suppress(OSError):
        sock.close()


class _Pair:
    """One proxied connection; closed once both directions ended, reset on any error."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.finished = 0


class TCPProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target``. One accept thread, two pump threads
    per live connection (tests hold only a handful of connections)."""

    def __init__(self, target_host: str, target_port: int, *, connect_timeout: float = 5.0) -> None:
        self.target = (target_host, target_port)
        self._connect_timeout = connect_timeout
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((LOOPBACK, 0))
        self._listener.listen(64)
        self.host = LOOPBACK
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: set[_Pair] = set()
        self._cut = False
        self._stalled = False
        self._silent: list[socket.socket] = []  # accepted while stalled, never answered
        self._closed = False
        self.accepted = 0  # connections forwarded so far (for tests of the proxy itself)
        #: connection attempts reset on arrival while cut: a client seen trying the link
        self.refused = 0
        self._acceptor = threading.Thread(target=self._accept_loop, name=f"proxy-{self.port}", daemon=True)
        self._acceptor.start()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def is_cut(self) -> bool:
        return self._cut

    @property
    def live_connections(self) -> int:
        with self._lock:
            return len(self._pairs)

    def cut(self) -> None:
        """Reset every connection and refuse (reset) new ones until ``restore()``."""
        with self._lock:
            self._cut = True
            pairs = list(self._pairs)
            self._pairs.clear()
        for pair in pairs:
            _reset(pair.client)
            _reset(pair.upstream)

    def stall(self) -> None:
        """Reset every connection; accept new ones and never answer them until ``restore()``."""
        with self._lock:
            self._stalled = True
        self.cut()

    @property
    def stalled(self) -> int:
        """Connections accepted and left unanswered so far."""
        with self._lock:
            return len(self._silent)

    def restore(self) -> None:
        with self._lock:
            self._cut = self._stalled = False

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.cut()
        with self._lock:
            silent, self._silent = self._silent, []
        for sock in silent:
            _reset(sock)
        # shutdown() wakes the blocked accept(); close() alone does not on Linux
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._acceptor.join(5.0)

    def __enter__(self) -> TCPProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<TCPProxy {self.address} -> {self.target[0]}:{self.target[1]}{' CUT' if self._cut else ''}>"

    # -- forwarding --------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # listener closed
            if self._closed:
                _reset(client)
                return
            if self._cut:
                with self._lock:
                    if self._stalled:
                        self._silent.append(client)
                        continue
                    self.refused += 1
                _reset(client)
                continue
            threading.Thread(
                target=self._open, args=(client,), name=f"proxy-{self.port}-conn", daemon=True
            ).start()

    def _open(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=self._connect_timeout)
            upstream.settimeout(None)
        except OSError:
            _reset(client)
            return
        for sock in (client, upstream):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pair = _Pair(client, upstream)
        with self._lock:
            if self._cut or self._closed:
                self.refused += 1
                _reset(client)
                _reset(upstream)
                return
            self._pairs.add(pair)
            self.accepted += 1
        threading.Thread(
            target=self._pump, args=(pair, client, upstream), name=f"proxy-{self.port}-up", daemon=True
        ).start()
        self._pump(pair, upstream, client)

    def _pump(self, pair: _Pair, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            # a reset on one side is passed on as a reset to the other
            with self._lock:
                self._pairs.discard(pair)
            _reset(pair.client)
            _reset(pair.upstream)
            return
        # orderly end of one direction: pass the half-close on, close when both ended
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
        with self._lock:
            pair.finished += 1
            done = pair.finished == 2
            if done:
                self._pairs.discard(pair)
        if done:
            for sock in (pair.client, pair.upstream):
                with contextlib.suppress(OSError):
                    sock.close()
