"""The exit codes of every ``shardjob`` command: scripts branch on them, so they do not
change meaning between releases."""

from __future__ import annotations

import enum

__all__ = ["ExitCode"]


class ExitCode(enum.IntEnum):
    #: done (a worker: stopped by SIGTERM/SIGINT after a graceful shutdown)
    OK = 0
    #: anything not listed below (a registry error, a refused change, a timeout)
    ERROR = 1
    #: bad usage or configuration: a wrong option, field or value, named in the message
    USAGE = 2
    #: the registry could not be reached
    UNREACHABLE = 3
    #: the job named is not in the registry
    NO_SUCH_JOB = 4
