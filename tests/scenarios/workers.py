"""Real ``shardjob worker`` processes for the multi-process scenarios.

A :class:`Fleet` starts workers of one job (``tests.scenarios.recording_job:record``) on one
registry URL, each with its own ``--instance-id``, record file and output files in a
working directory; it waits for each to print its "running" line, stops them with SIGTERM
(the exit code is the test's to check) or SIGKILL, pauses them (SIGSTOP/SIGCONT), and
reads back every execution. A worker may be given its own registry URL (e.g. through a
severable proxy) instead of the fleet's, and its own source tree of shardjob (another
release, for a mixed fleet) instead of this checkout's.

Invariants: no worker outlives its fleet (``close()`` SIGKILLs what is left and reaps it);
every wait is bounded and fails with the worker's own output; output goes to files, never
to pipes, so a chatty worker can never block on a full pipe.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.scenarios.checks import Record
from tests.scenarios.recording_job import HOLD_ENV, INSTANCE_ENV, RECORD_FILE_ENV
from tests.waiting import wait_for

__all__ = ["EVERY_SECOND", "JOB_SPEC", "REPO_ROOT", "Fleet", "Worker", "read_records"]

REPO_ROOT = Path(__file__).resolve().parents[2]
JOB_SPEC = "tests.scenarios.recording_job:record"
EVERY_SECOND = "* * * * * ?"


def read_records(path: Path) -> list[Record]:
    """The complete lines of a record file; a torn last line (SIGKILL mid-write) is skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    complete = text.split("\n")[:-1]
    return [Record.from_json(line) for line in complete if line.strip()]


def _tail(path: Path, limit: int = 3000) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-limit:]
    except FileNotFoundError:
        return ""


