"""Children by parent, for the maps that mirror a tree (the cache, the memory store).

Invariant: a parent is in the index exactly while it has at least one child, and its
children are kept in the order they were added, in the smallest shape that holds them:

- one child: that child's path itself;
- up to ``_SMALL`` children: a tuple of their paths, replaced on each change;
- more: a dict of them (insertion ordered, O(1) to add and remove, which a namespace root
  with 10,000 jobs or a job with hundreds of instances needs), turned back into a tuple
  once it is down to ``_SMALL // 2`` (not at ``_SMALL``: a parent going up and down
  around the bound would convert on every change).

A job's parents have one, two or six children each. A dict of two is 184 bytes and one of
six 272, where tuples of them are 56 and 88: about 300 bytes a job in each such map a
process holds (the cache, and on the memory backend its store).
Tuples of strings also drop out of the garbage collector's lists, where a dict stays.
Paths are keyed by ``shared(path)``.

Not locked: each owner guards its index with the lock that guards the rest of its tree.
"""

from __future__ import annotations

from collections.abc import Iterable

from registry.paths import shared

__all__ = ["ChildIndex"]

#: the most children a parent keeps in a tuple (adding one copies it: O(children))
_SMALL = 16

_Kids = str | tuple[str, ...] | dict[str, None]


class ChildIndex:
    """parent path -> its children's paths (module docstring)."""

    __slots__ = ("_by_parent",)

    def __init__(self) -> None:
        self._by_parent: dict[str, _Kids] = {}

    def of(self, parent: str) -> tuple[str, ...]:
        """The children of ``parent``, in the order they were added (a copy: the caller
        may change the index while it goes through them)."""
        kids = self._by_parent.get(parent)
        if kids is None:
            return ()
        if isinstance(kids, str):
            return (kids,)
        return kids if isinstance(kids, tuple) else tuple(kids)

    def add(self, parent: str, child: str) -> None:
        kids = self._by_parent.get(parent)
        if kids is None:
            self._by_parent[shared(parent)] = shared(child)
        elif isinstance(kids, str):
            if kids != child:
                self._by_parent[parent] = (kids, shared(child))
        elif isinstance(kids, tuple):
            if child in kids:
                return
            if len(kids) < _SMALL:
                self._by_parent[parent] = (*kids, shared(child))
            else:
                grown = dict.fromkeys(kids)
                grown[shared(child)] = None
                self._by_parent[parent] = grown
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
        if isinstance(kids, tuple):
            if child not in kids:
                return
            left = tuple(k for k in kids if k != child)
        else:
            kids.pop(child, None)
            if len(kids) > _SMALL // 2:
                return
            left = tuple(kids)
        if len(left) > 1:
            self._by_parent[parent] = left
        elif left:
            self._by_parent[parent] = left[0]
        else:
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
