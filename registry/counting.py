"""A RegistryCenter that counts the calls made through it: the measure behind "O(1)
registry round trips per fire" (benchmarks and tests count with it, operators can too).

Every protocol call that reaches the server is one round trip here (a recursive delete or
a transaction is one call, whatever it expands to); bytes are the values sent and received.
Watches and listeners pass through uncounted as calls (they cost no request per change);
``events`` counts the watch events delivered, i.e. the notifications the server pushed (on
ZooKeeper each one also makes the backend re-arm a one-shot watch with a read).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from types import TracebackType

from registry.protocol import (
    Characteristic,
    Create,
    Event,
    EventCallback,
    ListenerCallback,
    Node,
    Op,
    RegistryCenter,
    SessionState,
    Set,
    Watch,
)

__all__ = ["CountingRegistry"]


class CountingRegistry:
    """Wraps ``inner``; ``calls`` counts per method, ``bytes_sent``/``bytes_received``."""

    def __init__(self, inner: RegistryCenter) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.bytes_sent = 0
        self.bytes_received = 0
        self.events = 0

    @property
    def inner(self) -> RegistryCenter:
        """The registry it wraps."""
        return self._inner

    # -- accounting -------------------------------------------------------------------
    def _count(self, method: str, sent: int = 0, received: int = 0) -> None:
        with self._lock:
            self.calls[method] += 1
            self.bytes_sent += sent
            self.bytes_received += received

    @property
    def round_trips(self) -> int:
        with self._lock:
            return sum(self.calls.values())

    def reset(self) -> None:
        with self._lock:
            self.calls.clear()
            self.bytes_sent = self.bytes_received = 0
            self.events = 0

    def snapshot(self) -> tuple[int, int, int]:
        """(round trips, bytes sent, bytes received) so far."""
        with self._lock:
            return sum(self.calls.values()), self.bytes_sent, self.bytes_received

    # -- protocol ---------------------------------------------------------------------
    @property
    def characteristics(self) -> frozenset[Characteristic]:
        return self._inner.characteristics

    @property
    def url(self) -> str:
        return self._inner.url

    @property
    def session_timeout(self) -> float:
        return self._inner.session_timeout

    @property
    def max_txn_ops(self) -> int:
        return self._inner.max_txn_ops

    @property
    def state(self) -> SessionState:
        return self._inner.state

    def transaction_cost(self, ops: Sequence[Op]) -> int:
        return self._inner.transaction_cost(ops)

    def get(self, path: str) -> bytes | None:
        value = self._inner.get(path)
        self._count("get", received=len(value or b""))
        return value

    def get_node(self, path: str) -> Node | None:
        node = self._inner.get_node(path)
        self._count("get_node", received=len(node.value) if node else 0)
        return node

    def exists(self, path: str) -> bool:
        self._count("exists")
        return self._inner.exists(path)

    def children(self, path: str) -> list[str]:
        names = self._inner.children(path)
        self._count("children", received=sum(len(n) for n in names))
        return names

    def read_tree(self, path: str) -> dict[str, Node]:
        tree = self._inner.read_tree(path)
        self._count("read_tree", received=sum(len(p) + len(n.value) for p, n in tree.items()))
        return tree

    def create(self, path: str, value: bytes = b"", *, ephemeral: bool = False) -> None:
        self._count("create", sent=len(value))
        self._inner.create(path, value, ephemeral=ephemeral)

    def create_sequential(self, prefix: str, value: bytes = b"", *, ephemeral: bool = False) -> str:
        self._count("create_sequential", sent=len(value))
        return self._inner.create_sequential(prefix, value, ephemeral=ephemeral)

    def put(self, path: str, value: bytes, *, ephemeral: bool = False) -> None:
        self._count("put", sent=len(value))
        self._inner.put(path, value, ephemeral=ephemeral)

    def delete(self, path: str) -> None:
        self._count("delete")
        self._inner.delete(path)

    def transaction(self, ops: Sequence[Op]) -> None:
        sent = sum(len(op.value) for op in ops if isinstance(op, (Create, Set)))
        self._count("transaction", sent=sent)
        self._inner.transaction(ops)

    def watch(
        self,
        path: str,
        callback: EventCallback,
        *,
        initial: bool = False,
        exclude: Callable[[str], bool] | None = None,
        leaves: Callable[[str], bool] | None = None,
    ) -> Watch:
        def counted(event: Event) -> None:
            with self._lock:
                self.events += 1
            callback(event)

        return self._inner.watch(path, counted, initial=initial, exclude=exclude, leaves=leaves)

    def flush_events(self, timeout: float = 5.0) -> bool:
        return self._inner.flush_events(timeout)

    def lock(self, path: str, timeout: float | None = None) -> AbstractContextManager[None]:
        from registry.recipes.lock import Lock

        return Lock(self, path).hold(timeout)

    def add_listener(self, callback: ListenerCallback) -> None:
        self._inner.add_listener(callback)

    def remove_listener(self, callback: ListenerCallback) -> None:
        self._inner.remove_listener(callback)

    def server_time(self) -> float:
        self._count("server_time")
        return self._inner.server_time()

    def close(self) -> None:
        self._inner.close()

    def __enter__(self) -> CountingRegistry:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
