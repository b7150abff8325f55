"""Leader election on the protocol alone: an ephemeral node created if absent.

The leader is the client whose ephemeral node sits at the election path; everyone else
watches that path (no polling) and tries again when it is deleted. Leadership therefore
ends with the leader's session, on ``resign()``, or on ``stop()``.

Invariant: ``leader_version`` is the version of the leader node this client created; a
write that must come from the current leader only includes ``Check(path, leader_version)``
in its transaction, so a stale leader (session expired, node re-created by another) fails
instead of writing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from registry.errors import NodeExistsError, RegistryError, TransactionError
from registry.protocol import Delete, Event, EventKind, RegistryCenter, SessionState, Watch

__all__ = ["LeaderElection"]

log = logging.getLogger("registry.election")


class LeaderElection:
    """Campaign for the node at ``path`` with ``identifier`` as its value."""

    def __init__(
        self,
        reg: RegistryCenter,
        path: str,
        identifier: str,
        *,
        on_elected: Callable[[], None] | None = None,
        on_revoked: Callable[[], None] | None = None,
    ) -> None:
        self._reg = reg
        self._path = path
        self._identifier = identifier.encode()
        self._on_elected = on_elected
        self._on_revoked = on_revoked
        self._lock = threading.RLock()
        self._version: int | None = None
        self._participating = False
        self._watch: Watch | None = None

    @property
    def path(self) -> str:
        return self._path

    @property
    def is_leader(self) -> bool:
        return self._version is not None

    @property
    def participating(self) -> bool:
        return self._participating

    @property
    def leader_version(self) -> int | None:
        return self._version

    def leader(self) -> str | None:
        """The current leader's identifier, read from the registry."""
        value = self._reg.get(self._path)
        return None if value is None else value.decode(errors="replace")

    def start(self, *, participate: bool = True) -> None:
        """Follow the election and, if ``participate``, campaign (may lead on return)."""
        with self._lock:
            if self._watch is not None:
                return
            self._participating = participate
        self._reg.add_listener(self._on_session)
        self._watch = self._reg.watch(self._path, self._on_event)
        self.campaign()

    def stop(self) -> None:
        """Leave the election, handing leadership over at once if held."""
        with self._lock:
            self._participating = False
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        self._reg.remove_listener(self._on_session)
        self.resign()

    def resign(self) -> None:
        """Give up leadership now (others are elected at once); stay a candidate only if
        still participating."""
        with self._lock:
            version, self._version = self._version, None
        if version is None:
            return
        try:
            self._reg.transaction([Delete(self._path, version)])
        except TransactionError:
            pass  # already gone or someone else's: nothing of ours to delete
        except RegistryError:
            log.warning("resigning %s failed; the session's end will release it", self._path, exc_info=True)
        self._revoked()

    def pause(self) -> None:
        """Resign and stop campaigning until ``resume()`` (e.g. this server disabled)."""
        with self._lock:
            self._participating = False
        self.resign()

    def resume(self) -> None:
        with self._lock:
            self._participating = True
        self.campaign()

    def campaign(self) -> bool:
        """Try once to become leader; True if this client leads afterwards."""
        with self._lock:
            if not self._participating:
                return False
            if self._version is not None:
                return True
            try:
                self._reg.create(self._path, self._identifier, ephemeral=True)
            except NodeExistsError:
                return self._adopt_existing()
            except RegistryError:
                log.warning("campaign for %s failed; retrying on the next change", self._path, exc_info=True)
                return False
            node = self._reg.get_node(self._path)
            if node is None or node.value != self._identifier:
                return False
            self._version = node.version
        self._elected()
        return True

    def _adopt_existing(self) -> bool:
        """Our own node may survive a reconnect with the session intact: keep leading."""
        node = self._reg.get_node(self._path)
        if node is not None and node.value == self._identifier and node.ephemeral:
            self._version = node.version
            self._elected()
            return True
        return False

    def _on_event(self, event: Event) -> None:
        if event.path != self._path:
            return
        if event.kind is EventKind.DELETED:
            if self._version is not None:
                with self._lock:
                    self._version = None
                self._revoked()
            self.campaign()

    def _on_session(self, state: SessionState) -> None:
        if state is SessionState.LOST:
            with self._lock:
                version, self._version = self._version, None
            if version is not None:
                self._revoked()
        elif state in (SessionState.CONNECTED, SessionState.RECONNECTED):
            self.campaign()

    def _elected(self) -> None:
        log.info("%s: elected at %s", self._identifier.decode(errors="replace"), self._path)
        if self._on_elected is not None:
            self._on_elected()

    def _revoked(self) -> None:
        log.info("%s: no longer leader at %s", self._identifier.decode(errors="replace"), self._path)
        if self._on_revoked is not None:
            self._on_revoked()
