"""The memory backend under the contract suite: faults injected through ``MemoryStore``.

Each harness uses a store of its own, so tests never see each other's sessions; another
"process" is a client with a link of its own, whose death is a cut that is never restored
(its session then expires after the timeout, as a killed process's would).
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import registry
from registry.backends.base import BaseRegistry
from registry.backends.memory import MemoryRegistry, MemoryStore
from tests.harness import Harness, Link, Participant
from tests.participant import start_member


class MemoryLink(Link):
    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self.name = "link" + uuid.uuid4().hex[:8]

    def url(self, namespace: str = "", **options: Any) -> str:
        return _url(self._store.name, namespace, link=self.name, **options)

    def cut(self) -> None:
        self._store.cut_link(self.name)

    def restore(self) -> None:
        self._store.restore_link(self.name)

    def close(self) -> None:
        self._store.restore_link(self.name)


class MemoryParticipant(Participant):
    """A client on a private link, driven by a thread (the memory store is in-process)."""

    def __init__(self, store: MemoryStore, url: str, action: str, path: str, *args: str) -> None:
        self._store = store
        self._link = "participant" + uuid.uuid4().hex[:8]
        self._ready = threading.Event()
        self._release = threading.Event()
        self._error: BaseException | None = None
        self._client: BaseRegistry = registry.connect(url, link=self._link)
        self._thread = threading.Thread(target=self._run, args=(action, path, args), daemon=True)
        self._thread.start()

    def _run(self, action: str, path: str, args: tuple[str, ...]) -> None:
        try:
            if action == "ephemeral":
                self._client.create(path, b"participant", ephemeral=True)
                self._ready.set()
                self._release.wait()
            elif action == "lock":
                with self._client.lock(path):
                    self._ready.set()
                    self._release.wait()
            elif action == "member":
                with start_member(self._client, path, *args):
                    self._ready.set()
                    self._release.wait()
            else:
                raise ValueError(f"unknown participant action {action!r}")
        except BaseException as exc:  # reported through ready()
            self._error = exc

    def ready(self, timeout: float) -> bool:
        ok = self._ready.wait(timeout)
        if self._error is not None:
            raise AssertionError(f"participant failed: {self._error!r}")
        return ok

    def kill(self) -> None:
        # cut off for good: the session times out like a SIGKILLed process's
        self._store.cut_link(self._link)

    def stop(self) -> None:
        self._release.set()
        self._thread.join(5)
        self._client.close()


def _url(store: str, namespace: str, **options: Any) -> str:
    query = "&".join(f"{k}={v}" for k, v in options.items())
    return f"memory://{store}{namespace}" + (f"?{query}" if query else "")


class MemoryHarness(Harness):
    name = "memory"
    min_session_timeout = 1.0

    def __init__(self) -> None:
        super().__init__()
        self.store = MemoryStore.named("contract-" + uuid.uuid4().hex[:8])
        self._links: list[MemoryLink] = []

    def url(self, namespace: str = "", **options: Any) -> str:
        return _url(self.store.name, namespace, **options)

    def expire_session(self, reg: BaseRegistry) -> None:
        assert isinstance(reg, MemoryRegistry)
        self.store.expire(reg)

    def restart_server(self, downtime: float = 0.0) -> None:
        self.store.outage()
        if downtime > 0:
            threading.Event().wait(downtime)  # the "server" is down for this long, by design
        self.store.recover()

    def link(self) -> Link:
        link = MemoryLink(self.store)
        self._links.append(link)
        return link

    def participant(self, url: str, action: str, path: str, *args: str) -> Participant:
        return MemoryParticipant(self.store, url, action, path, *args)

    def unreachable_url(self, **options: Any) -> str:
        down = MemoryStore.named("down-" + uuid.uuid4().hex[:8])
        down.outage()
        return _url(down.name, "", **options)

    def close_clients(self) -> None:
        for link in self._links:
            link.close()
        super().close_clients()
