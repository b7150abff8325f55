"""The layout version of a registry namespace: which arrangement of nodes its instances
write, so that releases of different layouts never misread each other on one registry.

``/.shardjob/layout`` holds ``{"layout": N, "release": "x.y.z"}`` — the layout every node
of the namespace follows and the release that last raised it. A namespace without the node
is at layout 1 (releases before the node existed). ``docs/upgrading.md`` lists what each
layout changed.

Invariants:

- An instance reads the node before it writes anything (``check_runnable``): a layout it
  cannot run on is an error naming both versions and the way forward, and the namespace is
  left untouched.
- The namespace only moves forward, one ``Migration`` at a time, each applied by a job's
  leader in ONE transaction fenced by its term together with the versioned write of the
  node: a deposed leader changes nothing, two leaders migrating at once apply it once (the
  loser's create or versioned set is refused), and a migration already applied is never
  applied again (it is chosen by the version stored).
- A migration that changes nodes older releases read must not run while instances of
  those releases are left (they read the layout only at start); layout 2's only adds the
  layout node, which releases before it never read (``docs/upgrading.md``).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from registry.errors import RegistryError, TransactionError
from registry.paths import join
from registry.protocol import Check, Create, Node, Op, RegistryCenter, Set
from registry.recipes.batch import Commit
from registry.recipes.cache import TreeCache
from registry.release import VERSION
from sharding.errors import ShardingError
from sharding.layout import SYSTEM_ROOT

__all__ = [
    "LAYOUT",
    "LAYOUT_NODE",
    "MIGRATIONS",
    "OLDEST_RUNNABLE",
    "LayoutUpgrader",
    "LayoutVersionError",
    "Migration",
    "StoredLayout",
    "check_runnable",
    "plan_upgrade",
    "read_layout",
]

log = logging.getLogger("sharding")

#: the node recording the namespace's layout (no job can be called so: ``validate_job_name``)
LAYOUT_NODE = join(SYSTEM_ROOT, "layout")
#: the layout this release writes
LAYOUT = 2
#: the oldest layout this release runs on, beside the instances of the release that wrote it
OLDEST_RUNNABLE = 1
#: what ``docs/upgrading.md`` is called in errors
_UPGRADE_GUIDE = "docs/upgrading.md"


class LayoutVersionError(ShardingError):
    """The namespace's layout is one this release cannot run on (or its node is unreadable)."""


@dataclass(frozen=True)
class StoredLayout:
    """The namespace's layout as stored: ``node`` is None for a namespace at layout 1."""

    layout: int
    release: str | None
    node: Node | None


def read_layout(node: Node | None) -> StoredLayout:
    """Decode the layout node; ``LayoutVersionError`` when it is not one this format."""
    if node is None:
        return StoredLayout(1, None, None)
    try:
        data = json.loads(node.value)
        layout = data["layout"]
        release = data.get("release")
    except (ValueError, TypeError, KeyError, AttributeError):
        raise LayoutVersionError(
            f"{LAYOUT_NODE} holds {node.value[:80]!r}, not a layout record; nothing was written "
            f"(see {_UPGRADE_GUIDE})"
        ) from None
    if not isinstance(layout, int) or isinstance(layout, bool) or layout < 1:
        raise LayoutVersionError(f"{LAYOUT_NODE}: layout {layout!r} is not a version number; nothing was written")
    return StoredLayout(layout, release if isinstance(release, str) else None, node)


