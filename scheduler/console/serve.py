"""Serving the console: ``shardjob console`` (blocking, until SIGINT/SIGTERM) and
``BackgroundConsole`` (uvicorn in a thread, for tests and benchmarks).

Invariants: the console listens on loopback unless told otherwise (a warning names the
exposure when it is not); the registry is named only by its masked URL; the admin password
is read once, hashed, and dropped (``auth.load_password``).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import threading
import time
from collections.abc import Callable

import registry
from scheduler.console import INSTALL_HINT, ConsoleUnavailable, require_console_extra
from scheduler.console.auth import PASSWORD_ENV, load_password

__all__ = ["DEFAULT_LISTEN", "BackgroundConsole", "add_console_command", "parse_listen", "run_console", "start_side_console"]

log = logging.getLogger(__name__)

#: loopback unless told otherwise (pinned)
DEFAULT_LISTEN = "127.0.0.1:8080"
#: the environment variable read when ``--registry`` is not given (as the other commands)
REGISTRY_ENV = "SHARDJOB_REGISTRY"


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8080`` for IPv6) -> ``(host, port)``; ``ValueError`` naming it."""
    host, sep, port_text = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host:
        raise ValueError(f"--listen {text!r}: expected HOST:PORT such as {DEFAULT_LISTEN}")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"--listen {text!r}: the port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"--listen {text!r}: the port must be 0-65535")
    return host, port


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def add_console_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    console = commands.add_parser(
        "console",
        help="serve the web console: jobs, servers, history, and actions behind a login",
        description="Serve the web console (needs the console extra: " + INSTALL_HINT + "). Pages are open "
        f"to guests unless --login-required; actions need the admin, whose password comes from ${PASSWORD_ENV} "
        "or --password-file (without either the console is read-only).",
    )
    console.add_argument("--registry", metavar="URL", help=f"zk://... or etcd://... (default: ${REGISTRY_ENV})")
    console.add_argument("--history", metavar="DB_URL", help="the run history: sqlite:///path or postgresql://...")
    console.add_argument(
        "--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT", help=f"where to listen (default {DEFAULT_LISTEN})"
    )
    console.add_argument("--login-required", action="store_true", help="close the read-only pages and API to guests")
    console.add_argument("--password-file", metavar="PATH", help=f"the admin password (first line) instead of ${PASSWORD_ENV}")
    console.add_argument(
        "--refresh", type=float, default=2.0, metavar="SECONDS", help="how often pages refresh themselves (2)"
    )
    console.add_argument(
        "--secure-cookies", action="store_true", help="mark the session cookie Secure (behind an HTTPS proxy)"
    )


def run_console(args: argparse.Namespace) -> int:
    """``shardjob console``: serve until interrupted."""
    require_console_extra()
    import uvicorn

    from scheduler.console.app import Console

    url = args.registry or os.environ.get(REGISTRY_ENV, "").strip()
    if not url:
        raise ValueError(f"no registry: give --registry URL or set {REGISTRY_ENV}")
    host, port = parse_listen(args.listen)
    if args.refresh <= 0:
        raise ValueError(f"--refresh must be > 0, got {args.refresh}")
    password = load_password(args.password_file)
    label = registry.parse_url(url).masked()
    if password is None:
        log.warning("console: no admin password (%s or --password-file): read-only", PASSWORD_ENV)
    if not _is_loopback(host):
        log.warning("console: listening on %s, not loopback: put it behind TLS (docs/console.md)", host)
    reg = registry.connect(url)
    console = Console(
        reg,
        registry_label=label,
        password=password,
        history_url=args.history,
        login_required=args.login_required,
        refresh_seconds=args.refresh,
        secure_cookies=args.secure_cookies,
    )
    print(f"shardjob console on http://{args.listen}/ over {label}", flush=True)
    try:
        uvicorn.run(console.app, host=host, port=port, log_level="warning", access_log=False)
    finally:
        console.close()
        reg.close()
    return 0


class BackgroundConsole:
    """uvicorn serving ``app`` in a daemon thread on ``host`` (port 0: a free one)."""

    def __init__(self, app: object, host: str = "127.0.0.1", port: int = 0) -> None:
        try:
            import uvicorn
        except ImportError:
            raise ConsoleUnavailable(f"the console needs uvicorn: {INSTALL_HINT}") from None
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off")  # type: ignore[arg-type]
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="console-http", daemon=True)
        self._host = host

    def start(self, timeout: float = 15.0) -> BackgroundConsole:
        """Start serving; returns once the socket listens."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        idle = threading.Event()
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the console did not start within {timeout:g}s")
            idle.wait(0.02)  # the polling interval of a bounded wait
        return self

    @property
    def url(self) -> str:
        sockets = self._server.servers[0].sockets
        port = sockets[0].getsockname()[1]
        return f"http://{self._host}:{port}"

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)


def start_side_console(url: str, listen: str, history_url: str | None = None) -> Callable[[], None]:
    """A console over registry ``url`` served in a thread of THIS process (what ``shardjob
    demo --console`` uses: its memory registry lives in the demo's process, where no other
    process can see it); returns the function that stops it."""
    require_console_extra()
    from scheduler.console.app import Console

    host, port = parse_listen(listen)
    reg = registry.connect(url)
    console = Console(
        reg, registry_label=registry.parse_url(url).masked(), password=load_password(None), history_url=history_url
    )
    server = BackgroundConsole(console.app, host, port).start()
    print(f"console: {server.url}/ (admin password from ${PASSWORD_ENV}; without it, read-only)", flush=True)

    def stop() -> None:
        server.stop()
        console.close()
        reg.close()

    return stop
