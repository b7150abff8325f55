"""One etcd connection: the gRPC channels, authentication and bounded, mapped RPCs.

Invariants kept here:
- every RPC carries a deadline; every failure leaves as a ``registry.errors`` exception;
- idempotent calls are retried (``retrying.call_with_retries``) on connection loss within
  ``connect_timeout``;
  a write is retried only when gRPC proves it never left the client, never when its
  outcome is unknown;
- an expired auth token (or one a restarted server forgot) is renewed once and the call
  repeated: the server refused it before applying anything;
- the password is kept only for re-authentication and never appears in a message.

pyetcd's client is used for its channel and stubs only: its wrapped methods mark the
endpoint failed and close the shared watcher on any UNAVAILABLE, which this backend
cannot afford: a restart of the server would end every watch and lease keep-alive of the
session instead of letting them resume (docs/registry.md, etcd).
"""

from __future__ import annotations

import ipaddress
import itertools
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
import pyetcd
from pyetcd import etcdrpc
from pyetcd.etcdrpc import rpc_pb2_grpc

from registry.backends.etcd_errors import (
    grpc_code,
    grpc_details,
    is_invalid_token,
    is_not_sent,
    translate,
)
from registry.backends.retrying import call_with_retries
from registry.errors import RegistryConnectionError, RegistryError
from registry.url import RegistryURL

__all__ = ["EtcdConnection"]

log = logging.getLogger("registry.etcd")
_T = TypeVar("_T")

# gRPC channel options. Keepalive pings detect a hung server on open streams (etcd's
# default enforcement refuses pings closer than 5 s); the reconnect backoff is capped so a
# restarted server is used again within a second instead of gRPC's default 120 s.
_BASE_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.keepalive_time_ms", 5000),
    ("grpc.keepalive_timeout_ms", 2000),
    ("grpc.http2.ping_timeout_ms", 2000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.max_send_message_length", 16 * 1024 * 1024),
]

#: channels the KV calls (reads and transactions) take turns on; the lease, watches and
#: authentication keep pyetcd's own. Hazard: gRPC Python holds a lock of the whole channel
#: while it starts a call and again when one ends, and lets go of the GIL and takes it back
#: while holding that lock. With another Python thread busy, the holder waits for the GIL
#: and every caller of the channel waits for the holder: committers sharing one channel
#: send one call at a time. Channels with the same target and options share gRPC's
#: connection to the server (its global subchannel pool): a lane costs a lock and a few
#: objects, no socket.
_KV_LANES = 8


class _Transient(Exception):
    """A failure worth another attempt; carries the mapped error to raise at the end."""

    def __init__(self, error: RegistryError, cause: BaseException) -> None:
        super().__init__(str(error))
        self.error = error
        self.cause = cause


def _is_transient(exc: BaseException) -> bool:
    return isinstance(exc, _Transient)


class _TargetEndpoint(pyetcd.Endpoint):  # type: ignore[misc]
    """A pyetcd endpoint whose channel dials a full gRPC target.

    ``Endpoint`` dials ``host:port``; several servers need one channel on a target that
    lists every address (``ipv4:a:p,b:p``) so gRPC fails over without a failed call.
    """

    def __init__(
        self, target: str, label: str, creds: grpc.ChannelCredentials | None, opts: list[Any]
    ) -> None:
        self._target = target
        self._options = opts
        host, _, port = label.rpartition(":")
        super().__init__(host, int(port), secure=creds is not None, creds=creds, time_retry=0, opts=opts)

    def _mkchannel(self, opts: list[Any]) -> grpc.Channel:
        if self.secure:
            return grpc.secure_channel(self._target, self.credentials, options=opts)
        return grpc.insecure_channel(self._target, options=opts)

    def another_channel(self) -> grpc.Channel:
        """A channel of its own to the same target, with the same options."""
        return self._mkchannel(self._options)


