"""The etcd session: one lease per client, kept alive by one thread.

etcd refreshes nothing by itself: this keeper refreshes the lease every TTL/3 and turns
what it learns into session states.

- a refresh that cannot reach the server -> ``SUSPENDED`` (then it retries quickly);
- the next successful refresh with TTL > 0 -> ``RECONNECTED`` (the ephemerals survived);
- TTL <= 0 (etcd answers 0 for an expired or revoked lease) -> ``LOST``; a new lease is
  granted (retried until it succeeds) -> ``CONNECTED``. Layers above re-create their
  ephemeral nodes on that new lease.

Invariant: ``lease_id`` is always the lease new ephemeral nodes must use; only the keeper
thread replaces it, and only after reporting ``LOST``.

Invariant: the lease lives at least until ``alive_until``. etcd ends a lease its TTL after
the last refresh it applied, and it applied a refresh (or a grant) no earlier than the
request was sent: the send time of the latest answered one plus the TTL it reported. A
refresh that has had no answer moves nothing.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from registry.backends.etcd_conn import EtcdConnection
from registry.errors import RegistryConnectionError, RegistryError, SessionLostError
from registry.protocol import SessionState

__all__ = ["LeaseKeeper", "lease_ttl"]

log = logging.getLogger("registry.etcd")

_MIN_TTL = 2  # etcd grants at least 2 s whatever is asked
_SUSPENDED_RETRY = 0.25  # how often to knock while the server is unreachable


def lease_ttl(session_timeout: float) -> int:
    return max(_MIN_TTL, math.ceil(session_timeout))


class LeaseKeeper:
    """Refreshes the session lease and reports session transitions through ``report``."""

    def __init__(
        self,
        conn: EtcdConnection,
        ttl: int,
        lease_id: int,
        report: Callable[[SessionState], None],
        name: str,
        *,
        alive_until: float,
    ) -> None:
        self._conn = conn
        #: ``time.monotonic()`` until which the lease is known to live (module invariant)
        self.alive_until = alive_until
        self._ttl = ttl
        self._lease_id = lease_id
        self._report = report
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @property
    def lease_id(self) -> int:
        return self._lease_id

    def start(self) -> None:
        self._thread.start()

    def poke(self) -> None:
        """Refresh now: a call or a watch stream just saw the connection or lease fail."""
        self._wake.set()

    def stop(self, *, revoke: bool, timeout: float) -> None:
        """Stop refreshing; with ``revoke`` end the lease so its ephemerals vanish at once."""
        self._stopped.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if revoke:
            try:
                self._conn.revoke(self._lease_id, timeout)
            except RegistryError as exc:
                # the lease then expires by itself within its TTL
                log.warning("could not revoke etcd lease %x on close: %s", self._lease_id, exc)

    def _run(self) -> None:
        interval = self._ttl / 3
        delay = interval
        suspended = False
        while not self._stopped.is_set():
            self._wake.wait(delay)
            self._wake.clear()
            if self._stopped.is_set():
                return
            sent = time.monotonic()
            try:
                remaining = self._conn.keepalive(self._lease_id, min(interval, self._conn.call_timeout))
            except SessionLostError:
                remaining = 0
            except RegistryConnectionError as exc:
                if not suspended:
                    suspended = True
                    log.info("etcd lease %x: refresh failed (%s)", self._lease_id, exc)
                    self._report(SessionState.SUSPENDED)
                delay = min(interval, _SUSPENDED_RETRY)
                continue
            except RegistryError as exc:
                log.warning("etcd lease %x: refresh refused: %s", self._lease_id, exc)
                delay = interval
                continue
            if remaining <= 0:
                self.alive_until = -math.inf  # gone, whatever the last refresh said (revoked)
                self._renew()
                suspended = False
                delay = interval
                continue
            self.alive_until = max(self.alive_until, sent + remaining)
            if suspended:
                suspended = False
                self._report(SessionState.RECONNECTED)
            delay = interval

    def _renew(self) -> None:
        log.warning("etcd lease %x expired: session lost", self._lease_id)
        self._report(SessionState.LOST)
        delay = 0.05
        while not self._stopped.is_set():
            sent = time.monotonic()
            try:
                self._lease_id = self._conn.grant(self._ttl, self._conn.call_timeout)
            except RegistryError as exc:
                log.debug("granting a new etcd lease failed: %s", exc)
                self._stopped.wait(delay)
                delay = min(delay * 2, 1.0)
                continue
            self.alive_until = sent + self._ttl  # the old lease is gone: its time says nothing
            log.info("etcd session renewed with lease %x", self._lease_id)
            self._report(SessionState.CONNECTED)
            return
