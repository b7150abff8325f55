"""etcd's KV calls take turns on channels of their own (``etcd_conn._KV_LANES``): gRPC
Python locks a whole channel while it starts or ends a call, so committers sharing one
channel queued on that lock. Each lane must reach the server, serve reads and
transactions alike, and be closed with the connection."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pyetcd import etcdrpc

from registry.backends.etcd_conn import _KV_LANES, EtcdConnection
from registry.url import parse_url


class _Counted:
    """A KV stub that counts the calls it serves, then passes them on. Callers on many
    threads: ``+=`` on a shared list is not atomic, so the count takes a lock."""

    def __init__(self, stub: Any, calls: list[int], index: int, lock: threading.Lock) -> None:
        self._stub = stub
        self._calls = calls
        self._index = index
        self._lock = lock

    def _count(self) -> None:
        with self._lock:
            self._calls[self._index] += 1

    def Txn(self, *args: Any, **kwargs: Any) -> Any:
        self._count()
        return self._stub.Txn(*args, **kwargs)

    def Range(self, *args: Any, **kwargs: Any) -> Any:
        self._count()
        return self._stub.Range(*args, **kwargs)


@pytest.fixture
def conn(etcd_server: Any) -> Iterator[EtcdConnection]:
    connection = EtcdConnection(parse_url(f"etcd://{etcd_server.address}/lanes"))
    connection.open(ttl=10)
    yield connection
    connection.close()


def _put(key: bytes, value: bytes) -> Any:
    put = etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=key, value=value))
    return etcdrpc.TxnRequest(compare=[], success=[put], failure=[])


def test_calls_from_many_threads_are_spread_over_every_lane(conn: EtcdConnection) -> None:
    calls = [0] * _KV_LANES
    lock = threading.Lock()
    conn._kv_stubs = [_Counted(stub, calls, n, lock) for n, stub in enumerate(conn._kv_stubs)]
    prefix = f"/lanes/{uuid.uuid4().hex[:8]}/".encode()
    rounds = 3
    failures: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for r in range(rounds):
                key = prefix + f"{n}-{r}".encode()
                conn.txn(_put(key, b"v"))
                assert conn.range(key).kvs[0].value == b"v"
        except BaseException as exc:  # reported below, with the lanes' counts
            failures.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(_KV_LANES)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not failures, failures
    assert sum(calls) == _KV_LANES * rounds * 2
    # turns are taken in order, so every lane served its share, whatever the threads did
    assert calls == [rounds * 2] * _KV_LANES, calls
    listed = conn.range(prefix, prefix[:-1] + b"0")
    assert len(listed.kvs) == _KV_LANES * rounds


def test_every_lane_is_closed_with_the_connection(etcd_server: Any) -> None:
    connection = EtcdConnection(parse_url(f"etcd://{etcd_server.address}/lanes"))
    connection.open(ttl=10)
    lanes = list(connection._kv_stubs)
    assert len(lanes) == _KV_LANES
    for _ in lanes:
        connection.range(b"/lanes/none")  # each lane in turn has connected
    connection.close()
    for stub in lanes:
        with pytest.raises(ValueError, match="closed channel"):
            stub.Range(etcdrpc.RangeRequest(key=b"/lanes/none"), 5)
