"""What the console tests share: a console served in-process (uvicorn in a thread) over a
registry client of the test's namespace, logged in or not.

Invariant: every console a test starts is stopped by it (``serve`` is a context manager);
nothing here mocks a registry: the console reads the harness's real servers.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx

from registry.protocol import RegistryCenter
from scheduler.console.app import Console
from scheduler.console.auth import AdminPassword
from scheduler.console.serve import BackgroundConsole

__all__ = ["PASSWORD", "Served", "csrf_of", "log_in", "serve"]

PASSWORD = "correct horse battery staple"


@dataclass
class Served:
    console: Console
    url: str


@contextmanager
def serve(
    reg: RegistryCenter,
    *,
    history_url: str | None = None,
    login_required: bool = False,
    refresh_seconds: float = 0.5,
    password: str | None = PASSWORD,
) -> Iterator[Served]:
    console = Console(
        reg,
        registry_label="test-registry",
        password=None if password is None else AdminPassword(password),
        history_url=history_url,
        login_required=login_required,
        refresh_seconds=refresh_seconds,
    )
    server = BackgroundConsole(console.app)
    try:
        server.start()
        yield Served(console, server.url)
    finally:
        server.stop()
        console.close()


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None, "the page has no form with a CSRF token"
    return found.group(1)


def log_in(client: httpx.Client, password: str = PASSWORD) -> httpx.Response:
    token = csrf_of(client.get("/login").text)
    return client.post("/login", data={"csrf": token, "user": "admin", "password": password})
