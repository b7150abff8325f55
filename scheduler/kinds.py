"""The job kinds: how one item of one run executes.

simple: a callable (or an object with ``execute(ctx)``) per item. dataflow: an object with
``fetch_data(ctx) -> list`` and ``process_data(ctx, data)``; streaming repeats until a fetch
returns nothing, the scheduler stops, a resharding is pending or the item's deadline
passed. Either may be ``async def``: the item then runs on the scheduler's event loop
(``scheduler.async_loop``). script: a command line with the context appended as one JSON
argument, in a process group of its own (``scheduler.processes``); a non-zero exit status
is a failure. http: one request per item, as the job's props say (``scheduler.http_job``).
Invariant: a kind's target is checked when the job is added, before anything is written.
An item runner with a ``close()`` holds resources: ``close_item_runner`` when its job stops.
"""

from __future__ import annotations

import inspect
import logging
import shlex
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, cast

from scheduler.async_loop import AsyncLoop, is_async_callable
from scheduler.config import JobConfig, JobType
from scheduler.context import ShardingContext
from scheduler.errors import ScriptFailed
from scheduler.http_job import HttpItemRunner, check_http_props
from scheduler.processes import run_script as run_process_group
from scheduler.timeouts import Deadline

__all__ = ["ItemRunner", "ScriptFailed", "close_item_runner", "make_item_runner"]

log = logging.getLogger("scheduler.jobs")

KeepGoing = Callable[[], bool]
ItemRunner = Callable[[ShardingContext, KeepGoing], None]


class SimpleJob(Protocol):
    """A simple job: called once per local item."""

    def __call__(self, ctx: ShardingContext, /) -> object: ...


class SimpleJobObject(Protocol):
    """A simple job as an object (ElasticJob's ``SimpleJob.execute``)."""

    def execute(self, ctx: ShardingContext, /) -> object: ...


class DataflowJob(Protocol):
    """A dataflow job: fetch, then process what was fetched (again while streaming)."""

    def fetch_data(self, ctx: ShardingContext, /) -> list[Any]: ...

    def process_data(self, ctx: ShardingContext, data: list[Any], /) -> object: ...


#: what ``add_job`` takes as the job (a script job takes none: its command is in the config)
JobTarget = SimpleJob | SimpleJobObject | DataflowJob


class _RunSimple:
    """A simple job's item runner: a slotted object per job, where a closure (its function
    object and two cells) held 210 bytes a job."""

    __slots__ = ("_fn", "_job")

    def __init__(self, fn: Callable[[ShardingContext], object], job: str) -> None:
        self._fn, self._job = fn, job

    def __call__(self, ctx: ShardingContext, keep_going: KeepGoing) -> None:
        result = self._fn(ctx)
        if inspect.iscoroutine(result):  # made, never awaited: nothing of it ran
            result.close()
            raise TypeError(
                f"job {self._job}: {self._fn!r} returned a coroutine; declare it async def "
                "(or give its async function) so that it runs on the scheduler's loop"
            )


def make_item_runner(config: JobConfig, target: JobTarget | None, *, loop: AsyncLoop | None = None) -> ItemRunner:
    """Check ``target`` against ``config.job_type`` and return how to run one item; an
    async target runs on ``loop`` (the scheduler's; without it, the runner only checks)."""
    if config.job_type is JobType.SIMPLE:
        fn = getattr(target, "execute", None) if not callable(target) else target
        if not callable(fn):
            raise ValueError(f"job {config.name}: a simple job needs a callable taking a ShardingContext")
        if is_async_callable(fn):
            run_on_loop = _on_loop(config, loop)

            def run_simple_async(ctx: ShardingContext, keep_going: KeepGoing) -> None:
                run_on_loop(cast("Coroutine[Any, Any, object]", fn(ctx)), ctx.deadline)

            return run_simple_async

        return _RunSimple(fn, config.name)
    if config.job_type is JobType.DATAFLOW:
        fetch, process = getattr(target, "fetch_data", None), getattr(target, "process_data", None)
        if not callable(fetch) or not callable(process):
            raise ValueError(
                f"job {config.name}: a dataflow job needs an object with fetch_data and process_data"
            )
        streaming = config.streaming_process
        if is_async_callable(fetch) != is_async_callable(process):
            raise ValueError(
                f"job {config.name}: fetch_data is {_kind(fetch)} but process_data is {_kind(process)}; "
                "make both async def or neither"
            )
        if is_async_callable(fetch):
            run_on_loop = _on_loop(config, loop)
            afetch: Callable[[ShardingContext], Awaitable[list[Any]]] = fetch
            aprocess: Callable[[ShardingContext, list[Any]], Awaitable[object]] = process

            async def dataflow(ctx: ShardingContext, keep_going: KeepGoing) -> None:
                while True:
                    data = await afetch(ctx)
                    if not data:
                        return
                    await aprocess(ctx, data)
                    if not streaming or ctx.cancelled or not keep_going():
                        return

            def run_dataflow_async(ctx: ShardingContext, keep_going: KeepGoing) -> None:
                run_on_loop(dataflow(ctx, keep_going), ctx.deadline)

            return run_dataflow_async

        def run_dataflow(ctx: ShardingContext, keep_going: KeepGoing) -> None:
            while True:
                data = fetch(ctx)
                if not data:
                    return
                process(ctx, data)
                if not streaming or ctx.cancelled or not keep_going():
                    return

        return run_dataflow
    if config.job_type is JobType.SCRIPT:
        if target is not None:
            raise ValueError(
                f"job {config.name}: a script job takes no function (its command is script_command_line)"
            )
        command = shlex.split(config.script_command_line)

        def run_script(ctx: ShardingContext, keep_going: KeepGoing) -> None:
            done = run_process_group([*command, ctx.to_json()], ctx.deadline)
            if done.stdout:
                log.info("job %s item %d: %s", ctx.job_name, ctx.sharding_item, done.stdout.rstrip())
            if done.returncode != 0:
                raise ScriptFailed(command, done.returncode, done.stderr)

        return run_script
    if config.job_type is JobType.HTTP:
        if target is not None:
            raise ValueError(f"job {config.name}: an HTTP job takes no function (its request is in props http.*)")
        return HttpItemRunner(check_http_props(config.props))
    raise ValueError(f"job {config.name}: unknown job_type {config.job_type!r}")


def close_item_runner(item_runner: ItemRunner) -> None:
    """Release what ``item_runner`` holds (an HTTP job's client), if anything."""
    close = getattr(item_runner, "close", None)
    if callable(close):
        close()


RunOnLoop = Callable[["Coroutine[Any, Any, object]", "Deadline | None"], object]


def _on_loop(config: JobConfig, loop: AsyncLoop | None) -> RunOnLoop:
    """How an async item runs: on ``loop``; without one (a runner made only to check its
    target, as config files are checked) running it is an error."""
    if loop is not None:
        return loop.run

    def refuse(coro: Coroutine[Any, Any, object], deadline: Deadline | None) -> object:
        coro.close()
        raise TypeError(
            f"job {config.name}: an async job runs on its scheduler's AsyncLoop; this runner was made without one"
        )

    return refuse


def _kind(fn: object) -> str:
    return "async def" if is_async_callable(fn) else "a plain function"
