"""The interface the contract suite uses to reach a backend and to inflict faults on it.

One implementation per backend (memory in ``tests/harnesses/memory.py``, ZooKeeper and
etcd in ``tests/harnesses/``); the ``harness`` fixture in ``tests/conftest.py`` is
parametrised over them, so every contract test runs unchanged on all three.
"""

from __future__ import annotations

import abc
import contextlib
import uuid
from typing import Any

from registry.backends.base import BaseRegistry


class Link(abc.ABC):
    """A connection path to the registry that a test can sever and restore.

    For real servers: a TCP proxy on loopback. For memory: the client's simulated link.
    """

    @abc.abstractmethod
    def url(self, namespace: str = "", **options: Any) -> str:
        """A registry URL whose traffic goes through this link."""

    @abc.abstractmethod
    def cut(self) -> None:
        """Drop every connection and refuse new ones until ``restore()``."""

    @abc.abstractmethod
    def restore(self) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...


class Participant(abc.ABC):
    """Another client, in another process where the backend allows, that a test can kill.

    ``action`` is ``"ephemeral"`` (create ``path`` as an ephemeral node), ``"lock"`` (take
    ``reg.lock(path)`` and hold it) or ``"member"`` (run a sharding service for the job at
    ``path`` with args ``instance_id total``). ``ready()`` returns once the action is done.
    """

    @abc.abstractmethod
    def ready(self, timeout: float) -> bool: ...

    @abc.abstractmethod
    def kill(self) -> None:
        """Die abruptly (SIGKILL for a process): no close, the session must time out."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Release and exit cleanly (close the session)."""


class Harness(abc.ABC):
    """One backend under test."""

    name: str
    #: smallest session timeout (seconds) the server accepts; tests use it to stay fast
    min_session_timeout: float = 2.0

    def __init__(self) -> None:
        self._clients: list[BaseRegistry] = []

    def fresh_namespace(self) -> str:
        return "/t" + uuid.uuid4().hex[:12]

    @abc.abstractmethod
    def url(self, namespace: str = "", **options: Any) -> str: ...

    def connect(self, namespace: str | None = None, **options: Any) -> BaseRegistry:
        """A connected client; closed at the test's teardown by ``close_clients``."""
        import registry

        reg = registry.connect(
            self.url(self.fresh_namespace() if namespace is None else namespace, **options)
        )
        self._clients.append(reg)
        return reg

    def close_clients(self) -> None:
        while self._clients:
            client = self._clients.pop()
            with contextlib.suppress(Exception):
                client.close()

    @abc.abstractmethod
    def expire_session(self, reg: BaseRegistry) -> None:
        """Make the server expire ``reg``'s session now (as if it had timed out)."""

    @abc.abstractmethod
    def restart_server(self, downtime: float = 0.0) -> None:
        """Stop the server, keep it down ``downtime`` seconds, start it with its data."""

    @abc.abstractmethod
    def link(self) -> Link:
        """A severable connection path to the server."""

    @abc.abstractmethod
    def participant(self, url: str, action: str, path: str, *args: str) -> Participant:
        """Start another client on ``url`` doing ``action`` on ``path`` (see Participant)."""

    def unreachable_url(self, **options: Any) -> str:
        """A URL on which nothing answers (memory has none: it never fails to connect)."""
        raise NotImplementedError
