"""Every error a registry call can raise, and ``ShardJobError``, the root of every error
shardjob raises (registry, sharding and scheduler alike), as kazoo's ``KazooException``.
A caller's bad input (a URL, a path, a configuration) is a ``ValueError`` instead.

Invariant: no backend exception (kazoo, grpc, pyetcd) ever reaches a caller; each backend
maps its own failures onto these classes, and messages never contain a password.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from registry.protocol import Op

__all__ = [
    "BadVersionError",
    "LockTimeout",
    "NoNodeError",
    "NodeExistsError",
    "RegistryConnectionError",
    "RegistryError",
    "SessionLostError",
    "ShardJobError",
    "TransactionError",
]


class ShardJobError(Exception):
    """Base of every error shardjob raises (bad input from the caller is a ``ValueError``)."""


class RegistryError(ShardJobError):
    """Base of every registry failure."""


class RegistryConnectionError(RegistryError):
    """The registry could not be reached, or the outcome of a call is unknown."""


class SessionLostError(RegistryError):
    """The client's session expired: its ephemeral nodes are gone."""


class NodeExistsError(RegistryError):
    """A create found the node already present."""

    def __init__(self, path: str) -> None:
        super().__init__(f"node exists: {path}")
        self.path = path


class NoNodeError(RegistryError):
    """An operation needed a node (or its parent) that is absent."""

    def __init__(self, path: str) -> None:
        super().__init__(f"no node: {path}")
        self.path = path


class BadVersionError(RegistryError):
    """A conditional write found the node at another version."""

    def __init__(self, path: str, expected: int | None = None) -> None:
        detail = f" (expected version {expected})" if expected is not None else ""
        super().__init__(f"bad version: {path}{detail}")
        self.path = path
        self.expected = expected


class TransactionError(RegistryError):
    """A transaction applied nothing.

    ``index`` and ``op`` name the operation that failed (``None`` when the transaction as
    a whole was refused, e.g. for its size); ``cause`` is the per-operation error.
    """

    def __init__(
        self,
        message: str,
        *,
        index: int | None = None,
        op: Op | None = None,
        cause: RegistryError | None = None,
    ) -> None:
        super().__init__(message)
        self.index = index
        self.op = op
        self.cause = cause

    @classmethod
    def for_op(cls, index: int, op: Op, cause: RegistryError) -> TransactionError:
        return cls(f"transaction op {index} {op!r} failed: {cause}", index=index, op=op, cause=cause)


class LockTimeout(RegistryError):
    """A lock was not acquired within its timeout."""
