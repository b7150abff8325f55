"""What the ZooKeeper and etcd harnesses share: server handles, URLs, the proxy link and
the participant process.

Invariant: everything a harness hands out (links, participants) is recorded and released
by ``ServerHarness.close()``, which the ``harness`` fixture calls at teardown, so no proxy
thread or child process outlives its test.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote, urlencode

from tests.harness import Harness, Link, Participant
from tests.servers.env import parse_hosts
from tests.servers.ports import LOOPBACK, free_port
from tests.servers.proxy import TCPProxy

__all__ = ["ProcessParticipant", "ProxyLink", "ServerHandle", "ServerHarness", "build_url"]

log = logging.getLogger(__name__)
REPO_ROOT = Path(__file__).resolve().parents[2]


class ServerHandle(Protocol):
    """A started server (``tests/servers``) or an external one (``ExternalServer``)."""

    @property
    def address(self) -> str: ...

    def restart(self, downtime: float = 0.0) -> None: ...


def build_url(
    scheme: str,
    hosts: str,
    namespace: str = "",
    *,
    user: str | None = None,
    password: str | None = None,
    **options: Any,
) -> str:
    auth = ""
    if user is not None:
        auth = quote(user, safe="") + (f":{quote(password, safe='')}" if password is not None else "") + "@"
    query = urlencode({key: value for key, value in options.items() if value is not None})
    return f"{scheme}://{auth}{hosts}{namespace}{'?' + query if query else ''}"


class ProxyLink(Link):
    """One TCP proxy per server host; ``url`` names the proxies instead of the servers."""

    def __init__(self, harness: ServerHarness, address: str) -> None:
        self._harness = harness
        self._proxies = [TCPProxy(host, port) for host, port in parse_hosts(address)]

    @property
    def proxies(self) -> list[TCPProxy]:
        return list(self._proxies)

    @property
    def address(self) -> str:
        return ",".join(proxy.address for proxy in self._proxies)

    def url(self, namespace: str = "", **options: Any) -> str:
        return self._harness.url_for(self.address, namespace, **options)

    def cut(self) -> None:
        for proxy in self._proxies:
            proxy.cut()

    def restore(self) -> None:
        for proxy in self._proxies:
            proxy.restore()

    def close(self) -> None:
        for proxy in self._proxies:
            proxy.close()

    def __repr__(self) -> str:
        return f"<ProxyLink {self.address}>"


class ProcessParticipant(Participant):
    """``python -m tests.participant URL ACTION PATH`` in a child process."""

    def __init__(self, url: str, action: str, path: str, *args: str) -> None:
        self.action = action
        self.path = path
        # kept open for the child's whole life and closed by kill(); not a with-block
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.participant", url, action, path, *args],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )
        self._ready = threading.Event()
        self._ended = threading.Event()
        # one reader per participant: a blocking readline must never stall the test
        threading.Thread(target=self._read, name=f"participant-{self._proc.pid}", daemon=True).start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            if line.strip() == b"ready":
                self._ready.set()
        self._ended.set()

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc.poll() is None

    def stderr_text(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace")

    def ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self._ready.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._ended.is_set():
                break
            self._ready.wait(min(0.05, remaining))
        if not self._ready.is_set():
            log.warning(
                "participant %s %s not ready (exit code %s); stderr:\n%s",
                self.action, self.path, self._proc.poll(), self.stderr_text()[-4000:],
            )  # fmt: skip
        return self._ready.is_set()

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
        self._proc.wait(15.0)
        self._close_pipes()

    def stop(self, timeout: float = 15.0) -> None:
        if self._proc.poll() is None and self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("participant %s did not exit on stdin close; killing it", self.pid)
        self.kill()

    def _close_pipes(self) -> None:
        for pipe in (self._proc.stdin, self._proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        self._stderr.close()

    def __repr__(self) -> str:
        return f"<ProcessParticipant pid={self.pid} {self.action} {self.path}>"


class ServerHarness(Harness):
    """A harness in front of a real server: links are proxies, participants processes."""

    scheme: str
    min_session_timeout = 2.0

    def __init__(self, server: ServerHandle) -> None:
        super().__init__()
        self.server = server
        self._links: list[ProxyLink] = []
        self._participants: list[ProcessParticipant] = []

    def url_for(self, hosts: str, namespace: str = "", **options: Any) -> str:
        """A URL for ``hosts`` (the server's, or a link's) with this server's credentials."""
        return build_url(self.scheme, hosts, namespace, **options)

    def url(self, namespace: str = "", **options: Any) -> str:
        return self.url_for(self.server.address, namespace, **options)

    def unreachable_url(self, **options: Any) -> str:
        return self.url_for(f"{LOOPBACK}:{free_port()}", self.fresh_namespace(), **options)

    def restart_server(self, downtime: float = 0.0) -> None:
        self.server.restart(downtime)

    def link(self) -> ProxyLink:
        link = ProxyLink(self, self.server.address)
        self._links.append(link)
        return link

    def participant(self, url: str, action: str, path: str, *args: str) -> ProcessParticipant:
        participant = ProcessParticipant(url, action, path, *args)
        self._participants.append(participant)
        return participant

    def close(self) -> None:
        """Restore links, stop participants, close clients, then close the links: a client
        closed through a working link ends its session at once, instead of retrying its
        goodbye against a cut one until its timeout."""
        for link in self._links:
            link.restore()
        while self._participants:
            self._participants.pop().stop(timeout=5.0)
        self.close_clients()
        while self._links:
            self._links.pop().close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.server!r}>"
