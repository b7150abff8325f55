"""Leader election on the protocol alone: an ephemeral node created if absent.

The leader is the client whose ephemeral node sits at the election path; everyone else
watches that path (no polling) and tries again when it is deleted. Leadership therefore
ends with the leader's session, on ``resign()``, or on ``stop()``.

Winning also advances a persistent *term* node (``<parent>/term``) in the same
transaction. Invariant: every write that must come from the current leader includes
``fence_ops()`` — the leader node exists and the term node is still at the version this
client's win left it at — so a stale leader (session expired, someone else elected since)
fails instead of writing. The term is what makes this airtight on every backend: a
re-created leader node may carry the same version as its predecessor (ZooKeeper restarts
data versions at 0), the never-deleted term node cannot.

A campaign that advanced a term it found in the cache learns the version it left from the
cache too: the first state the cache shows with the new value is the campaign's own write.
The cache applies changes in order and had reached the term it advanced, so no earlier
state comes back; while the claim stands no other candidate advances the term, and a term
only grows. A campaign that created the first term, or advanced one read from the
registry, reads it back: a lagging cache could yet show an earlier incarnation's term of
the same value (a job deleted and made again), whose version would fence every write out.
So does one whose cache has not shown its write within ``_WON_TERM_WAIT``, and one run
inline on an event or session thread (no ``defer``): the cache's events wait behind it.

Hazard: a campaign is a transaction and a read. The election hears of a deleted leader
node and of a new session on the registry's (or the cache's) event and session threads,
which every watch and listener of the client shares; a campaign run there holds them all
for its round trips. With ``defer`` those campaigns run where it puts them: after a
session expired at 10,000 jobs, 10,000 campaigns one after the other on the event thread
held back every cache update for minutes, and with them every job's re-registration.

With ``follow=False`` the election adds no listener of its own: its owner hands it every
change of the election's node (``on_event``) and of the session (``on_session``) from
the listeners the owner keeps anyway, as a sharding service does for each of its jobs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from registry.errors import RegistryError, TransactionError
from registry.paths import is_below, join, parent, shared
from registry.protocol import (
    Check,
    Create,
    Delete,
    Event,
    EventKind,
    Node,
    RegistryCenter,
    SessionState,
    Set,
    Watch,
)
from registry.recipes.batch import Commit
from registry.recipes.cache import TreeCache
from registry.shared_values import shared_value

__all__ = ["LeaderElection"]

log = logging.getLogger("registry.election")

#: how long a campaign waits for the cache to show its term before reading it (seconds)
_WON_TERM_WAIT = 2.0


class LeaderElection:
    """Campaign for the node at ``path`` with ``identifier`` as its value."""

    # one per job, thousands per process: no attribute dict (a new attribute goes here)
    __slots__ = (
        "_cache",
        "_commit",
        "_defer",
        "_follow",
        "_identifier",
        "_lock",
        "_on_elected",
        "_on_revoked",
        "_participating",
        "_path",
        "_reg",
        "_started",
        "_stopped",
        "_term_path",
        "_version",
        "_watch",
    )

    def __init__(
        self,
        reg: RegistryCenter,
        path: str,
        identifier: str,
        *,
        on_elected: Callable[[], None] | None = None,
        on_revoked: Callable[[], None] | None = None,
        cache: TreeCache | None = None,
        commit: Commit | None = None,
        defer: Callable[[Callable[[], object]], object] | None = None,
        follow: bool = True,
    ) -> None:
        self._reg = reg
        #: False: the owner hands over the election's changes (``on_event``, ``on_session``)
        #: from listeners it has anyway. Hazard: each listener is a bound method and an
        #: entry in the cache's and the registry's tables, two more a job for a service
        #: that runs thousands
        self._follow = follow
        # the campaign's and resignation's transactions (a group commit when given)
        self._commit = reg.transaction if commit is None else commit
        # with a cache that covers the path, follow it through the cache's one watch
        # instead of a watch of our own (1,000 jobs: one watch, not 1,000)
        self._cache = cache if cache is not None and is_below(path, cache.root) else None
        self._path = path
        self._identifier = shared_value(identifier.encode())  # every job's election: one id
        self._on_elected = on_elected
        self._on_revoked = on_revoked
        #: where campaigns that an event or a session change calls for run (None: inline)
        self._defer = defer
        self._lock = threading.RLock()
        #: ``shared``: the one ``str`` the cache keys the term node by, not a copy per election
        self._term_path = shared(join(parent(path), "term"))
        self._version: int | None = None  # the term node's version while we lead
        self._participating = False
        self._stopped = False  # after stop(), nothing makes this client campaign again
        self._watch: Watch | None = None
        self._started = False

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
        """The term node's version of our win, while leading (the fencing token)."""
        return self._version

    def fence_ops(self) -> list[Check]:
        """Checks to put first in a transaction that only the current leader may apply."""
        version = self._version
        if version is None:
            raise RegistryError(f"not the leader at {self._path}")
        return [Check(self._path), Check(self._term_path, version)]

    def leader(self) -> str | None:
        """The current leader's identifier, read from the registry."""
        value = self._reg.get(self._path)
        return None if value is None else value.decode(errors="replace")

    def start(self, *, participate: bool = True) -> None:
        """Follow the election and, if ``participate``, campaign (may lead on return)."""
        with self._lock:
            if self._watch is not None or self._started:
                return
            self._started = True
            self._participating = participate
        if self._follow:
            self._reg.add_listener(self.on_session)
            if self._cache is not None:
                self._cache.add_listener(self.on_event, under=self._path)
            else:
                self._watch = self._reg.watch(self._path, self.on_event)
        self.campaign()

    def withdraw(self) -> None:
        """Never campaign again, but keep leadership (if held) until ``stop()``.

        A leader that leaves withdraws first: once its other nodes are gone an operator
        may delete the whole job, and the deletion of the leader node must not make it
        campaign, which would create the job's nodes again."""
        with self._lock:
            self._participating = False
            self._stopped = True

    def stop(self) -> None:
        """Leave the election for good, handing leadership over at once if held."""
        self.withdraw()
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if self._follow:
            if self._cache is not None:
                self._cache.remove_listener(self.on_event, under=self._path)
            self._reg.remove_listener(self.on_session)
        self.resign()

    def resign(self) -> None:
        """Give up leadership now (others are elected at once); stay a candidate only if
        still participating."""
        with self._lock:
            version, self._version = self._version, None
        if version is None:
            return
        try:
            self._commit([Check(self._term_path, version), Delete(self._path)])
        except TransactionError:
            pass  # another term began: the node (if any) is someone else's
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
            if self._stopped:
                return
            self._participating = True
        self.campaign()

    def campaign(self) -> bool:
        """Try to become leader; True if this client leads afterwards."""
        return self._campaign(cache_wait=True)

    def _campaign(self, *, cache_wait: bool) -> bool:
        """``campaign``; ``cache_wait`` False on a thread that delivers the cache's events,
        where waiting for the cache would wait for itself (``_won_term``)."""
        with self._lock:
            if not self._participating:
                return False
            if self._version is not None:
                return True
            for attempt in range(10):
                # the cache's term first (no round trip): a stale one only fails the
                # transaction, and the next attempt reads the registry
                term = (
                    self._cache.get_node(self._term_path)
                    if attempt == 0 and self._cache is not None
                    else self._reg.get_node(self._term_path)
                )
                advance = (
                    Create(self._term_path, b"1")
                    if term is None
                    else Set(self._term_path, str(_term_number(term.value) + 1).encode(), term.version)
                )
                claim = Create(self._path, self._identifier, ephemeral=True)
                try:
                    self._commit([claim, advance])
                except TransactionError as exc:
                    if exc.op is claim:
                        return self._adopt_existing()
                    continue  # another candidate advanced the term meanwhile: read it again
                except RegistryError:
                    log.warning(
                        "campaign for %s failed; retrying on the next change", self._path, exc_info=True
                    )
                    return False
                won = self._won_term(advance.value, cached=cache_wait and attempt == 0 and term is not None)
                if won is None:
                    return False
                self._version = won.version
                break
            else:
                return False
        self._elected()
        return True

    def _won_term(self, value: bytes, *, cached: bool) -> Node | None:
        """The term node as this campaign's write left it: from the cache (module
        docstring) when the term it advanced came from there, else read."""
        cache = self._cache
        if cached and cache is not None:
            path = self._term_path

            def written() -> bool:
                node = cache.get_node(path)
                return node is not None and node.value == value

            if cache.wait_until(written, _WON_TERM_WAIT, under=path):
                return cache.get_node(path)
        return self._reg.get_node(self._term_path)

    def _adopt_existing(self) -> bool:
        """Our own node may survive a reconnect with the session intact: keep leading."""
        node = self._reg.get_node(self._path)
        if node is None or node.value != self._identifier or not node.ephemeral:
            return False
        term = self._reg.get_node(self._term_path)
        if term is None:
            return False
        self._version = term.version
        self._elected()
        return True

    def on_event(self, event: Event) -> None:
        """A change at or below the election's path (any other is ignored): its own
        listener's, or handed over by the owner of an election made with ``follow=False``."""
        if event.path != self._path:
            return
        if event.kind is EventKind.DELETED:
            if self._version is not None:
                with self._lock:
                    self._version = None
                self._revoked()
            self._campaign_later()

    def fenced_out(self, error: TransactionError) -> None:
        """A write guarded by ``fence_ops()`` failed with ``error``. When the op that failed
        is the check of the leader node, that node is gone: the term ends here and a new
        campaign begins, as on the node's deletion.

        Hazard: the failed write may be the only news of it. A watch reports changes, not
        every state: ZooKeeper's watch hears of a new node and reads it afterwards, so a
        node created and deleted before that read never shows up, and its winner would
        lead forever, every fenced write failing."""
        op = error.op
        if isinstance(op, Check) and op.path == self._path and op.version is None:
            self.on_event(Event(EventKind.DELETED, self._path, None, None))

    def on_session(self, state: SessionState) -> None:
        """A session change: its own listener's, or handed over (``follow=False``)."""
        if state is SessionState.LOST:
            with self._lock:
                version, self._version = self._version, None
            if version is not None:
                self._revoked()
        elif state in (SessionState.CONNECTED, SessionState.RECONNECTED):
            self._campaign_later()

    def _campaign_later(self) -> None:
        """Campaign off the calling (shared) thread when a ``defer`` was given."""
        if self._defer is None:
            self._campaign(cache_wait=False)
            return
        try:
            self._defer(self.campaign)
        except RuntimeError:  # the executor was shut down: the scheduler is stopping
            pass

    def _elected(self) -> None:
        log.info("%s: elected at %s", self._identifier.decode(errors="replace"), self._path)
        if self._on_elected is not None:
            self._on_elected()

    def _revoked(self) -> None:
        log.info("%s: no longer leader at %s", self._identifier.decode(errors="replace"), self._path)
        if self._on_revoked is not None:
            self._on_revoked()


def _term_number(raw: bytes) -> int:
    try:
        return int(raw.decode())
    except (UnicodeDecodeError, ValueError):
        return 0  # overwritten by someone else: the version still fences, restart counting
