"""One timer thread for every job of a process (ElasticJob's thread-per-job design is its
most reported scaling failure: 7,000 jobs, 20,000 threads).

A heap of due times; the thread sleeps until the earliest and queues each due callback
for *drains*: tasks on an executor that run queued callbacks one after the other until
the queue is empty. Many jobs due at the same second cost one task, not one per fire —
and, above all, not several threads taking turns on the GIL for work that never waits (a
fire plans its writes and queues them for the group commit): one drain runs at a time, and
one more starts whenever a callback has held its drain for ``stall`` seconds with others
queued, up to ``max_drains``.

Fires are held back while the group commit is behind: a callback scheduled as a *fire*
(it plans registry writes and hands them on) starts only while ``backlog()`` — the writes
queued and not yet applied — is under ``max_backlog``; once held, fires start again when
the backlog is down to half of it. Hazard: left to run, a drain plans every fire of a
burst before the commits catch up (10,000 every-second jobs queue 10,000 requests, their
ops and callbacks, each second), and all of them are alive at once: memory, and young
collections that traverse and promote them. Held in the timer, a fire is two references.
Other callbacks (timeouts, retries) are never held: a stalled registry fills the backlog,
and a job's timeout must still expire. A fire held past its next due time is late like
one the timer itself was late for: its job's schedule goes on from now.

Invariants: the thread count is one, whatever the number of jobs; a callback never runs
on the timer thread itself; callbacks start in due order, except that other callbacks
pass fires held back; a slow callback holds up the others for at most ``stall`` seconds
(then another drain takes them), unless all ``max_drains`` are busy; a drain waiting for
the backlog to shrink has left, so it is never taken for a stalled one.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Executor

__all__ = ["Timer"]

log = logging.getLogger("scheduler.timer")

FireCallback = Callable[[float], None]
#: a pending entry: (due, seq, key, is a fire); seq is unique, so no key is ever compared
_Entry = tuple[float, int, Hashable, bool]

#: how often the timer thread looks at the backlog while fires are held back (s)
_HELD_POLL = 0.002


class Timer:
    def __init__(
        self,
        executor: Executor,
        name: str = "shardjob-timer",
        *,
        max_drains: int = 4,
        stall: float = 0.1,
        backlog: Callable[[], int] | None = None,
        max_backlog: int = 1_000,
    ) -> None:
        if max_drains < 1:
            raise ValueError(f"need max_drains >= 1, got {max_drains}")
        if max_backlog < 1:
            raise ValueError(f"need max_backlog >= 1, got {max_backlog}")
        self._executor = executor
        self._name = name
        self._max_drains = max_drains
        self._stall = stall
        self._backlog = backlog
        self._max_backlog = max_backlog
        self._holding = False  # fires held back until the backlog is down to half (_fires_open)
        #: pending entries, (due, seq, key, is a fire), ordered by due then seq (unique)
        self._heap: list[_Entry] = []
        #: key -> its pending entry, the same tuple object the heap holds (one tuple per
        #: job, not two); a heap entry that is not its key's entry here was cancelled or
        #: replaced. The callback is apart, in _callbacks: a tuple of numbers and a key
        #: the garbage collector stops tracking, where one holding the callback lived a
        #: second per job and reached the oldest generation every fire
        self._entries: dict[Hashable, _Entry] = {}
        self._callbacks: dict[Hashable, FireCallback] = {}
        self._seq = itertools.count()
        #: one lock, taken by every fire (schedule, drain): plain, and entered directly
        #: where nobody waits or is woken, which spares Condition's two Python-level calls
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._stopped = False
        #: due callbacks waiting for a drain, in due order, with their due times beside them:
        #: two deques, not one of (due, callback) pairs. Hazard: a pair made per fire lives
        #: through the whole burst, reaches the garbage collector's oldest generation and
        #: sets off its full collections, which pause the burst's tail
        self._ready: collections.deque[FireCallback] = collections.deque()
        self._ready_due: collections.deque[float] = collections.deque()
        #: due fires, apart: the ones ``backlog`` may hold back
        self._fires: collections.deque[FireCallback] = collections.deque()
        self._fires_due: collections.deque[float] = collections.deque()
        #: per running drain: when its current callback started (None between callbacks)
        self._drains: dict[int, float | None] = {}
        self._drain_ids = itertools.count()

    def start(self) -> None:
        with self._wake:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)

    def schedule(self, key: Hashable, due: float, callback: FireCallback, *, fire: bool = False) -> None:
        """Call ``callback(due)`` (on the executor) at wall-clock time ``due``; replaces
        any pending entry of ``key``. A ``fire`` waits, once due, while the backlog is
        over its bound (module docstring)."""
        with self._lock:
            entry = self._entries[key] = (due, next(self._seq), key, fire)
            self._callbacks[key] = callback
            heapq.heappush(self._heap, entry)
            if self._heap[0] is entry:
                self._wake.notify()

    def cancel(self, key: Hashable) -> None:
        with self._lock:
            self._entries.pop(key, None)
            self._callbacks.pop(key, None)

    def pending(self, key: Hashable) -> float | None:
        with self._lock:
            entry = self._entries.get(key)
            return None if entry is None else entry[0]

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._stopped:
                    self._pop_due()
                    wanted = self._drains_wanted()
                    if wanted:
                        break
                    timeout = self._heap[0][0] - time.time() if self._heap else None
                    if self._ready or self._fires:
                        # drains at work: look again when one could be stalled; fires
                        # held: look again soon at the backlog
                        look = _HELD_POLL if self._fires and not self._drains else self._stall
                        timeout = look if timeout is None else min(timeout, look)
                    self._wake.wait(timeout if timeout is None else max(timeout, 0.0))
                if self._stopped:
                    return
                drains = [next(self._drain_ids) for _ in range(wanted)]
                for drain in drains:
                    self._drains[drain] = None
            for drain in drains:
                try:
                    self._executor.submit(self._drain, drain)
                except RuntimeError:
                    return  # executor shut down: the scheduler is stopping

    def _drains_wanted(self) -> int:
        """How many drains to start now (lock held)."""
        if not self._ready and not (self._fires and self._fires_open()):
            return 0
        running = len(self._drains)
        if running == 0:
            return 1
        return 1 if self._any_stalled() and running < self._max_drains else 0

    def _fires_open(self) -> bool:
        """Whether due fires may start (lock held): not from the moment the backlog
        reaches its bound until it is down to half of it. Hazard: reopened at the first
        request applied, a drain would start per commit and take one fire each."""
        if self._backlog is None:
            return True
        backlog = self._backlog()
        if self._holding:
            self._holding = backlog > self._max_backlog // 2
        else:
            self._holding = backlog >= self._max_backlog
        return not self._holding

    def _any_stalled(self) -> bool:
        """A drain has been in one callback for ``stall`` seconds (lock held)."""
        now = time.monotonic()
        return any(started is not None and now - started >= self._stall for started in self._drains.values())

    def _drain(self, drain: int) -> None:
        # one lock section per callback: the one that takes it also ends the previous one
        while True:
            with self._lock:
                self._drains[drain] = None  # between callbacks: not stalled
                # A drain beyond the first was started to rescue the queue from a stalled
                # one: it leaves once none is stalled. Hazard: left running, the drains a
                # passing stall started (a full garbage collection is one) stay as long as
                # the queue is never empty, taking turns on the GIL for work that never
                # waits, which only adds to what each fire costs
                surplus = len(self._drains) > 1 and not self._any_stalled()
                ready, ready_due = self._next_queue()
                if ready is None or ready_due is None or self._stopped or surplus:
                    del self._drains[drain]
                    if self._fires:
                        self._wake.notify()  # fires held: the timer thread watches the backlog
                    return
                callback = ready.popleft()
                due = ready_due.popleft()
                self._drains[drain] = time.monotonic()
            try:
                callback(due)
            except Exception:
                log.exception("%s: a timer callback raised; the others go on", self._name)

    def _next_queue(
        self,
    ) -> tuple[collections.deque[FireCallback] | None, collections.deque[float] | None]:
        """The queue whose head starts next, in due order; fires only while the backlog is
        under its bound (lock held)."""
        fire_first = self._fires and (not self._ready or self._fires_due[0] < self._ready_due[0])
        if fire_first and self._fires_open():
            return self._fires, self._fires_due
        if self._ready:
            return self._ready, self._ready_due
        return None, None

    def _pop_due(self) -> None:
        """Move the due entries to the ready queues (lock held)."""
        now = time.time()
        while self._heap and self._heap[0][0] <= now:
            entry = heapq.heappop(self._heap)
            when, _, key, fire = entry
            if self._entries.get(key) is not entry:
                continue  # cancelled or replaced
            del self._entries[key]
            if fire:
                self._fires.append(self._callbacks.pop(key))
                self._fires_due.append(when)
            else:
                self._ready.append(self._callbacks.pop(key))
                self._ready_due.append(when)
        # drop stale heads so the sleep is computed on a live entry
        while self._heap:
            entry = self._heap[0]
            if self._entries.get(entry[2]) is entry:
                break
            heapq.heappop(self._heap)
