"""Retries of a failed item within its fire (``JobConfig.retries``), on the worker thread
that ran it, with exponential backoff and random jitter (tenacity).

The retry fence: attempt N+1 starts only while this instance still owns the item — the
scheduler is not stopping, the instance is registered, no resharding is pending, and the
READY assignment in the cache has the run's epoch and still gives this instance the item.
It is checked before the backoff and again after it; the backoff itself ends early when
the fence falls (a resharding must not wait for it) or the scheduler stops.

Invariants: an item makes at most ``retries + 1`` attempts per fire, one at a time, all
under the run's one running mark; each attempt is reported to the observers (history,
metrics) with its number in ``ctx.attempt``; the error handler sees only the failure the
item ends with (the last attempt's, or the one before a fence fell).

Hazard: a backing-off item keeps its worker thread, as a running one does (its run, and
the running mark with it, last until the item is done): size ``max_workers`` for the
items that may be backing off at once.
"""

from __future__ import annotations

import logging
from typing import Protocol

import tenacity

from scheduler.context import ShardingContext
from scheduler.handlers import JobRun

__all__ = ["Attempts", "retry_item"]

log = logging.getLogger("scheduler.jobs")


class Attempts(Protocol):
    """What ``retry_item`` needs of a job's runner."""

    def run_attempt(self, run: JobRun, ctx: ShardingContext) -> Exception | None:
        """Run one attempt; the error it failed with, or None."""

    def retry_context(self, ctx: ShardingContext, attempt: int) -> ShardingContext:
        """The context of attempt number ``attempt`` (a fresh deadline, if any)."""

    def owns_item(self, run: JobRun, item: int) -> bool:
        """The retry fence (module docstring)."""

    def retry_backoff(self, run: JobRun, item: int, seconds: float) -> None:
        """Wait ``seconds``, or less once ``owns_item`` is false."""


class _Abandoned(Exception):
    """The fence fell during a backoff: no further attempt."""


class _Disowned(tenacity.stop.stop_base):
    def __init__(self, attempts: Attempts, run: JobRun, item: int) -> None:
        self._attempts, self._run, self._item = attempts, run, item

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return not self._attempts.owns_item(self._run, self._item)


def retry_item(
    attempts: Attempts,
    run: JobRun,
    ctx: ShardingContext,
    error: Exception,
    *,
    retries: int,
    backoff: float,
) -> tuple[ShardingContext, Exception | None]:
    """``ctx``'s first attempt failed with ``error``: retry it up to ``retries`` times
    while the fence holds. Returns the last attempt's context and its error (None: it
    succeeded). The n-th retry waits ``backoff * 2**(n-1)`` plus up to ``backoff`` of
    random jitter."""
    item = ctx.sharding_item
    latest, calls = ctx, 0
    last_error: Exception | None = error

    def attempt_once() -> Exception | None:
        nonlocal latest, last_error, calls
        calls += 1
        if calls == 1:
            return error  # the attempt the caller made: tenacity decides what follows it
        if not attempts.owns_item(run, item):
            raise _Abandoned
        latest = attempts.retry_context(ctx, calls)
        last_error = attempts.run_attempt(run, latest)
        return last_error

    def announce(state: tenacity.RetryCallState) -> None:
        delay = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning(
            "job %s item %d attempt %d failed (%s); retrying in %.2fs",
            ctx.job_name, item, latest.attempt, last_error, delay,
        )  # fmt: skip

    retrying = tenacity.Retrying(
        sleep=lambda seconds: attempts.retry_backoff(run, item, seconds),
        stop=tenacity.stop_after_attempt(retries + 1) | _Disowned(attempts, run, item),
        wait=tenacity.wait_exponential(multiplier=backoff) + tenacity.wait_random(0, backoff),
        retry=tenacity.retry_if_result(lambda failed: failed is not None),
        before_sleep=announce,
        retry_error_callback=lambda state: None,  # the outcome is read from last_error
    )
    try:
        retrying(attempt_once)
    except _Abandoned:
        pass
    if last_error is not None and latest.attempt <= retries:
        log.info(
            "job %s item %d: no retry after attempt %d: this instance no longer owns the item "
            "(resharding, leaving or stopping)",
            ctx.job_name, item, latest.attempt,
        )  # fmt: skip
    return latest, last_error
