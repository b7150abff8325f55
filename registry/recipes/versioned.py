"""Read-modify-write of registry nodes without losing a concurrent change.

``update`` reads what it needs, plans ONE transaction whose writes carry the versions it
read (``Set``/``Delete`` with ``version``, ``Create`` for what was absent, ``Check`` for
what it only relied on), and applies it. If anything it read changed meanwhile the
transaction is refused as a whole and the cycle starts again from a fresh read, so two
writers (two operators, an operator and a resharding leader) each apply their change to
the other's result, never over it. Hazard: ``plan`` must be a pure function of what it
was given — it runs again on every retry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from registry.errors import RegistryError, TransactionError
from registry.protocol import Op, RegistryCenter

__all__ = ["ConcurrentChanges", "update"]

T = TypeVar("T")

#: a change that loses this many races in a row is reported, not retried forever
ATTEMPTS = 20


class ConcurrentChanges(RegistryError):
    """The nodes kept changing between the read and the write; nothing was written."""


def update(
    reg: RegistryCenter,
    read: Callable[[], T],
    plan: Callable[[T], Sequence[Op]],
    *,
    what: str,
    attempts: int = ATTEMPTS,
) -> T:
    """Apply ``plan(read())`` as one transaction, again from a fresh read while a versioned
    op is refused; returns what the successful plan was made from. Errors ``plan`` raises
    (bad input) propagate at once, with nothing written."""
    for _ in range(attempts):
        state = read()
        ops = plan(state)
        if not ops:
            return state
        try:
            reg.transaction(ops)
            return state
        except TransactionError as exc:
            if exc.index is None:
                raise  # refused as a whole (its size): a new read would not help
            continue  # something read changed: read it again
    raise ConcurrentChanges(f"{what}: the nodes kept changing ({attempts} attempts); nothing written")
