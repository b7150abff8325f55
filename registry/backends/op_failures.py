"""Why a transaction was refused, the same on every backend: the first op whose check fails.

A backend raises ``TxnOpFailed`` (op index and reason, on stored paths) and ``op_failed``
makes the caller's ``TransactionError`` of it, naming the caller's own op and path.
ZooKeeper's ``multi`` answer names the failing op; etcd's says only that the transaction
failed, and the memory store checks before it applies: both find the op from the nodes'
state with ``raise_first_failed_op``, first failing op in the caller's order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from registry.errors import BadVersionError, NodeExistsError, NoNodeError, RegistryError, TransactionError
from registry.protocol import Create, Op
from registry.text_enum import TextEnum

__all__ = ["OpFailure", "TxnOpFailed", "op_failed", "raise_first_failed_op"]


class OpFailure(TextEnum):
    """Why one op of a transaction failed (the error class the caller sees follows)."""

    EXISTS = "exists"  # NodeExistsError
    NO_NODE = "no_node"  # NoNodeError
    BAD_VERSION = "bad_version"  # BadVersionError


class TxnOpFailed(Exception):
    """Raised by a backend's ``_transaction``: op ``index`` failed for ``reason``.
    The base class turns it into a ``TransactionError`` naming the caller's op."""

    def __init__(self, index: int, reason: OpFailure) -> None:
        super().__init__(f"op {index}: {reason.value}")
        self.index = index
        self.reason = reason


def op_failed(ops: Sequence[Op], failed: TxnOpFailed) -> TransactionError:
    """The caller's error for a backend's ``TxnOpFailed`` on ``ops`` (caller's paths)."""
    op = ops[failed.index]
    cause: RegistryError
    if failed.reason is OpFailure.EXISTS:
        cause = NodeExistsError(op.path)
    elif failed.reason is OpFailure.NO_NODE:
        cause = NoNodeError(op.path)
    else:
        cause = BadVersionError(op.path, getattr(op, "version", None))
    return TransactionError.for_op(failed.index, op, cause)


def raise_first_failed_op(ops: Sequence[Op], version_of: Callable[[str], int | None]) -> None:
    """Raise ``TxnOpFailed`` for the first op (in order) that fails against the state that
    ``version_of`` reports (a node's version, None when absent); return if none does."""
    for index, op in enumerate(ops):
        version = version_of(op.path)
        if isinstance(op, Create):
            if version is not None:
                raise TxnOpFailed(index, OpFailure.EXISTS)
        elif version is None:
            raise TxnOpFailed(index, OpFailure.NO_NODE)
        elif op.version is not None and version != op.version:
            raise TxnOpFailed(index, OpFailure.BAD_VERSION)
