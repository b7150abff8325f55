"""A local copy of a subtree, kept current by ONE watch (what Curator's TreeCache is to
ElasticJob): steady-state reads cost no registry round trip.

Invariant: after ``start()`` returns, the cache holds at least the state of the subtree at
that moment, and it then applies every change in the order the watch delivers it (the
watch itself resynchronises after reconnects and new sessions). Readers therefore see a
state that the registry really had, possibly a little behind it — code that must not act
on a stale view re-checks inside a transaction (versions, ``Check``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from registry.children import ChildIndex
from registry.errors import RegistryError
from registry.paths import basename, excluded_below, is_below, parent, shared, validate_path
from registry.protocol import Event, EventKind, Node, RegistryCenter, Watch
from registry.shared_values import shared_number, shared_pair, shared_value

__all__ = ["TreeCache", "ValuePacking"]

ChangeListener = Callable[[Event], None]

#: a cached node: its version when its value is empty, its value when its version is 0,
#: else both (``TreeCache._nodes``)
_Entry = tuple[bytes, int] | bytes | int


class ValuePacking(Protocol):
    """How a cache keeps the values of some nodes in less memory (``TreeCache``'s
    ``packing``). Invariant: ``unpack(pack(path, value)) == value`` whenever ``pack``
    gives a form; None keeps the value as it is."""

    def pack(self, path: str, value: bytes) -> bytes | None: ...

    def unpack(self, packed: bytes) -> bytes: ...


class _Packed(bytes):
    """A value kept as its ``ValuePacking`` form: read back through ``unpack``. A bytes
    subclass, so an entry keeps its shapes (``_Entry``) and a read tells it by its type."""

    __slots__ = ()


#: absent paths ``_check`` remembers as valid (bounded: arbitrary reads cannot pile up)
_CHECKED_MEMO = 65_536


class TreeCache:
    """Mirror of ``path`` and everything below it, but for the subtrees ``exclude`` names
    and what lies below the nodes ``leaves`` names (see ``RegistryCenter.watch``): reading
    one of those raises, as a path outside would."""

    def __init__(
        self,
        reg: RegistryCenter,
        path: str,
        *,
        exclude: Callable[[str], bool] | None = None,
        leaves: Callable[[str], bool] | None = None,
        packing: ValuePacking | None = None,
    ) -> None:
        self._reg = reg
        self._root = validate_path(path)
        self._exclude = exclude
        self._leaves = leaves
        self._packing = packing
        #: absent paths already checked: the flags a fire reads and usually finds absent.
        #: A node leaves it when it is cached (a cached node passed the checks when its
        #: event was applied, and reads find it without them), and a present node named
        #: by the rare calls that check it anyway (``children``) is not kept. Hazard: a
        #: set keeps the table size of its peak, reached while jobs start and read their
        #: nodes before they exist (2 MiB at 10,000 jobs); so once more paths left it than
        #: are in it, it is copied to a table of its size (``_forget_checked``)
        self._checked: set[str] = set()
        self._checked_left = 0
        #: (value, version) by path: plain tuples, which the garbage collector stops
        #: tracking, where Node objects (a dozen per job) made each full collection longer.
        #: A node with an empty value (seven of a job's thirteen: the parents) is its bare
        #: version, and a node of version 0 with a value (ZooKeeper's never-changed node:
        #: a job's config, registration, election and servers) is its bare value: each
        #: spares the tuple's 56 bytes. Values, versions and (value, version) pairs equal
        #: to other nodes' are one object (``registry.shared_values``); a packed value's
        #: pair is its own, since its type, not only its bytes, tells it apart.
        self._nodes: dict[str, _Entry] = {}
        #: children by parent, only for nodes that have some
        self._kids = ChildIndex()
        #: reentrant: a ``wait_until`` predicate reads the cache under it
        self._lock = threading.RLock()
        #: wakes waiters on any change; ``_path_waits`` wakes those that follow one subtree
        self._changed = threading.Condition(self._lock)
        #: ``wait_until`` calls waiting on ``_changed``: a change notifies it only while
        #: there are some (a start applies a change per node of every job, nearly all with
        #: nobody waiting on the whole cache)
        self._whole_waits = 0
        #: subtree -> (its condition, its waiter count). Hazard: with 1,000 jobs starting
        #: side by side, waking every waiter on every change (each re-checking under the
        #: lock) made the waits, not the registry, the bottleneck of ``start()``
        self._path_waits: dict[str, tuple[threading.Condition, int]] = {}
        # listeners by the subtree they follow: an event reaches only those at or above its
        # path, found by walking its few ancestors, so 1,000 jobs sharing one cache cost
        # O(depth) per event, not O(jobs). Tuples, replaced on change: a job follows half
        # a dozen subtrees with one listener each, and a tuple of one is 40 bytes lighter
        # than a list
        self._listeners: dict[str, tuple[ChangeListener, ...]] = {}
        self._watch: Watch | None = None
        #: set by close(): nothing changes any more, so no waiter may go on waiting
        self._closed = False

    @property
    def root(self) -> str:
        return self._root

    def start(self, timeout: float = 10.0) -> TreeCache:
        """Load the subtree and follow it; returns once the initial state is loaded."""
        if self._watch is not None:
            return self
        self._closed = False
        self._watch = self._reg.watch(
            self._root, self._apply, initial=True, exclude=self._exclude, leaves=self._leaves
        )
        if not self._reg.flush_events(timeout):
            self.close()
            raise RegistryError(f"cache of {self._root}: initial load not delivered within {timeout:g}s")
        return self

    def close(self) -> None:
        """Stop following the subtree and wake every ``wait_until``: a closed cache never
        changes again, and a waiter left waiting would hold up its owner's shutdown (a
        leader waiting to see its last write while its scheduler shuts down did, 30 s)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
            for condition, _ in self._path_waits.values():
                condition.notify_all()
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None

    def add_listener(self, listener: ChangeListener, under: str | None = None) -> None:
        """Call ``listener`` (on the registry's event thread) after each change applied at
        or below ``under`` (default: the whole cached subtree)."""
        path = self._root if under is None else under
        self._check(path)
        with self._changed:
            self._listeners[shared(path)] = (*self._listeners.get(path, ()), listener)

    def remove_listener(self, listener: ChangeListener, under: str | None = None) -> None:
        path = self._root if under is None else under
        with self._changed:
            listeners = list(self._listeners.get(path, ()))
            if listener in listeners:
                listeners.remove(listener)
            if listeners:
                self._listeners[path] = tuple(listeners)
            else:
                self._listeners.pop(path, None)

    # -- reads (no round trip) -----------------------------------------------------------
    def get(self, path: str) -> bytes | None:
        entry = self._entry(path)
        if entry is None:
            return None
        if isinstance(entry, int):
            return b""
        value = entry if isinstance(entry, bytes) else entry[0]
        return self._unpacked(value) if type(value) is _Packed else value

    def get_node(self, path: str) -> Node | None:
        entry = self._entry(path)
        return None if entry is None else self._node(entry)

    def held(self, path: str) -> Node | None:
        """``get_node`` without checking an absent path, for a path the caller built itself
        that a hot path asks for and that is mostly absent (a job's resharding flag and its
        disabled items, on every fire). ``get_node`` checks an absent path once and
        remembers it as checked: a path and a memo entry per job and node, for as long as
        the node stays absent. Here a path the cache could never hold (outside it,
        excluded, malformed) is absent, where ``get_node`` raises ``ValueError``."""
        entry = self._nodes.get(path)  # one dict read is atomic, as in _entry
        return None if entry is None else self._node(entry)

    def _node(self, entry: _Entry) -> Node:
        if isinstance(entry, int):
            return Node(b"", entry)
        value, version = (entry, 0) if isinstance(entry, bytes) else entry
        return Node(self._unpacked(value) if type(value) is _Packed else value, version)

    def exists(self, path: str) -> bool:
        return self._entry(path) is not None

    def version(self, path: str) -> int | None:
        """The cached node's version (None when absent): a fire's checks, without a Node."""
        entry = self._entry(path)
        if entry is None or isinstance(entry, int):
            return entry
        return 0 if isinstance(entry, bytes) else entry[1]

    def children(self, path: str) -> list[str]:
        self._check(path)
        with self._changed:
            return sorted(basename(p) for p in self._kids.of(path))

    def wait_until(
        self, predicate: Callable[[], bool], timeout: float | None, *, under: str | None = None
    ) -> bool:
        """Wait for ``predicate`` (evaluated under the cache lock) to hold, woken by changes
        — only by those at or below ``under`` when given, so the predicate must depend on
        nothing else; False when ``timeout`` runs out or the cache is closed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            if predicate():
                return True
            if under is None:
                condition = self._changed
                self._whole_waits += 1
            else:
                condition = self._enter_wait(under)
            try:
                while not predicate():
                    if self._closed:
                        return False
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return False
                    condition.wait(remaining)
                return True
            finally:
                if under is None:
                    self._whole_waits -= 1
                else:
                    self._leave_wait(under)

    def wake(self) -> None:
        """Wake every ``wait_until`` to evaluate its predicate again: for a predicate that
        also reads a flag outside the cache, after that flag changed."""
        with self._changed:
            self._changed.notify_all()
            for condition, _ in self._path_waits.values():
                condition.notify_all()

    def _enter_wait(self, under: str) -> threading.Condition:
        condition, waiters = self._path_waits.get(under) or (threading.Condition(self._lock), 0)
        self._path_waits[under] = (condition, waiters + 1)
        return condition

    def _leave_wait(self, under: str) -> None:
        condition, waiters = self._path_waits[under]
        if waiters == 1:
            del self._path_waits[under]
        else:
            self._path_waits[under] = (condition, waiters - 1)

    # -- maintenance -----------------------------------------------------------------------
    def _entry(self, path: str) -> _Entry | None:
        """The node's entry in ``_nodes`` (``_Entry``)."""
        # one dict read is atomic: no lock on the path every fire takes
        entry = self._nodes.get(path)
        if entry is None:  # a cached node passed the checks when its event was applied
            self._check(path)
        return entry

    def _check(self, path: str) -> None:
        if path in self._checked:
            return
        validate_path(path)
        if not is_below(path, self._root):
            raise ValueError(f"{path!r} is outside the cached subtree {self._root!r}")
        if self._exclude is not None and excluded_below(path, self._root, self._exclude):
            raise ValueError(f"{path!r} is in a subtree the cache of {self._root!r} excludes")
        leaves = self._leaves
        if leaves is not None and excluded_below(path, self._root, lambda p: leaves(parent(p))):
            raise ValueError(f"{path!r} lies below a node the cache of {self._root!r} treats as a leaf")
        if path not in self._nodes:
            if len(self._checked) >= _CHECKED_MEMO:
                self._checked.clear()
            # not ``shared``: nothing else holds an absent path, and interned it held an
            # entry in the interpreter's table of interned strings as well
            self._checked.add(path)

    def _apply(self, event: Event) -> None:
        with self._changed:
            if event.kind is EventKind.DELETED:
                self._nodes.pop(event.path, None)
                self._kids.pop(event.path)
                if event.path != self._root:
                    self._kids.discard(parent(event.path), event.path)
            else:
                assert event.value is not None
                path = shared(event.path)
                version = shared_number(event.version) if event.version is not None else -1
                value = event.value
                if not value:
                    self._nodes[path] = version
                else:
                    value = self._kept(path, value)
                    if version == 0:
                        self._nodes[path] = value
                    elif type(value) is _Packed:
                        self._nodes[path] = (value, version)
                    else:
                        self._nodes[path] = shared_pair(value, version)
                if path in self._checked:
                    self._forget_checked(path)
                if path != self._root:
                    self._kids.add(parent(path), path)
            if self._whole_waits:
                self._changed.notify_all()
            lineage = _self_and_ancestors(event.path)
            if self._path_waits:
                for p in lineage:
                    waits = self._path_waits.get(p)
                    if waits is not None:
                        waits[0].notify_all()
            targets = [fn for p in lineage for fn in self._listeners.get(p, ())]
        for listener in targets:
            listener(event)

    def _kept(self, path: str, value: bytes) -> bytes:
        """The object the cache keeps of a node's value: its packed form when ``packing``
        gives one, else the one object of equal values (``shared_value``)."""
        packing = self._packing
        if packing is not None:
            packed = packing.pack(path, value)
            if packed is not None:
                return _Packed(packed)
        return shared_value(value)

    def _unpacked(self, packed: bytes) -> bytes:
        assert self._packing is not None  # only a cache with packing keeps _Packed values
        return self._packing.unpack(packed)

    def _forget_checked(self, path: str) -> None:
        """``path`` is cached: out of the memo, which is copied once more paths left it than
        it holds (a copy per as many discards: O(1) each, amortised). Not locked, as the
        memo's other writers (``_check``): a path lost to a race is checked again."""
        self._checked.discard(path)
        self._checked_left += 1
        if self._checked_left > len(self._checked):
            self._checked = set(self._checked)
            self._checked_left = 0


def _self_and_ancestors(path: str) -> list[str]:
    out = [path]
    while path != "/":
        path = parent(path)
        out.append(path)
    return out
