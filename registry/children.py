"""Children by parent, for the maps that mirror a tree (the cache, the memory store, a
ZooKeeper tree watch).

Invariant: a parent is in the index exactly while it has at least one child; a parent with
one child maps to that child's path itself, one with more to a dict of them (insertion
ordered, O(1) to add and remove, which a namespace root with 10,000 jobs needs). Four of a
job's six parents have a single child, and a dict of one costs 232 bytes: 1.1 KiB per job
in each of the two such maps a process holds (the cache, and the memory store or a
ZooKeeper tree watch). Paths are keyed by ``shared(path)``.

Not locked: each owner guards its index with the lock that guards the rest of its tree.
"""

from __future__ import annotations

from collections.abc import Iterable

from registry.paths import shared

__all__ = ["ChildIndex"]


class ChildIndex:
    """parent path -> its children's paths (module docstring)."""

    __slots__ = ("_by_parent",)

    def __init__(self) -> None:
        self._by_parent: dict[str, str | dict[str, None]] = {}

    def of(self, parent: str) -> tuple[str, ...]:
        """The children of ``parent``, in the order they were added (a copy: the caller
        may change the index while it goes through them)."""
        kids = self._by_parent.get(parent)
        if kids is None:
            return ()
        if isinstance(kids, str):
            return (kids,)
        return tuple(kids)

    def add(self, parent: str, child: str) -> None:
        kids = self._by_parent.get(parent)
        if kids is None:
            self._by_parent[shared(parent)] = shared(child)
        elif isinstance(kids, str):
            if kids != child:
                self._by_parent[parent] = {kids: None, shared(child): None}
        else:
            kids[shared(child)] = None

    def add_all(self, parent: str, children: Iterable[str]) -> None:
        for child in children:
            self.add(parent, child)

    def discard(self, parent: str, child: str) -> None:
        """Forget ``child`` of ``parent``; a parent left with none leaves the index."""
        kids = self._by_parent.get(parent)
        if kids is None:
            return
        if isinstance(kids, str):
            if kids == child:
                del self._by_parent[parent]
            return
        kids.pop(child, None)
        if len(kids) == 1:
            self._by_parent[parent] = next(iter(kids))
        elif not kids:
            del self._by_parent[parent]

    def pop(self, parent: str) -> None:
        """Forget every child of ``parent``."""
        self._by_parent.pop(parent, None)

    def clear(self) -> None:
        self._by_parent.clear()

    def __contains__(self, parent: object) -> bool:
        return parent in self._by_parent

    def __len__(self) -> int:
        """The number of parents with children."""
        return len(self._by_parent)
