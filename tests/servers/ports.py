"""Free TCP ports on loopback for the servers and proxies the tests start.

Invariants:
- a port handed out once in this process is never handed out again, so two servers
  started in one session cannot be given the same port even before either binds;
- under pytest-xdist, worker ``i`` of ``n`` is handed only ports ``p`` with
  ``(p >> 1) % n == i``: a port is free when asked for and bound only later, so two
  workers asking at the same moment could otherwise both be given it. (Not ``p % n``:
  Linux gives ``bind`` to port 0 odd ports, keeping even ones for outgoing connections.)
"""

from __future__ import annotations

import os
import socket
import threading

__all__ = ["LOOPBACK", "free_port", "free_ports"]

LOOPBACK = "127.0.0.1"

_given: set[int] = set()
_lock = threading.Lock()


def _share() -> tuple[int, int]:
    """This process's residue and modulus of port numbers: (0, 1) outside pytest-xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ...
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.startswith("gw") or count < 2:
        return 0, 1
    return int(worker[2:]) % count, count


def free_port() -> int:
    """A loopback port nothing listens on now, that this process never handed out, and
    that no other test worker is handed (see the module invariants)."""
    residue, modulus = _share()
    with _lock:
        for _ in range(100 * modulus):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((LOOPBACK, 0))
                port: int = sock.getsockname()[1]
            if (port >> 1) % modulus == residue and port not in _given:
                _given.add(port)
                return port
    raise RuntimeError(f"no free loopback port found in {100 * modulus} tries")


def free_ports(count: int) -> list[int]:
    return [free_port() for _ in range(count)]
