"""The limit of a server as its raw client reaches it: writes per second in batched
transactions (kazoo's ``multi``, pyetcd's txn) of ``batch`` puts each, from ``threads``
threads sharing one client, for ``seconds``. Our figures on the same server in the same
run are read against it: what any scheduler on that server could at best write.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from benchmarks.common import first_host

__all__ = ["raw_batched_writes"]

_VALUE = b"x" * 100


def raw_batched_writes(backend: str, address: str, *, seconds: float = 3.0, batch: int = 40, threads: int = 8) -> float:
    """Writes applied per second (each op of a transaction counts one)."""
    commit, close = _kazoo(address, batch) if backend == "zookeeper" else _pyetcd(address, batch)
    done = 0
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def loop(worker: int) -> None:
        nonlocal done
        round_ = 0
        while time.monotonic() < deadline:
            commit(worker, round_)
            round_ += 1
            with lock:
                done += batch

    began = time.monotonic()
    pool = [threading.Thread(target=loop, args=(n,), daemon=True) for n in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    elapsed = time.monotonic() - began
    close()
    return done / elapsed


def _kazoo(address: str, batch: int) -> tuple[Callable[[int, int], None], Callable[[], None]]:
    from kazoo.client import KazooClient

    client = KazooClient(hosts=address)
    client.start(timeout=10)
    root = "/bench-raw-limit"
    for worker in range(64):
        for n in range(batch):
            client.ensure_path(f"{root}/w{worker}/k{n}")

    def commit(worker: int, _: int) -> None:
        txn = client.transaction()
        for n in range(batch):
            txn.set_data(f"{root}/w{worker}/k{n}", _VALUE)
        txn.commit()

    def close() -> None:
        client.delete(root, recursive=True)
        client.stop()
        client.close()

    return commit, close


def _pyetcd(address: str, batch: int) -> tuple[Callable[[int, int], None], Callable[[], None]]:
    import pyetcd

    host, port = first_host(address)
    client = pyetcd.client(host=host, port=port, timeout=10)
    root = "/bench-raw-limit"

    def commit(worker: int, _: int) -> None:
        puts = [client.transactions.put(f"{root}/w{worker}/k{n}", _VALUE) for n in range(batch)]
        client.transaction(compare=[], success=puts, failure=[])

    def close() -> None:
        client.delete_prefix(root)
        client.close()

    return commit, close
