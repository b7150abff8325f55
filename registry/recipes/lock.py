"""A fair distributed lock on the protocol alone (so identical on every backend).

Waiters queue as ephemeral sequential nodes under the lock path; the lowest sequence holds
the lock and every other waiter watches only its predecessor (no herd, first come first
served), as ZooKeeper's lock recipe and etcd's concurrency package do. The nodes belong to
the client's session — on etcd its one lease, kept alive by the client — so a lock is freed
when its holder closes, dies or is cut off past the session timeout, and never expires
while its holder's session lives.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from registry.errors import LockTimeout, RegistryError, SessionLostError
from registry.paths import basename, join
from registry.protocol import Event, EventKind, RegistryCenter

__all__ = ["Lock"]

_PREFIX = "lock-"


class Lock:
    """One acquisition of the lock at ``path`` by ``reg`` (not reentrant)."""

    def __init__(self, reg: RegistryCenter, path: str, identifier: bytes = b"") -> None:
        self._reg = reg
        self._path = path
        self._identifier = identifier
        self._node: str | None = None

    @property
    def held(self) -> bool:
        return self._node is not None

    def acquire(self, timeout: float | None = None) -> None:
        """Block until held; ``LockTimeout`` after ``timeout`` seconds (None: forever)."""
        if self._node is not None:
            raise RegistryError(f"lock {self._path} already held by this Lock object")
        deadline = None if timeout is None else time.monotonic() + timeout
        node = self._reg.create_sequential(join(self._path, _PREFIX), self._identifier, ephemeral=True)
        try:
            self._wait_turn(node, deadline)
        except BaseException:
            self._delete_quietly(node)
            raise
        self._node = node

    def _wait_turn(self, node: str, deadline: float | None) -> None:
        mine = basename(node)
        while True:
            queue = sorted(name for name in self._reg.children(self._path) if name.startswith(_PREFIX))
            if mine not in queue:
                raise SessionLostError(f"lock {self._path}: our queue entry vanished (session expired)")
            position = queue.index(mine)
            if position == 0:
                return
            predecessor = join(self._path, queue[position - 1])
            gone = threading.Event()

            def on_event(event: Event, predecessor: str = predecessor, gone: threading.Event = gone) -> None:
                if event.kind is EventKind.DELETED and event.path == predecessor:
                    gone.set()

            watch = self._reg.watch(predecessor, on_event)
            try:
                if not self._reg.exists(predecessor):
                    continue
                remaining = None if deadline is None else deadline - time.monotonic()
                if (remaining is not None and remaining <= 0) or not gone.wait(remaining):
                    raise LockTimeout(f"lock {self._path} not acquired within the timeout")
            finally:
                watch.cancel()

    def release(self) -> None:
        node, self._node = self._node, None
        if node is not None:
            self._reg.delete(node)

    def _delete_quietly(self, node: str) -> None:
        try:
            self._reg.delete(node)
        except RegistryError:
            pass  # our session's end removes it anyway

    @contextmanager
    def hold(self, timeout: float | None = None) -> Iterator[None]:
        self.acquire(timeout)
        try:
            yield
        finally:
            self.release()
