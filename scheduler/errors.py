"""Errors of the scheduler layer, all under ``ShardJobError`` (``registry.errors``): a
caller's bad input (a configuration, a job target) is a ``ValueError`` instead."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from registry.errors import ShardJobError

__all__ = [
    "ClockSkewError",
    "HttpJobFailed",
    "JobExecutionError",
    "JobTimeout",
    "PoolShutDown",
    "ScriptFailed",
    "ShardJobError",
    "mask_password",
]


class ClockSkewError(ShardJobError):
    """The local clock differs from the registry's by more than max_time_diff_seconds."""


class JobExecutionError(ShardJobError):
    """An item failed and the job's error handler is THROW."""


class JobTimeout(ShardJobError):
    """An item ran past its job's ``timeout_seconds``: it was cancelled, and it fails
    with this error whatever it did after the deadline."""

    def __init__(self, job: str, item: int, timeout: float) -> None:
        super().__init__(f"job {job} item {item} ran past timeout_seconds={timeout:g} and was cancelled")
        self.job = job
        self.item = item
        self.timeout = timeout


class ScriptFailed(ShardJobError):
    """A script job's command exited with a non-zero status."""

    def __init__(self, command: list[str], status: int, stderr: str) -> None:
        tail = stderr.strip().splitlines()[-5:]
        super().__init__(
            f"script {command[0]!r} exited with status {status}" + (f": {' | '.join(tail)}" if tail else "")
        )
        self.status = status


class HttpJobFailed(ShardJobError):
    """An HTTP job's request failed: a status outside 2xx, or no response at all (the
    connection failed or a timeout ran out; ``status`` is then None).

    Invariant: neither the message nor ``url`` carries the URL's password."""

    #: at most this many characters of the response body go into the message
    BODY_CHARS = 200

    def __init__(self, method: str, url: str, *, status: int | None = None, body: str = "", reason: str = "") -> None:
        self.method = method
        self.url = mask_password(url)
        self.status = status
        if status is None:
            detail = reason
        else:
            shown = body[: self.BODY_CHARS] + ("..." if len(body) > self.BODY_CHARS else "")
            detail = f"status {status}" + (f", body {shown!r}" if shown else ", empty body")
        super().__init__(f"{method} {self.url}: {detail}")


def mask_password(url: str) -> str:
    """``url`` with the password of its user info, if any, replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user, _, host = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{user.partition(':')[0]}:***@{host}"))


class PoolShutDown(ShardJobError, RuntimeError):
    """The worker pool is shut down and takes no more work (the process is exiting)."""
