"""Free TCP ports on loopback for the servers and proxies the tests start.

Invariant: a port handed out once in this process is never handed out again, so two
servers started in one session cannot be given the same port even before either binds.
"""

from __future__ import annotations

import socket
import threading

__all__ = ["LOOPBACK", "free_port", "free_ports"]

LOOPBACK = "127.0.0.1"

_given: set[int] = set()
_lock = threading.Lock()


def free_port() -> int:
    """A loopback port nothing listens on now and that this process never handed out."""
    with _lock:
        for _ in range(100):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((LOOPBACK, 0))
                port: int = sock.getsockname()[1]
            if port not in _given:
                _given.add(port)
                return port
    raise RuntimeError("no free loopback port found in 100 tries")


def free_ports(count: int) -> list[int]:
    return [free_port() for _ in range(count)]
