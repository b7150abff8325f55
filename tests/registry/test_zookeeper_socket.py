"""The ZooKeeper client's connection thread reads answers in bulk and sends queued
requests together (``registry/backends/zookeeper_socket.py``), against a real server:
every answer reaches its own request, a burst takes a few writes instead of one per
request, a batch stops at its byte bound and the rest follows, a close goes out last, and
a connection that drops mid-burst fails what was in flight and leaves nothing of the old
socket for the new one."""

from __future__ import annotations

import contextlib
import math
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kazoo.exceptions import ConnectionLoss

import registry
from registry.backends.zookeeper import ZooKeeperRegistry
from registry.backends.zookeeper_socket import SEND_BYTES, BatchedSocketIO
from registry.protocol import SessionState
from tests.servers.proxy import TCPProxy
from tests.waiting import wait_for

_BURST = 2000


@pytest.fixture
def zk_registry(zk_server: Any) -> Iterator[ZooKeeperRegistry]:
    reg = registry.connect(f"zk://{zk_server.address}/zksocket{uuid.uuid4().hex[:10]}")
    assert isinstance(reg, ZooKeeperRegistry)
    try:
        yield reg
    finally:
        reg.close()


def _count_calls(obj: Any, name: str) -> list[int]:
    """Count calls of ``obj.name`` from now on (the instance's attribute, the method kept)."""
    calls = [0]
    method: Callable[..., Any] = getattr(obj, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return method(*args, **kwargs)

    setattr(obj, name, counted)
    return calls


def _stored(reg: ZooKeeperRegistry, path: str) -> str:
    return reg._ns.prefix + path


def test_the_client_runs_the_batched_connection(zk_registry: ZooKeeperRegistry) -> None:
    assert isinstance(zk_registry._client._connection, BatchedSocketIO)


def test_a_burst_of_reads_gets_every_answer_right(zk_registry: ZooKeeperRegistry) -> None:
    values = {f"/n{i:04d}": f"value-{i}-{'x' * (i % 97)}".encode() for i in range(_BURST)}
    for start in range(0, _BURST, 100):
        zk_registry.transaction([registry.Create(p, v) for p, v in list(values.items())[start : start + 100]])
    client = zk_registry._client
    results = [(p, client.get_async(_stored(zk_registry, p))) for p in values]
    for path, result in results:
        data, stat = result.get(timeout=30)
        assert data == values[path], path
        assert stat.version == 0


def test_a_burst_queued_within_one_turn_goes_out_in_one_write(zk_registry: ZooKeeperRegistry) -> None:
    """kazoo alone writes once per request; here the connection thread sends every request
    queued when it turns. The loop is held while the burst queues, so the count does not
    depend on how the two threads happen to be scheduled."""
    zk_registry.create("/burst", b"v")
    client = zk_registry._client
    path = _stored(zk_registry, "/burst")
    writes = _count_calls(client._connection, "_write")
    with _loop_held(client, path) as woken:
        burst = [client.get_async(path) for _ in range(200)]  # under the wake-up socket's size
    for result in [woken, *burst]:
        assert result.get(timeout=30)[0] == b"v"
    assert writes[0] == 2, writes[0]  # the request that woke the loop, then the whole burst


@contextlib.contextmanager
def _loop_held(client: Any, wake_path: str) -> Iterator[Any]:
    """Hold the connection thread at its loop's select while the body queues requests, so
    that one turn of the loop finds them all; released on leaving. Yields the answer of
    the request that woke the thread (it is sent, its answer read after the release)."""
    gate, held = threading.Event(), threading.Event()
    select = client.handler.select

    def gated_select(rlist: Any, *args: Any, **kwargs: Any) -> Any:
        if not gate.is_set() and client._connection._read_sock in rlist:  # the loop's own
            held.set()
            gate.wait(30)
        return select(rlist, *args, **kwargs)

    client.handler.select = gated_select
    try:
        # a request wakes the thread from the select it is in; sent, it comes back to the gate
        woken = client.get_async(wake_path)
        assert held.wait(30)
        yield woken
    finally:
        gate.set()
        client.handler.select = select


def test_a_close_behind_a_burst_goes_out_last_and_ends_the_thread(zk_registry: ZooKeeperRegistry) -> None:
    """A close queued behind a burst that one turn of the loop finds whole goes out after
    every request ahead of it; each of those is answered, and the connection thread ends
    at the close's answer (kazoo's ``stop()`` raises when it does not)."""
    zk_registry.create("/before-close", b"v")
    client = zk_registry._client
    path = _stored(zk_registry, "/before-close")
    stopped: list[BaseException | None] = []

    def stop() -> None:
        try:
            client.stop()  # queues the close, then waits (10 s or more) for the thread to end
            stopped.append(None)
        except BaseException as exc:  # reported by the assertion below
            stopped.append(exc)

    stopper = threading.Thread(target=stop)
    with _loop_held(client, path) as woken:
        # fewer than the wake-up socket holds (some 270 single bytes): past it, queueing blocks
        burst = [client.get_async(path) for _ in range(200)]
        stopper.start()
        wait_for(lambda: len(client._queue) == len(burst) + 1, 10, message="the close was not queued")
    stopper.join(30)
    assert stopped == [None]  # kazoo raises when its connection thread does not end
    for result in [woken, *burst]:
        assert result.get(timeout=30)[0] == b"v"


def test_a_batch_stops_at_its_byte_bound_and_the_rest_follows(zk_registry: ZooKeeperRegistry) -> None:
    """Large requests queued at once go out in several writes of about ``SEND_BYTES``, the
    loop reading answers between them; each is applied and answered."""
    count, size = 8, 400_000  # 3.2 MB: three batches
    for i in range(count):
        zk_registry.create(f"/big{i}", b"")
    client = zk_registry._client
    writes = _count_calls(client._connection, "_write")
    with _loop_held(client, _stored(zk_registry, "/big0")) as woken:
        results = [client.set_async(_stored(zk_registry, f"/big{i}"), bytes([i]) * size) for i in range(count)]
    woken.get(timeout=30)
    for result in results:
        assert result.get(timeout=30).version == 1
    batches = math.ceil(count / math.ceil(SEND_BYTES / size))  # a batch takes requests while under
    assert writes[0] >= batches, writes[0]
    for i in range(count):
        assert zk_registry.get(f"/big{i}") == bytes([i]) * size


def _cut_after_answers(connection: Any, proxy: TCPProxy, count: int) -> None:
    """Cut the link from the connection thread itself, once it has handled ``count``
    answers. A cut from the test's thread can come after the connection thread has read a
    whole burst; here that thread reads nothing more before the cut."""
    read_response: Callable[..., Any] = connection._read_response
    handled = [0]

    def cutting(*args: Any, **kwargs: Any) -> Any:
        try:
            return read_response(*args, **kwargs)
        finally:
            handled[0] += 1
            if handled[0] == count:
                connection._read_response = read_response  # the next connection reads freely
                proxy.cut()  # mid-stream: the buffer holds part of the next answer

    connection._read_response = cutting


def test_a_drop_mid_burst_fails_what_was_in_flight_and_the_next_connection_reads_clean(
    zk_server: Any,
) -> None:
    """A burst of 200 answers of 200 kB each (40 MB: more than the client's socket buffers)
    is cut once the first of them has been handled: some are answered, the rest fail, none
    is answered with another's bytes."""
    host, port = zk_server.address.rsplit(":", 1)
    with TCPProxy(host, int(port)) as proxy:
        reg = registry.connect(
            f"zk://{proxy.address}/zksocket{uuid.uuid4().hex[:10]}?session_timeout=20&connect_timeout=2"
        )
        assert isinstance(reg, ZooKeeperRegistry)
        try:
            reg.create("/big", b"y" * 200_000)  # answers of several reads each: a cut leaves halves
            client = reg._client
            path = _stored(reg, "/big")
            # the whole burst queued before any answer is read: one queued later, while the
            # client reconnects, would wait for the link instead of failing at the drop
            with _loop_held(client, path) as woken:
                burst = [client.get_async(path) for _ in range(200)]
                _cut_after_answers(client._connection, proxy, 2)  # the wake-up's, then one of the burst
            results = [woken, *burst]
            outcomes: list[str] = []
            for result in results:
                try:
                    data, _ = result.get(timeout=30)
                    outcomes.append("ok" if data == b"y" * 200_000 else "wrong")
                except ConnectionLoss:
                    outcomes.append("lost")
            assert "wrong" not in outcomes
            assert outcomes.count("ok") >= 1 and outcomes.count("lost") >= 1, outcomes  # cut mid-burst
            proxy.restore()
            wait_for(lambda: reg.state is SessionState.RECONNECTED, 20, message=lambda: str(reg.state))
            # the same session on a new socket: every answer is its request's, none a leftover
            for i in range(50):
                reg.put(f"/after{i}", str(i).encode())
            for i in range(50):
                assert reg.get(f"/after{i}") == str(i).encode()
            assert reg.get("/big") == b"y" * 200_000
        finally:
            reg.close()