class Worker:
    """One ``python -m scheduler.cli worker`` process."""

    def __init__(
        self, instance_id: str, argv: Sequence[str], workdir: Path, hold: float, code_root: Path = REPO_ROOT
    ) -> None:
        self.instance_id = instance_id
        slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in instance_id)
        self.record_file = workdir / f"{slug}.records.jsonl"
        self.stdout_file = workdir / f"{slug}.stdout"
        self.stderr_file = workdir / f"{slug}.stderr"
        env = dict(os.environ)
        env[RECORD_FILE_ENV] = str(self.record_file)
        env[INSTANCE_ENV] = instance_id
        env[HOLD_ENV] = repr(hold)
        # a worker that hangs is sent SIGABRT before SIGKILL: its threads' stacks land in stderr
        env["PYTHONFAULTHANDLER"] = "1"
        if code_root != REPO_ROOT:
            # the release in code_root comes first (the working directory is sys.path[0]);
            # the recording job is this checkout's
            env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
        with self.stdout_file.open("wb") as out, self.stderr_file.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "scheduler.cli", *argv, "--instance-id", instance_id],
                cwd=code_root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
            )
        #: when it printed "running" (set by ``wait_ready``) and when it was seen to exit
        self.ready_at: float | None = None
        self.exited_at: float | None = None
        self._sent: set[signal.Signals] = set()
        self.paused = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def describe(self) -> str:
        return (
            f"worker {self.instance_id} (pid {self.pid}, exit {self.proc.poll()})\n"
            f"--- stdout ---\n{_tail(self.stdout_file)}\n--- stderr ---\n{_tail(self.stderr_file)}"
        )

    def _is_ready(self) -> bool:
        if f"worker {self.instance_id} running" in _tail(self.stdout_file, 10_000):
            return True
        if not self.alive:
            raise AssertionError(f"exited before it was running:\n{self.describe()}")
        return False

    def wait_ready(self, timeout: float = 30.0) -> None:
        wait_for(self._is_ready, timeout, interval=0.05, message=lambda: f"not running:\n{self.describe()}")
        self.ready_at = time.time()

    def terminate(self, timeout: float = 30.0, sig: signal.Signals = signal.SIGTERM) -> int:
        """SIGTERM (or ``sig``), then wait for the exit (the graceful shutdown lets running
        items end); returns the exit code. One that does not exit in time is killed and fails."""
        if self.paused:
            self.resume()  # a stopped process would hold the signal until SIGCONT
        self.send(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.dump_stacks()
            self.kill()
            raise AssertionError(
                f"{self.instance_id}: no exit {timeout:g}s after {sig.name}:\n{self.describe()}"
            ) from None
        self.exited_at = time.time()
        return code

    def send(self, sig: signal.Signals) -> None:
        """Send ``sig`` once: a second SIGTERM reaching a worker in interpreter shutdown
        (its handler already reset to the default) would kill it with -15."""
        if self.alive and sig not in self._sent:
            self._sent.add(sig)
            self.proc.send_signal(sig)

    def dump_stacks(self, timeout: float = 5.0) -> None:
        """SIGABRT: the worker's faulthandler writes every thread's stack to its stderr
        and the process dies (for a hung worker's diagnosis)."""
        if self.alive:
            if self.paused:
                self.resume()
            self.proc.send_signal(signal.SIGABRT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass

    def pause(self) -> None:
        """SIGSTOP: every thread frozen (a GC pause, a stopped VM); the session goes on
        timing out on the server."""
        if self.alive:
            self.proc.send_signal(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        """SIGCONT after ``pause``."""
        if self.alive:
            self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def kill(self) -> None:
        """SIGKILL: no shutdown at all, the session has to time out."""
        if self.alive:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(15.0)
        if self.exited_at is None:
            self.exited_at = time.time()

    def records(self) -> list[Record]:
        return read_records(self.record_file)


class Fleet:
    """Workers of one job on one registry URL."""

    def __init__(
        self,
        url: str,
        workdir: Path,
        *,
        job: str = "job",
        cron: str = EVERY_SECOND,
        total: int = 6,
        hold: float = 0.0,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.url = url
        self.workdir = workdir
        self.job = job
        self.hold = hold
        self._cron = cron
        self._total = total
        self._extra_args = tuple(extra_args)
        self.argv = self.argv_for(url)
        self.workers: list[Worker] = []

    def argv_for(self, url: str) -> list[str]:
        """The worker command line of this fleet's job on registry ``url``."""
        return [
            "-v",
            "worker",
            "--registry",
            url,
            "--job",
            JOB_SPEC,
            "--name",
            self.job,
            "--cron",
            self._cron,
            "--total",
            str(self._total),
            "--max-workers",
            "8",
            *self._extra_args,
        ]

    def spawn(
        self, *instance_ids: str, urls: Mapping[str, str] | None = None, code_root: Path = REPO_ROOT
    ) -> list[Worker]:
        """Start one worker per id (all at once) without waiting for them; ``urls`` gives
        some of them their own registry URL (instance id -> URL); ``code_root`` is the
        shardjob source tree they run (default: this checkout)."""
        own = urls or {}
        started = [
            Worker(iid, self.argv_for(own[iid]) if iid in own else self.argv, self.workdir, self.hold, code_root)
            for iid in instance_ids
        ]
        self.workers.extend(started)
        return started

    def start(
        self,
        *instance_ids: str,
        timeout: float = 30.0,
        urls: Mapping[str, str] | None = None,
        code_root: Path = REPO_ROOT,
    ) -> list[Worker]:
        """Start one worker per id (all at once) and return when each is running."""
        started = self.spawn(*instance_ids, urls=urls, code_root=code_root)
        for worker in started:
            worker.wait_ready(timeout)
        return started

    def worker(self, instance_id: str) -> Worker:
        for worker in self.workers:
            if worker.instance_id == instance_id:
                return worker
        raise KeyError(f"no worker {instance_id!r} in this fleet")

    def alive(self) -> list[Worker]:
        return [w for w in self.workers if w.alive]

    def records(self) -> list[Record]:
        """Every execution every worker of this fleet has recorded so far."""
        return [rec for worker in self.workers for rec in worker.records()]

    def describe(self) -> str:
        return "\n".join(worker.describe() for worker in self.workers)

    def terminate_all(self, timeout: float = 30.0) -> dict[str, int]:
        """SIGTERM every live worker at once, then wait for each: instance id -> exit code."""
        live = self.alive()
        for worker in live:
            worker.send(signal.SIGTERM)
        return {worker.instance_id: worker.terminate(timeout) for worker in live}

    def close(self) -> None:
        for worker in self.workers:
            worker.kill()
