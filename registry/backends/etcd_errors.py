"""Maps every failure the etcd client stack can raise onto ``registry.errors``.

Invariant: nothing from grpc or pyetcd (raw ``grpc.RpcError``, pyetcd's own exceptions,
the ``ValueError``/``RuntimeError`` it lets through) reaches a caller; each becomes a
``RegistryError`` subclass whose message names the servers and the action, never a
password. A connection-level failure (the outcome of the call is unknown) becomes
``RegistryConnectionError``; a lost lease becomes ``SessionLostError``.
"""

from __future__ import annotations

import grpc
from pyetcd import exceptions as etcd_exc

from registry.errors import RegistryConnectionError, RegistryError, SessionLostError

__all__ = [
    "NO_SPACE_HINT",
    "grpc_code",
    "grpc_details",
    "is_invalid_token",
    "is_lease_not_found",
    "is_not_sent",
    "is_space_exceeded",
    "translate",
]

# Codes after which the request may or may not have been applied: the caller must treat
# the outcome as unknown (reads may retry, writes must not be silently repeated).
_CONNECTION_CODES = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.ABORTED,
}
_AUTH_CODES = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}
_CONNECTION_WRAPPERS = (
    etcd_exc.ConnectionFailedError,
    etcd_exc.ConnectionTimeoutError,
    etcd_exc.NoServerAvailableError,
    etcd_exc.WatchTimedOut,
    etcd_exc.InternalServerError,
)


def grpc_code(exc: BaseException) -> grpc.StatusCode | None:
    """The status code of a grpc error (also when wrapped by pyetcd), else ``None``."""
    rpc = _rpc_error(exc)
    if rpc is None:
        return None
    code = getattr(rpc, "code", None)
    try:
        return code() if callable(code) else None
    except Exception:  # a half-built error object: treat as unknown
        return None


def grpc_details(exc: BaseException) -> str:
    rpc = _rpc_error(exc)
    if rpc is None:
        return str(exc) or type(exc).__name__
    details = getattr(rpc, "details", None)
    try:
        text = details() if callable(details) else None
    except Exception:
        text = None
    return str(text) if text else type(rpc).__name__


def is_lease_not_found(exc: BaseException) -> bool:
    return grpc_code(exc) is grpc.StatusCode.NOT_FOUND and "lease not found" in grpc_details(exc)


def is_invalid_token(exc: BaseException) -> bool:
    """The auth token expired or the server restarted (simple tokens do not survive it)."""
    return grpc_code(exc) is grpc.StatusCode.UNAUTHENTICATED and "token" in grpc_details(exc).lower()


#: what an operator does when etcd's database reached its quota (the NOSPACE alarm: etcd
#: then refuses every write, shardjob's run marks included, until the alarm is disarmed)
NO_SPACE_HINT = (
    "etcd's database is full (its space quota is reached and the NOSPACE alarm raised); "
    "compact its history (etcdctl compact), defragment (etcdctl defrag), disarm the alarm "
    "(etcdctl alarm disarm), and run etcd with --auto-compaction-retention so its history "
    "stops growing"
)


def is_space_exceeded(exc: BaseException) -> bool:
    """etcd refused a write because its database reached ``--quota-backend-bytes``."""
    return grpc_code(exc) is grpc.StatusCode.RESOURCE_EXHAUSTED and "space exceeded" in grpc_details(exc)


def is_not_sent(exc: BaseException) -> bool:
    """True when the request provably never left the client (no connection could be made).

    gRPC reports "failed to connect to all addresses" when it found no transport to put
    the call on, so even a write may be retried after it.
    """
    return grpc_code(exc) is grpc.StatusCode.UNAVAILABLE and "failed to connect" in grpc_details(exc)


def translate(exc: BaseException, action: str, servers: str) -> RegistryError:
    """A ``RegistryError`` describing ``exc``, raised while doing ``action`` on ``servers``."""
    if isinstance(exc, RegistryError):
        return exc
    where = f"etcd at {servers}: {action}"
    code = grpc_code(exc)
    details = grpc_details(exc)
    if code is not None:
        if is_lease_not_found(exc):
            return SessionLostError(f"{where}: the session's lease has expired ({details})")
        if code in _CONNECTION_CODES:
            return RegistryConnectionError(f"{where} failed: {code.name} ({details}){_tls_hint(details)}")
        if code in _AUTH_CODES:
            return RegistryError(f"{where}: not authorised ({details})")
        if code is grpc.StatusCode.INVALID_ARGUMENT:
            return RegistryError(f"{where}: request rejected by etcd ({details})")
        if is_space_exceeded(exc):
            return RegistryError(f"{where} refused: {NO_SPACE_HINT} ({details})")
        return RegistryError(f"{where} failed: {code.name} ({details})")
    if isinstance(exc, _CONNECTION_WRAPPERS):
        return RegistryConnectionError(f"{where} failed: {type(exc).__name__}")
    if isinstance(exc, etcd_exc.Etcd3Exception):
        return RegistryError(f"{where} failed: {type(exc).__name__} {exc}")
    if isinstance(exc, ValueError):
        # pyetcd's "failed node" and grpc's "closed channel" both mean: no usable connection
        return RegistryConnectionError(f"{where} failed: {exc}")
    return RegistryError(f"{where} failed: {type(exc).__name__}: {exc}")


def _rpc_error(exc: BaseException) -> grpc.RpcError | None:
    """The grpc error itself, or the one pyetcd wrapped (it raises from inside ``except``)."""
    seen: BaseException | None = exc
    for _ in range(3):
        if seen is None:
            return None
        if isinstance(seen, grpc.RpcError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _tls_hint(details: str) -> str:
    lowered = details.lower()
    if any(word in lowered for word in ("ssl", "handshake", "certificate", "tls", "tsi_")):
        return " - TLS handshake failed: check the ca_cert, cert_key and cert_cert options"
    return ""
