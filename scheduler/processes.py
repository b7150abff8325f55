"""A script job's command as a process group of its own, ended whole at its deadline.

The script starts in a new session (``start_new_session=True``), so it leads a process
group that holds whatever it starts. At the deadline the group gets SIGTERM, then, after
``grace`` seconds, SIGKILL — sent to the group whether or not the script itself is gone by
then, since a child it left behind (``sleep 60 &``) would otherwise outlive the item.

Invariants: the worker thread that runs the script is the one that watches its deadline
(it waits for the script anyway: no thread, no timer entry of its own); a script that
ended in time leaves its group alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from typing import NamedTuple

from scheduler.timeouts import Deadline

__all__ = ["GRACE_SECONDS", "ScriptResult", "run_script"]

#: seconds between SIGTERM and SIGKILL of a timed-out script's process group
GRACE_SECONDS = 2.0


class ScriptResult(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def run_script(
    argv: Sequence[str], deadline: Deadline | None, *, grace: float = GRACE_SECONDS
) -> ScriptResult:
    """Run ``argv`` to its end, or to ``deadline``: then end its whole process group."""
    with subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as process:
        if deadline is None:
            stdout, stderr = process.communicate()
            return ScriptResult(process.returncode, stdout, stderr)
        try:
            stdout, stderr = process.communicate(timeout=max(deadline.remaining(), 0.0))
        except subprocess.TimeoutExpired:
            deadline.expire()  # the timer may not have got to it yet: the item is cancelled now
            stdout, stderr = _end_group(process, grace)
        return ScriptResult(process.returncode, stdout, stderr)


def _end_group(process: subprocess.Popen[str], grace: float) -> tuple[str, str]:
    """SIGTERM to the group; up to ``grace`` seconds for the script to end and its pipes to
    close (read meanwhile: a script writing as it stops must not block on a full pipe);
    then SIGKILL to the group. The group id is the script's pid: it leads its session."""
    group = process.pid
    _signal_group(group, signal.SIGTERM)
    try:
        stdout, stderr = process.communicate(timeout=grace)
    except subprocess.TimeoutExpired:
        _signal_group(group, signal.SIGKILL)
        return process.communicate()  # keeps what the first call read
    # members that closed their copies of the pipes, or ignored SIGTERM, may live on
    _signal_group(group, signal.SIGKILL)
    return stdout, stderr


def _signal_group(group: int, signum: int) -> None:
    try:
        os.killpg(group, signum)
    except ProcessLookupError:
        pass  # the group is empty already
