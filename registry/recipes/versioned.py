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

from registry.errors import BadVersionError, NodeExistsError, NoNodeError, RegistryError, TransactionError
from registry.protocol import Op, RegistryCenter
from registry.recipes.batch import Commit

__all__ = ["ConcurrentChanges", "update"]

T = TypeVar("T")

#: a change that loses this many races in a row is reported, not retried forever
ATTEMPTS = 20

#: what a concurrent change makes a versioned op fail with (anything else is no race)
_CONFLICTS = (BadVersionError, NodeExistsError, NoNodeError)


class ConcurrentChanges(RegistryError):
    """The nodes kept changing between the read and the write; nothing was written."""


def update(
    reg: RegistryCenter,
    read: Callable[[], T],
    plan: Callable[[T], Sequence[Op]],
    *,
    what: str,
    attempts: int = ATTEMPTS,
    commit: Commit | None = None,
) -> T:
    """Apply ``plan(read())`` as one transaction, again from a fresh read while a versioned
    op is refused; returns what the successful plan was made from. Errors ``plan`` raises
    (bad input) propagate at once, with nothing written. ``commit`` applies the
    transaction instead of ``reg.transaction`` (a group commit)."""
    apply = reg.transaction if commit is None else commit
    for _ in range(attempts):
        state = read()
        ops = plan(state)
        if not ops:
            return state
        try:
            apply(ops)
            return state
        except TransactionError as exc:
            if exc.index is None:
                raise  # refused as a whole (its size): a new read would not help
            if exc.cause is not None and not isinstance(exc.cause, _CONFLICTS):
                raise exc.cause from exc  # e.g. not authorised: a new read would not help
            continue  # something read changed: read it again
    raise ConcurrentChanges(f"{what}: the nodes kept changing ({attempts} attempts); nothing written")
