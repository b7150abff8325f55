"""The HTTP endpoints of one scheduler, on the standard library's threading HTTP server:

- ``/metrics``: Prometheus text exposition of the scheduler's own registry;
- ``/healthz``: 200 while the process is up and its timer thread runs (a heartbeat entry
  it fires every second is fresh), 503 otherwise;
- ``/readyz``: 200 when the registry session is connected and every job is registered
  on this instance, 503 with the reason otherwise;
- ``/dump``: this instance's cached view of its jobs as JSON.

Invariant: a request reads local state only (no registry round trip), so probes answer
while the registry is cut; the server binds loopback unless told otherwise.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scheduler.scheduler import Scheduler

__all__ = ["HttpEndpoint", "parse_address"]

log = logging.getLogger("scheduler.http")


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``:PORT`` means loopback) -> (host, port); a clear error otherwise."""
    host, sep, port = str(address).rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"HTTP address must be HOST:PORT, got {address!r}")
    return (host.strip("[]") or "127.0.0.1"), int(port)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        try:
            if path == "/metrics":
                self._metrics()
            elif path == "/healthz":
                self._healthz()
            elif path == "/readyz":
                self._readyz()
            elif path == "/dump":
                self._dump()
            else:
                self._send(404, "text/plain; charset=utf-8", b"not found: try /metrics /healthz /readyz /dump\n")
        except Exception as exc:
            log.exception("HTTP %s failed", path)
            self._send(500, "text/plain; charset=utf-8", f"error: {exc}\n".encode())

    def _send(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _metrics(self) -> None:
        from prometheus_client import CONTENT_TYPE_LATEST

        from scheduler.metrics_text import exposition
        from scheduler.observe import enable_metrics

        self._send(200, CONTENT_TYPE_LATEST, exposition(enable_metrics(self.server.sched).registry))

    def _healthz(self) -> None:
        from scheduler.observe import HEARTBEAT_STALE, heartbeat_age

        sched = self.server.sched
        age = heartbeat_age(sched)
        if age is None or not sched.running:
            self._send(503, "text/plain; charset=utf-8", b"not running\n")
        elif age > HEARTBEAT_STALE:
            self._send(503, "text/plain; charset=utf-8", f"timer stalled: last tick {age:.1f}s ago\n".encode())
        else:
            self._send(200, "text/plain; charset=utf-8", b"ok\n")

    def _readyz(self) -> None:
        from scheduler.observe import snapshot

        state = snapshot(self.server.sched)
        problems = []
        if not state.started:
            problems.append("not running (not started, or shut down)")
        elif not state.connected:
            problems.append("registry session not connected")
        problems += [f"job {j.name} not registered" for j in state.jobs if not j.registered]
        problems += [f"job {name} failed to start: {why}" for name, why in state.failed_jobs.items()]
        if problems:
            self._send(503, "text/plain; charset=utf-8", ("\n".join(problems) + "\n").encode())
        else:
            self._send(200, "text/plain; charset=utf-8", b"ready\n")

    def _dump(self) -> None:
        from scheduler.observe import snapshot

        body = json.dumps(asdict(snapshot(self.server.sched, with_cache=True)), indent=2, sort_keys=True)
        self._send(200, "application/json", body.encode())

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s " + format, self.address_string(), *args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], sched: Scheduler) -> None:
        self.sched = sched
        super().__init__(address, _Handler)


class HttpEndpoint:
    """A running endpoint server; ``close()`` stops it. ``port`` is the bound port (useful
    with port 0)."""

    #: seconds between the serving loop's checks for ``close()``: the longest a close waits
    #: (socketserver's default, 0.5 s, added half a second to every shutdown)
    POLL_S = 0.05

    def __init__(self, server: _Server) -> None:
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": self.POLL_S}, name="shardjob-http", daemon=True
        )
        self._thread.start()

    @classmethod
    def start(cls, sched: Scheduler, address: str) -> HttpEndpoint:
        return cls(_Server(parse_address(address), sched))

    @property
    def host(self) -> str:
        return str(self._server.server_address[0])

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
