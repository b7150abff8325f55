"""pyetcd's watch stream, made abortable.

pyetcd's ``Watcher`` multiplexes every watch of a client on one gRPC stream and calls
each watch's callback on its stream thread. Two changes make it fit for supervision:

- the gRPC call is kept, so ``abort()`` really ends the stream and its thread (pyetcd's
  ``close()`` only half-closes: etcd keeps sending, the thread lives until the channel
  closes). A stream whose token expired must be replaced, and without this every
  replacement would leak a thread;
- the request queue is unbounded (pyetcd bounds it to 10 entries; once a stream has died
  nobody drains it until the next stream starts, and the eleventh cancel blocks forever);
- a callback gets etcd's ``WatchResponse`` itself, its events etcd's ``mvccpb.Event``
  (``type``, ``kv``): pyetcd wraps each event in an object found through the enum's
  descriptor and reads each field through ``__getattr__``, about ten times the cost of
  reading the fields; a start delivers every node of every job to each process.

Invariant: at most one stream thread per ``WatchStream``; after ``abort()`` none.
The callbacks still run on the stream thread: they must only enqueue (re-subscribing
from there raises "cannot join current thread").
"""

from __future__ import annotations

import queue
from typing import Any

import grpc
from pyetcd import etcdrpc
from pyetcd import exceptions as etcd_exc
from pyetcd import watch as pyetcd_watch

__all__ = ["WatchStream"]


class WatchStream(pyetcd_watch.Watcher):  # type: ignore[misc]
    """One watch stream on ``channel``, authenticated with ``metadata``."""

    # set by pyetcd's Watcher.__init__; declared for the type checker
    _stopping: bool
    _callbacks: dict[int, Any]
    _new_watch: Any
    _new_watch_cond: Any

    def __init__(self, channel: grpc.Channel, timeout: float, metadata: Any, token_generation: int) -> None:
        super().__init__(
            etcdrpc.WatchStub(channel), timeout=timeout, call_credentials=None, metadata=metadata
        )
        self._request_queue: queue.Queue[Any] = queue.Queue()
        self._call: Any = None
        self._aborted = False
        #: the auth token generation this stream's metadata belongs to
        self.token_generation = token_generation

    def _run(self) -> None:
        # pyetcd's _run, keeping the call object and with an unbounded request queue
        callback_err: BaseException | None = None
        try:
            call = self._watch_stub.Watch(
                pyetcd_watch._new_request_iter(self._request_queue),
                credentials=self._credentials,
                metadata=self._metadata,
            )
            with self._lock:
                self._call = call
                aborted = self._aborted
            if aborted:
                call.cancel()
            for response in call:
                self._handle_response(response)
        except grpc.RpcError as err:
            callback_err = err
        except ValueError as err:  # the channel was closed under us
            callback_err = err
        finally:
            with self._lock:
                self._stopping = True
                self._call = None
                if self._new_watch:
                    self._new_watch.err = callback_err
                    self._new_watch_cond.notify_all()
                callbacks = self._callbacks
                self._callbacks = {}
                self._request_queue.put(None)
                self._request_queue = queue.Queue()
            for callback in callbacks.values():
                pyetcd_watch._safe_callback(callback, callback_err)

    def _handle_response(self, rs: Any) -> None:
        # pyetcd's _handle_response, but the callback gets ``rs`` unwrapped (docstring)
        with self._lock:
            if rs.created:
                if not self._new_watch:  # the new watch's request already timed out
                    self._cancel_no_lock(rs.watch_id)
                    return
                if rs.compact_revision != 0:
                    self._new_watch.err = etcd_exc.RevisionCompactedError(rs.compact_revision)
                    return
                self._callbacks[rs.watch_id] = self._new_watch.callback
                self._new_watch.id = rs.watch_id
                self._new_watch_cond.notify_all()
            callback = self._callbacks.get(rs.watch_id)
        if not callback:
            return  # left over from a cancelled watch
        if rs.compact_revision != 0:
            pyetcd_watch._safe_callback(callback, etcd_exc.RevisionCompactedError(rs.compact_revision))
            self.cancel(rs.watch_id)
            return
        # with no events too, so as not to drop a progress notification
        if rs.events or not (rs.created or rs.canceled):
            pyetcd_watch._safe_callback(callback, rs)

    def add_callback(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            if self._aborted:
                raise RuntimeError("watch stream aborted")
        return super().add_callback(*args, **kwargs)

    def forget(self, watch_id: int) -> None:
        """Drop a callback the server never registered (a refused watch has id -1)."""
        with self._lock:
            self._callbacks.pop(watch_id, None)

    def abort(self, join_timeout: float = 2.0) -> None:
        """End the stream and its thread; callbacks get the cancellation error."""
        with self._lock:
            self._aborted = True
            call = self._call
            thread = self._callback_thread
            self._request_queue.put(None)
        if call is not None:
            call.cancel()
        if thread is not None and thread.is_alive():
            thread.join(join_timeout)