class EtcdConnection:
    """The client side of one etcd cluster for one registry client."""

    def __init__(self, parsed: RegistryURL) -> None:
        self._parsed = parsed
        self.servers = ",".join(_hostport(h, p) for h, p in parsed.hosts)
        self.call_timeout = parsed.connect_timeout
        self._token_lock = threading.Lock()
        self._token_generation = 0
        self._closed = False
        creds = _channel_credentials(parsed)
        options = list(_BASE_OPTIONS)
        if creds is not None and len(parsed.hosts) > 1:
            # the multi-address target has no host name of its own to check certificates on
            options.append(("grpc.ssl_target_name_override", parsed.hosts[0][0]))
        target = _grpc_target(parsed.hosts)
        self._endpoint = _TargetEndpoint(target, _hostport(*parsed.hosts[0]), creds, options)
        self._client: Any = pyetcd.MultiEndpointEtcd3Client([self._endpoint], timeout=self.call_timeout)
        # pyetcd attaches the token as call credentials, which gRPC refuses on plaintext
        # channels; it is sent as metadata instead (``client.metadata``).
        self._client.call_credentials = None
        self._lanes = [self._endpoint.another_channel() for _ in range(_KV_LANES)]
        self._kv_stubs = [rpc_pb2_grpc.KVStub(lane) for lane in self._lanes]
        self._turns = itertools.count()  # next() is atomic: callers need no lock

    # -- life cycle -----------------------------------------------------------------------
    def open(self, ttl: int) -> int:
        """Authenticate and grant the session lease within ``connect_timeout``; its id."""
        deadline = time.monotonic() + self._parsed.connect_timeout
        delay = 0.05
        last: BaseException | None = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                detail = f": {translate(last, 'connect', self.servers)}" if last is not None else ""
                raise RegistryConnectionError(
                    f"could not connect to etcd at {self.servers} within "
                    f"{self._parsed.connect_timeout:g} s{detail}"
                ) from last
            try:
                if self._parsed.user is not None:
                    self._authenticate(remaining)
                return self._grant(ttl, remaining)
            except grpc.RpcError as exc:
                if grpc_code(exc) not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise translate(exc, "connect", self.servers) from exc
                last = exc
            except (ValueError, RuntimeError, pyetcd.Etcd3Exception) as exc:
                raise translate(exc, "connect", self.servers) from exc
            time.sleep(max(0.0, min(delay, deadline - time.monotonic())))
            delay = min(delay * 2, 0.5)

    def close(self) -> None:
        self._closed = True
        for closable in [*self._lanes, self._client]:
            try:
                closable.close()
            except Exception:
                log.debug("closing an etcd channel failed", exc_info=True)

    # -- authentication --------------------------------------------------------------------
    @property
    def token_generation(self) -> int:
        """Grows with every new token; the watch supervisor compares it to its watcher's."""
        return self._token_generation

    def _authenticate(self, timeout: float) -> None:
        user, password = self._parsed.user, self._parsed.password
        request = etcdrpc.AuthenticateRequest(name=user, password=password)
        try:
            response = self._client.authstub.Authenticate(request, timeout)
        except grpc.RpcError as exc:
            code, details = grpc_code(exc), grpc_details(exc)
            if code is grpc.StatusCode.FAILED_PRECONDITION and "not enabled" in details:
                log.warning("etcd at %s has authentication disabled; ignoring user %r", self.servers, user)
                return
            if code is grpc.StatusCode.INVALID_ARGUMENT and "authentication failed" in details:
                raise RegistryError(
                    f"etcd authentication failed for user {user!r} at {self.servers}"
                ) from None
            raise
        self._client.metadata = (("token", response.token),)
        self._token_generation += 1

    def reauthenticate(self, seen_generation: int) -> None:
        """Fetch a new token unless another thread did since ``seen_generation``."""
        if self._parsed.user is None:
            return
        with self._token_lock:
            if self._token_generation != seen_generation:
                return
            try:
                self._authenticate(self.call_timeout)
            except grpc.RpcError as exc:
                raise translate(exc, "authenticate", self.servers) from exc

    # -- calls -------------------------------------------------------------------------------
    def call(
        self,
        action: str,
        fn: Callable[[Any, float, Any], _T],
        *,
        idempotent: bool,
        budget: float | None = None,
    ) -> _T:
        """Run ``fn(client, timeout, metadata)``; retried per the module invariant.

        ``budget`` bounds the whole call including retries (``connect_timeout`` by default).
        """
        if budget is None:
            budget = self._parsed.connect_timeout
        deadline = time.monotonic() + budget

        def attempt() -> _T:
            timeout = max(0.05, min(self.call_timeout, deadline - time.monotonic()))
            return self._once(action, fn, timeout, idempotent)

        try:
            return call_with_retries(attempt, transient=_is_transient, budget=budget)
        except _Transient as transient:
            raise transient.error from transient.cause

    def _once(self, action: str, fn: Callable[[Any, float, Any], _T], timeout: float, idempotent: bool) -> _T:
        if self._closed:
            raise RegistryError(f"etcd client for {self.servers} is closed")
        for renewed in (False, True):
            generation = self._token_generation
            try:
                return fn(self._client, timeout, self._client.metadata)
            except grpc.RpcError as exc:
                if not renewed and is_invalid_token(exc) and self._parsed.user is not None:
                    self.reauthenticate(generation)
                    continue
                error = translate(exc, action, self.servers)
                if isinstance(error, RegistryConnectionError) and (idempotent or is_not_sent(exc)):
                    raise _Transient(error, exc) from exc
                raise error from exc
            except (ValueError, RuntimeError, pyetcd.Etcd3Exception) as exc:
                raise translate(exc, action, self.servers) from exc
        raise AssertionError("unreachable: the second attempt returns or raises")

    # -- typed helpers -----------------------------------------------------------------------
    def kv_lane(self) -> Any:
        """The KV stub of the next lane in turn (``_KV_LANES``)."""
        return self._kv_stubs[next(self._turns) % len(self._kv_stubs)]

    def range(self, key: bytes, range_end: bytes = b"", *, keys_only: bool = False) -> Any:
        request = etcdrpc.RangeRequest(key=key, range_end=range_end, keys_only=keys_only)
        kv = self.kv_lane()
        return self.call("read", lambda c, t, md: kv.Range(request, t, metadata=md), idempotent=True)

    def txn(self, request: Any, *, idempotent: bool = False, action: str = "transaction") -> Any:
        kv = self.kv_lane()
        return self.call(action, lambda c, t, md: kv.Txn(request, t, metadata=md), idempotent=idempotent)

    def _grant(self, ttl: int, timeout: float) -> int:
        response = self._client.leasestub.LeaseGrant(
            etcdrpc.LeaseGrantRequest(TTL=ttl), timeout, metadata=self._client.metadata
        )
        if response.error:
            raise RegistryError(f"etcd at {self.servers} refused a lease: {response.error}")
        return int(response.ID)

    def grant(self, ttl: int, budget: float) -> int:
        return self.call("grant lease", lambda c, t, md: self._grant(ttl, t), idempotent=False, budget=budget)

    def keepalive(self, lease_id: int, timeout: float) -> int:
        """Refresh the lease once; its remaining TTL (``<= 0``: the lease is gone)."""

        def refresh(client: Any, t: float, md: Any) -> int:
            request = etcdrpc.LeaseKeepAliveRequest(ID=lease_id)
            stream = client.leasestub.LeaseKeepAlive(iter([request]), t, metadata=md)
            try:
                for response in stream:
                    return int(response.TTL)
                return 0
            finally:
                stream.cancel()

        # one attempt: the keeper owns the retry cadence, and a failure must show at once
        try:
            return self._once("refresh lease", refresh, timeout, idempotent=False)
        except _Transient as transient:
            raise transient.error from transient.cause

    def revoke(self, lease_id: int, timeout: float) -> None:
        request = etcdrpc.LeaseRevokeRequest(ID=lease_id)
        self.call(
            "revoke lease",
            lambda c, t, md: c.leasestub.LeaseRevoke(request, t, metadata=md),
            idempotent=True,
            budget=timeout,
        )

    # -- what watch streams need -----------------------------------------------------------
    @property
    def channel(self) -> grpc.Channel:
        return self._endpoint.channel

    @property
    def metadata(self) -> Any:
        """The current token as call metadata (``None`` without authentication)."""
        return self._client.metadata

    # -- clock ---------------------------------------------------------------------------------
    def server_time(self) -> float:
        """The server's clock from the ``Date`` header of ``GET /version`` (etcd puts no
        time in its KV responses). Tries each server in turn. Its HTTP client is imported
        here: only jobs with ``max_time_diff_seconds`` ask, and ``urllib.request`` is about
        2.4 MiB of RSS."""
        import email.utils
        import urllib.request

        context = None
        if self._endpoint.secure:
            context = ssl.create_default_context(cafile=self._parsed.ca_cert)
            if self._parsed.cert_cert is not None:
                context.load_cert_chain(self._parsed.cert_cert, self._parsed.cert_key)
        scheme = "https" if context is not None else "http"
        last: BaseException | None = None
        for host, port in self._parsed.hosts:
            url = f"{scheme}://{_hostport(host, port)}/version"
            try:
                with urllib.request.urlopen(url, timeout=self.call_timeout, context=context) as response:
                    date = response.headers.get("Date")
                if not date:
                    raise RegistryError(f"etcd at {_hostport(host, port)} sent no Date header")
                # Date has whole seconds: the true time is on average half a second later
                return email.utils.parsedate_to_datetime(date).timestamp() + 0.5
            except (OSError, ValueError) as exc:
                last = exc
        raise RegistryConnectionError(f"could not read the clock of etcd at {self.servers}: {last}") from last


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _grpc_target(hosts: tuple[tuple[str, int], ...]) -> str:
    """A gRPC target naming every server: plain ``host:port`` for one, else an address list.

    gRPC address lists take IP literals only, so names are resolved once here.
    """
    if len(hosts) == 1:
        return _hostport(*hosts[0])
    addresses: list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]] = []
    for host, port in hosts:
        try:
            addresses.append((ipaddress.ip_address(host), port))
        except ValueError:
            try:
                infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                raise RegistryConnectionError(f"cannot resolve etcd host {host!r}: {exc}") from exc
            infos.sort(key=lambda info: info[0] != socket.AF_INET)
            addresses.append((ipaddress.ip_address(infos[0][4][0]), port))
    if all(a.version == 4 for a, _ in addresses):
        return "ipv4:" + ",".join(f"{a}:{p}" for a, p in addresses)
    mapped = [(ipaddress.IPv6Address(f"::ffff:{a}") if a.version == 4 else a, p) for a, p in addresses]
    return "ipv6:" + ",".join(f"[{a}]:{p}" for a, p in mapped)


def _channel_credentials(parsed: RegistryURL) -> grpc.ChannelCredentials | None:
    if parsed.ca_cert is None and parsed.cert_cert is None:
        return None

    def read(option: str, path: str | None) -> bytes | None:
        if path is None:
            return None
        try:
            with open(path, "rb") as handle:
                return handle.read()
        except OSError as exc:
            raise RegistryError(f"cannot read the etcd {option} file {path!r}: {exc.strerror}") from None

    return grpc.ssl_channel_credentials(
        root_certificates=read("ca_cert", parsed.ca_cert),
        private_key=read("cert_key", parsed.cert_key),
        certificate_chain=read("cert_cert", parsed.cert_cert),
    )
