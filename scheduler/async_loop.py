"""The scheduler's one asyncio event loop, where ``async def`` jobs run.

A worker thread takes an async item as it takes any other and hands its coroutine to the
loop (``run``), then waits for it: an item's context, fencing, listeners, error handler,
history and metrics are the sync path's, and up to ``max_workers`` coroutines run on the
loop at once (one per waiting worker).

Invariants: one loop thread per scheduler, started by the first coroutine, however many
async jobs (none without one); ``stop`` runs after the scheduler's items ended, cancels
whatever is still on the loop (a shutdown that did not wait), and ends the thread; a
coroutine handed over after ``stop`` is refused with ``PoolShutDown``.

Hazard: the loop is shared by every async job of the scheduler, so a coroutine that blocks
(a sync call inside ``async def``) stalls all of them; such work belongs in a sync job.
``asyncio`` is imported by the first coroutine, not with the scheduler: a process without
async jobs does not carry its forty modules (about 5 MiB).
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from scheduler.errors import PoolShutDown
from scheduler.timeouts import Deadline

if TYPE_CHECKING:
    import asyncio

__all__ = ["AsyncLoop", "is_async_callable"]

log = logging.getLogger("scheduler.jobs")

T = TypeVar("T")

#: seconds ``stop`` gives the coroutines still running to end once cancelled
_STOP_GRACE = 5.0


def is_async_callable(fn: object) -> bool:
    """``fn`` is an ``async def`` function or method, a partial of one, or an object whose
    ``__call__`` is one."""
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 (an object's async __call__, not callable())
    return call is not None and not inspect.isfunction(fn) and inspect.iscoroutinefunction(call)


class AsyncLoop:
    def __init__(self, name: str = "shardjob-async") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def thread(self) -> threading.Thread | None:
        """The loop's thread, None until the first coroutine."""
        return self._thread

    def run(self, coro: Coroutine[Any, Any, T], deadline: Deadline | None = None) -> T:
        """Run ``coro`` on the loop and wait for its end (a worker thread). With a
        ``deadline``, its task is cancelled when the deadline passes (the runner then
        reports ``JobTimeout``)."""
        try:
            loop = self._started()
        except PoolShutDown:
            coro.close()  # never awaited: no "coroutine was never awaited" warning
            raise
        import asyncio

        return asyncio.run_coroutine_threadsafe(_guarded(coro, deadline), loop).result()

    def _started(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is not None:
            return loop
        with self._lock:
            if self._closed:
                raise PoolShutDown(f"{self._name}: the scheduler is shut down")
            if self._loop is None:
                import asyncio

                loop = asyncio.new_event_loop()
                ready = threading.Event()
                thread = threading.Thread(
                    target=self._serve, args=(loop, ready), name=self._name, daemon=True
                )
                thread.start()
                ready.wait()
                self._thread, self._loop = thread, loop
            return self._loop

    @staticmethod
    def _serve(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        import asyncio

        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        try:
            loop.run_forever()
        finally:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    def stop(self, timeout: float = _STOP_GRACE) -> None:
        """Cancel what still runs on the loop (given ``timeout`` seconds to end), stop it
        and end its thread. Idempotent; the loop is never started again."""
        with self._lock:
            self._closed = True
            loop, thread = self._loop, self._thread
            self._loop = None
        if loop is None or thread is None:
            return
        import asyncio

        try:
            asyncio.run_coroutine_threadsafe(_cancel_all(timeout), loop).result(timeout + 1.0)
        except Exception:
            log.warning(
                "%s: coroutines still running at shutdown were left behind", self._name, exc_info=True
            )
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)


async def _guarded(coro: Coroutine[Any, Any, T], deadline: Deadline | None) -> T:
    """``coro`` in a task that ``deadline`` cancels. The hook runs on the thread that
    expires the deadline, hence ``call_soon_threadsafe``; the deadline is marked expired
    before the task is cancelled, so the runner reports ``JobTimeout``, not the
    cancellation."""
    if deadline is not None:
        import asyncio

        task = asyncio.current_task()
        assert task is not None  # run_coroutine_threadsafe always makes one
        loop = asyncio.get_running_loop()
        deadline.on_expire(lambda: loop.call_soon_threadsafe(task.cancel))
    return await coro


async def _cancel_all(grace: float) -> None:
    import asyncio

    current = asyncio.current_task()
    tasks = [task for task in asyncio.all_tasks() if task is not current]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=grace)
