"""Job listeners (before/after each run) and error handlers (LOG, THROW, IGNORE, or a
callable) — ElasticJob's, for Python.

Invariant: nothing a listener or handler does can stop the scheduler; a listener that
raises is logged and the run goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from scheduler.config import ErrorHandlerName
from scheduler.context import ShardingContext
from scheduler.errors import JobExecutionError

__all__ = ["ErrorHandler", "JobExecutionError", "JobListener", "JobRun", "resolve_error_handler"]

log = logging.getLogger("scheduler.jobs")

ErrorHandler = Callable[[ShardingContext, BaseException], None]


@dataclass
class JobRun:
    """One run of a job on one instance: the items it ran at one fire."""

    job_name: str
    instance_id: str
    fire_time: float
    epoch: int
    items: tuple[int, ...]
    failover: bool = False
    started: float = 0.0
    finished: float | None = None
    errors: dict[int, BaseException] = field(default_factory=dict)
    #: seconds after ``fire_time`` the run was due: the jitter chosen (``jitter_seconds``)
    delay: float = 0.0

    @property
    def succeeded(self) -> bool:
        return self.finished is not None and not self.errors


class JobListener:
    """Subclass and override; both are called on a worker thread, once per run."""

    def before_job(self, run: JobRun) -> None:
        """Before the run's items start."""

    def after_job(self, run: JobRun) -> None:
        """After every item of the run ended (``run.errors`` holds the failures)."""


def _log(ctx: ShardingContext, exc: BaseException) -> None:
    log.error("job %s item %d failed", ctx.job_name, ctx.sharding_item, exc_info=exc)


def _throw(ctx: ShardingContext, exc: BaseException) -> None:
    raise JobExecutionError(f"job {ctx.job_name} item {ctx.sharding_item} failed: {exc!r}") from exc


def _ignore(ctx: ShardingContext, exc: BaseException) -> None:
    """Swallowed by configuration (error_handler=IGNORE)."""


BUILTIN_HANDLERS: Mapping[ErrorHandlerName, ErrorHandler] = {
    ErrorHandlerName.LOG: _log,
    ErrorHandlerName.THROW: _throw,
    ErrorHandlerName.IGNORE: _ignore,
}


def resolve_error_handler(handler: str | ErrorHandler | None) -> ErrorHandler:
    if handler is None:
        return _log
    if callable(handler):
        return handler
    try:
        return BUILTIN_HANDLERS[ErrorHandlerName(str(handler).upper())]
    except ValueError:
        raise ValueError(
            f"error_handler {handler!r} is not one of {', '.join(h.value for h in ErrorHandlerName)} or a callable"
        ) from None
