"""One object for equal small values and numbers that many nodes hold at once.

Hazard: a process of thousands of jobs holds the same values at the same place in every
job (``ENABLED``, this instance's registration, the elected instance's id, an assignment
of the same items), and the same number in every node one transaction wrote (its
revision, or ZooKeeper's creation stamp), yet every read and every event makes its own
``bytes`` or ``int`` object of them; the cache and a watch's reported versions keep those
for as long as the node lives.

Trick: a bounded table maps a value to the first equal object seen, and the maps that
keep a node's value or number store what the table gives. The table is cleared when a
value not in it finds it full, so values seen once (a run's mark, a registration) cost a
slot for a while and nothing after, and an object leaves memory once no node holds it.
A clear only means an equal value met next is kept as a new object; no caller relies on
identity. Tables are plain dicts read and written without a lock: each step is one
atomic dict call, and a race costs a second equal object, never a wrong one.
"""

from __future__ import annotations

from typing import TypeVar

__all__ = ["shared_number", "shared_pair", "shared_value"]

#: a longer value is its job's own (a config); comparing and keeping it saves nothing
_LONGEST_SHARED = 512
#: entries a table keeps before it starts again: at most about 150 KiB of values no node
#: holds any more. A value every job holds alike is kept again once per clear: at 10,000
#: jobs a few dozen copies, where each job held its own
_TABLE_SIZE = 1024

_T = TypeVar("_T", bytes, int)

_values: dict[bytes, bytes] = {}
_numbers: dict[int, int] = {}
_pairs: dict[tuple[bytes, int], tuple[bytes, int]] = {}


def shared_value(value: bytes) -> bytes:
    """The one object kept for ``value`` while the table holds it; ``value`` itself for
    a value longer than 512 bytes."""
    return value if len(value) > _LONGEST_SHARED else _kept(_values, value)


def shared_number(number: int) -> int:
    """The one object kept for ``number`` while the table holds it (CPython keeps one of
    each small int, -5 to 256, itself)."""
    return number if -5 <= number <= 256 else _kept(_numbers, number)


def shared_pair(value: bytes, number: int) -> tuple[bytes, int]:
    """The one ``(value, number)`` tuple kept while the table holds an equal one: nodes
    one transaction wrote alike (every job's ``ENABLED`` server, its registration, in a
    batch of jobs starting together) hold one tuple of a value and its revision on etcd.

    Invariant: the tuple holds the objects ``shared_value`` and ``shared_number`` give
    now, so a node kept as a pair and one kept as its bare value hold one object of an
    equal value. The tables are cleared apart, so a pair kept from before the value
    table's last clear holds an older equal object: it is replaced, not given.
    Hazard: equal means equal as ``bytes``; a caller whose value type means more than
    its bytes (the cache's packed configs) must not share it."""
    value, number = shared_value(value), shared_number(number)
    pair = (value, number)
    if len(value) > _LONGEST_SHARED:
        return pair
    found = _pairs.get(pair)
    if found is not None and found[0] is value and found[1] is number:
        return found
    if len(_pairs) >= _TABLE_SIZE:
        _pairs.clear()
    _pairs[pair] = pair
    return pair


def _kept(table: dict[_T, _T], item: _T) -> _T:
    """``table``'s object equal to ``item``, or ``item`` once kept; a full table is
    cleared only for an item not in it."""
    found = table.get(item)
    if found is None:
        if len(table) >= _TABLE_SIZE:
            table.clear()
        found = table.setdefault(item, item)
    return found
