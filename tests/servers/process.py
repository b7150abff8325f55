"""A server the test session runs as a child process, and the guard that always stops it.

Invariant: every server process started here is stopped when the test session ends, even
when it fails: fixtures stop their servers in finalizers, an ``atexit`` hook stops any
left over, and where the platform allows the child is also told to die with its parent
(``setpriv --pdeathsig``), so a killed pytest does not leave servers holding ports.
Output goes to a log file in the server's own work directory, never to the repository.

Hazard: a port from ``free_port`` is free when picked, not when the server binds it a
second later; another process (a parallel benchmark lane, an outgoing connection's
ephemeral port) may take it first. A server whose ports were picked here and that exited
on "address already in use" before it ever served is launched once more on fresh ports:
it has served nobody yet, so nobody holds its old address (callers read ``address`` once
it serves). Any other early exit is raised with the tails of all its logs.
"""

from __future__ import annotations

import abc
import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "ServerExitedError",
    "ServerProcess",
    "ServerStartError",
    "log_tail",
    "run_tool",
    "stop_all",
    "stop_together",
]

_live: weakref.WeakSet[ServerProcess] = weakref.WeakSet()
_live_lock = threading.Lock()


class ServerStartError(RuntimeError):
    """A server did not become ready in time; the message carries its logs' tails."""


class ServerExitedError(ServerStartError):
    """A server's process exited before it served."""


#: what ZooKeeper (a Java ``BindException``), etcd and PostgreSQL log when a port is taken
_PORT_TAKEN = "address already in use"


def log_tail(path: Path, lines: int = 40, *, start: int = 0) -> str:
    """The last ``lines`` lines of ``path`` from byte ``start`` on."""
    try:
        with open(path, "rb") as log:
            log.seek(start)
            text = log.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


class ServerProcess(abc.ABC):
    """One server process: ``launch`` it, wait until it serves, stop or kill it, restart.

    Subclasses give the command line (``_argv``) and the readiness check (``_check_ready``),
    which must prove the server takes writes, not merely that its port is open.
    """

    #: how long start() may take before it gives up (servers.md: well under 3 s here)
    start_timeout: float = 30.0

    def __init__(self, workdir: Path, name: str) -> None:
        self.workdir = workdir
        self.name = name
        self.log_path = workdir / f"{name}.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._served = False
        #: each log's size at the last launch: what that launch wrote starts there
        self._log_starts: dict[Path, int] = {}

    # -- what subclasses provide -------------------------------------------------------
    @abc.abstractmethod
    def _argv(self) -> list[str]: ...

    @abc.abstractmethod
    def _check_ready(self, remaining: float) -> bool:
        """One readiness probe, bounded by ``remaining`` seconds; True once it serves."""

    def _prepare(self) -> None:
        """Write configuration files before each launch; subclasses extend this."""
        self.workdir.mkdir(parents=True, exist_ok=True)

    def _logs(self) -> list[Path]:
        """Every log the server writes; subclasses add the server's own log files."""
        return [self.log_path]

    def _take_fresh_ports(self) -> bool:
        """Pick new ports if this object picked the current ones; False if the caller gave
        them (a cluster member's ports are in its peers' configuration)."""
        return False

    # -- lifecycle ---------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def launch(self) -> None:
        """Start the process without waiting for it to serve."""
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        self._prepare()
        argv = self._argv()
        if shutil.which("setpriv") and threading.current_thread() is threading.main_thread():
            # dies with the test process even when pytest itself is SIGKILLed; only from
            # the main thread, because the signal fires when the *thread* that forked exits
            argv = ["setpriv", "--pdeathsig", "KILL", "--", *argv]
        self._log_starts = {path: path.stat().st_size if path.exists() else 0 for path in self._logs()}
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                argv,
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # a Ctrl-C in the terminal goes to pytest, which then stops us in order
                start_new_session=True,
            )
        with _live_lock:
            _live.add(self)

    def wait_ready(self, timeout: float | None = None) -> None:
        """Probe until the server serves; ``ServerStartError`` with the log tail if not."""
        limit = self.start_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        relaunched = False
        while True:
            if not self.running:
                if not relaunched and self._lost_its_port() and self._take_fresh_ports():
                    relaunched = True
                    self.launch()
                    continue
                code = self._proc.returncode if self._proc is not None else None
                raise ServerExitedError(f"{self.name} exited (code {code}) before serving; {self._log_tails()}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ServerStartError(f"{self.name} not ready after {limit:g}s; {self._log_tails()}")
            if self._check_ready(remaining):
                self._served = True
                return
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    def _lost_its_port(self) -> bool:
        """True if the process, never served before, exited because a port was taken."""
        if self._served:
            return False
        return any(
            _PORT_TAKEN in log_tail(path, start=start).lower() for path, start in self._log_starts.items()
        )

    def _log_tails(self) -> str:
        """What the last launch wrote to each log, for an error message."""
        return "\n".join(
            f"log {path}:\n{log_tail(path, start=start)}" for path, start in self._log_starts.items()
        )

    def start(self, timeout: float | None = None) -> None:
        self.launch()
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.kill()
            raise

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM and wait; SIGKILL if it does not exit within ``timeout``."""
        self._signal_and_wait(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """SIGKILL: no shutdown, as if the machine died."""
        self._signal_and_wait(signal.SIGKILL, 15.0)

    def restart(self, downtime: float = 0.0) -> None:
        """Stop, stay down ``downtime`` seconds, start again with the same port and data."""
        self.stop()
        if downtime > 0:
            # the downtime is what the caller asked to simulate, not a wait for a condition
            time.sleep(downtime)
        self.start()

    def terminate(self) -> None:
        """Send SIGTERM without waiting (``stop_together`` stops many servers at once)."""
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.terminate()

    def _signal_and_wait(self, sig: signal.Signals, timeout: float) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            try:
                proc.send_signal(sig)
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(15.0)
            except ProcessLookupError:
                pass
        with _live_lock:
            _live.discard(self)

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running else "stopped"
        return f"<{type(self).__name__} {self.name} {state}>"


def stop_together(servers: Sequence[ServerProcess], timeout: float = 15.0) -> None:
    """Stop several servers in parallel: a cluster member that loses its peers one by one
    may spend seconds on leader hand-over before it exits, so all get SIGTERM first."""
    for server in servers:
        server.terminate()
    for server in servers:
        server.stop(timeout)


def stop_all() -> None:
    """Stop every server still running (the atexit and session-end safety net)."""
    with _live_lock:
        servers = list(_live)
    try:
        stop_together(servers, timeout=5.0)
    except Exception:
        for server in servers:
            server.kill()


def run_tool(
    argv: Sequence[str], *, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a helper command line (etcdctl, openssl) with a bound, capturing its output."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    return subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, env=full_env, stdin=subprocess.DEVNULL
    )


atexit.register(stop_all)
