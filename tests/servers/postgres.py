"""A real PostgreSQL server from Debian's packages for the test session.

PostgreSQL refuses to run as root, so when the tests run as root ``initdb`` and
``postgres`` run as the ``postgres`` system user (``setpriv``), in a temporary directory
that user owns, on a free loopback port, with the unix socket in that directory. Each
test gets a fresh database of its own (``fresh_database``).

Invariant: the server and its data directory live and die with the test session; it is
stopped with a fast shutdown (SIGINT), which does not wait for clients to disconnect.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import uuid
from pathlib import Path

from tests.servers.ports import LOOPBACK, free_port
from tests.servers.process import ServerProcess

__all__ = ["PG_ENV", "PostgresServer", "fresh_database", "postgres_available", "postgres_bin"]

#: ``postgresql://user:password@host:port/db`` of a running server to use instead
PG_ENV = "SHARDJOB_TEST_PG"


def postgres_bin() -> Path | None:
    """The newest installed PostgreSQL's bin directory (Debian: /usr/lib/postgresql/N/bin)."""
    found = sorted(
        (Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin") if (Path(p) / "postgres").exists()),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    return found[-1] if found else None


def postgres_available() -> str | None:
    """None when PostgreSQL can be started here, else what is missing."""
    if postgres_bin() is None:
        return "no /usr/lib/postgresql/*/bin/postgres (apt-get install postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and no 'postgres' user to run the server as"
        if shutil.which("setpriv") is None:
            return "running as root and no 'setpriv' to drop to the postgres user"
    return None


def _as_postgres(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv
    # --pdeathsig again after the uid change: changing credentials clears the one set before
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--pdeathsig", "KILL", "--", *argv]


class PostgresServer(ServerProcess):
    start_timeout = 60.0

    def __init__(self, workdir: Path) -> None:
        # the pytest temp dir is 0700 root's: the server's own dir is elsewhere, its owner's
        self.home = Path(tempfile.mkdtemp(prefix="shardjob-pg-"))
        if os.geteuid() == 0:
            entry = pwd.getpwnam("postgres")
            os.chown(self.home, entry.pw_uid, entry.pw_gid)
        super().__init__(self.home, "postgres")
        self.data = self.home / "data"
        self.port = free_port()
        self.bin = postgres_bin() or Path("/nonexistent")
        self._initialised = False

    @property
    def url(self) -> str:
        return f"postgresql://postgres@{LOOPBACK}:{self.port}/postgres"

    def _prepare(self) -> None:
        if self._initialised:
            return
        result = subprocess.run(
            _as_postgres(
                [str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"]
            ),
            cwd=self.home,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        if result.returncode != 0:
            raise RuntimeError(f"initdb failed: {result.stdout}\n{result.stderr}")
        self._initialised = True

    def _take_fresh_ports(self) -> bool:
        self.port = free_port()
        return True

    def _argv(self) -> list[str]:
        return _as_postgres(
            [
                str(self.bin / "postgres"),
                "-D", str(self.data),
                "-p", str(self.port),
                "-h", LOOPBACK,
                "-k", str(self.home),
                "-c", "fsync=off",
                "-c", "full_page_writes=off",
                "-c", "synchronous_commit=off",
            ]
        )  # fmt: skip

    def _check_ready(self, remaining: float) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.url, connect_timeout=max(1, int(min(remaining, 3)))) as conn:
                conn.execute("select 1")
            return True
        except psycopg.OperationalError:
            return False

    def stop(self, timeout: float = 15.0) -> None:
        """Fast shutdown (SIGINT): open client connections do not hold it up."""
        self._signal_and_wait(signal.SIGINT, timeout)

    def remove(self) -> None:
        shutil.rmtree(self.home, ignore_errors=True)


def fresh_database(server_url: str) -> str:
    """Create an empty database on the server at ``server_url``; its URL."""
    import psycopg

    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(server_url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = server_url.rpartition("/")
    return f"{base}/{name}"