def check_runnable(reg: RegistryCenter) -> StoredLayout:
    """Read the namespace's layout (one read) and refuse one this release cannot run on."""
    stored = read_layout(reg.get_node(LAYOUT_NODE))
    this = f"shardjob {VERSION} (layouts {OLDEST_RUNNABLE}-{LAYOUT})"
    writer = f", written by shardjob {stored.release}" if stored.release else ""
    if stored.layout > LAYOUT:
        raise LayoutVersionError(
            f"registry {reg.url} is at layout {stored.layout}{writer}, newer than {this} knows: "
            f"run a release that knows layout {stored.layout} on this instance (see {_UPGRADE_GUIDE}); "
            "nothing was written"
        )
    if stored.layout < OLDEST_RUNNABLE:
        raise LayoutVersionError(
            f"registry {reg.url} is at layout {stored.layout}{writer}, older than {this} runs on: "
            f"upgrade the fleet through a release that runs on layout {stored.layout} first "
            f"(see {_UPGRADE_GUIDE}); nothing was written"
        )
    return stored


@dataclass(frozen=True)
class Migration:
    """The change from layout ``source`` to ``source + 1``: ``ops`` are the namespace's
    writes beside the layout node's own (planned from a read of the namespace)."""

    source: int
    summary: str
    ops: Callable[[RegistryCenter], list[Op]]

    @property
    def target(self) -> int:
        return self.source + 1


def _no_changes(reg: RegistryCenter) -> list[Op]:
    return []


#: every layout change, in order: ``MIGRATIONS[i]`` takes layout ``i + 1`` to ``i + 2``
MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "the namespace records its layout version in /.shardjob/layout", _no_changes),
)
assert [m.source for m in MIGRATIONS] == list(range(1, LAYOUT)), "one migration per layout step"


def plan_upgrade(reg: RegistryCenter, stored: StoredLayout) -> list[Op]:
    """The writes that take the namespace from ``stored`` to ``LAYOUT``: every pending
    migration's, then the layout node's (a create when absent, else a write at the version
    read, so a concurrent upgrade refuses this one). ``[]`` when already there."""
    if stored.layout >= LAYOUT:
        return []
    ops: list[Op] = []
    for migration in MIGRATIONS[stored.layout - 1 :]:
        ops.extend(migration.ops(reg))
    value = json.dumps({"layout": LAYOUT, "release": VERSION}, sort_keys=True).encode()
    if stored.node is None:
        ops.append(Create(LAYOUT_NODE, value))
    else:
        ops.append(Set(LAYOUT_NODE, value, stored.node.version))
    return ops


class LayoutUpgrader:
    """Brings one namespace to ``LAYOUT``, driven by this process's job leaders: each calls
    ``upgrade(fence)`` when it leads; the first to get there migrates, fenced by its term.

    Cheap once done: the answer is kept, and until then the cache tells whether there is
    anything to do, so a thousand leaders cost one read and one transaction, not a thousand.
    """

    def __init__(self, reg: RegistryCenter, cache: TreeCache, commit: Commit | None = None) -> None:
        self._reg = reg
        self._cache = cache
        self._commit = reg.transaction if commit is None else commit
        self._lock = threading.Lock()
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    def upgrade(self, fence: Sequence[Check]) -> bool:
        """Migrate the namespace to ``LAYOUT`` in one transaction with ``fence`` (a leader's
        term); True once it is there. Never raises for a refused transaction (deposed, or
        another leader migrated first): the next leader's call settles it."""
        if self._done:
            return True
        if not self._lock.acquire(blocking=False):
            return False  # another leader of this process is at it
        try:
            cached = self._cache.get_node(LAYOUT_NODE)
            if cached is not None and read_layout(cached).layout >= LAYOUT:
                self._done = True
                return True
            stored = read_layout(self._reg.get_node(LAYOUT_NODE))
            ops = plan_upgrade(self._reg, stored)
            if ops:
                self._commit([*fence, *ops])
                log.info("registry %s: layout %d -> %d", self._reg.url, stored.layout, LAYOUT)
            self._done = True
            return True
        except TransactionError:
            return False  # deposed meanwhile, or another instance migrated first
        except (RegistryError, LayoutVersionError):
            log.warning("registry %s: layout upgrade failed; retried by the next leader", self._reg.url, exc_info=True)
            return False
        finally:
            self._lock.release()
