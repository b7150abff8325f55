"""A job's configuration as a scheduler's cache keeps it: its fields that a default
configuration has too, each as a two-byte reference.

A job's config node holds its ``JobConfig`` as JSON with sorted keys, about 600 bytes,
nearly all of them fields that every job's config repeats (``"misfire":true``). A
scheduler's cache on ZooKeeper or etcd held each as read off the wire. The packed form
cuts the JSON at every ``,"`` (between two fields, and wherever a value holds those two
characters) and keeps each piece that a default job's config has as ``\\x01`` and its
index, the others as they are, the pieces joined by ``\\x02``: a default job's config is
kept in about 110 bytes of its 578.

Invariants: ``unpack(pack(path, value)) == value``, for any bytes: a value holding a byte
below 0x20 (which JSON text never holds unescaped, so a config never does) is not packed,
so the two markers cannot occur in a piece kept as it is, and an index byte is 0x20 or
above. The default config never leaves the process (the registry holds the JSON as
written), so a release that changes ``JobConfig``'s fields changes nothing stored.

Hazard: packing runs on the registry's event thread, which every job's changes wait on.
zlib (deflate with the default config as its preset dictionary kept a config in 22
bytes) releases the GIL for each call, and with other threads busy each call waited up
to the interpreter's switch interval to take it back: 1-5 ms a config, which made
10,000 jobs' start-up slower and their reshardings race (measured: ``BENCHMARKS.md``).
Splitting and joining bytes keep the GIL and take a few microseconds.
"""

from __future__ import annotations

import re

from scheduler.config import JobConfig
from sharding.layout import is_config

__all__ = ["ConfigPacking"]

#: where a config's JSON is cut: between two of its fields (sorted keys, compact)
_CUT = b',"'
#: between two pieces of a packed form
_NEXT = b"\x02"
#: a piece of the default config: this byte, then its index plus ``_INDEX_BASE``
_REFERENCE = b"\x01"
_INDEX_BASE = 0x20
_CONTROL = re.compile(rb"[\x00-\x1f]")
#: a packed form is kept only when it saves this much: as a bytes subclass it costs 16
#: bytes more than bytes (the garbage collector's header)
_WORTH = 64


class ConfigPacking:
    """``registry.recipes.cache.ValuePacking`` of every job's config node."""

    def __init__(self) -> None:
        pieces = JobConfig(name="job", cron="0 0 0 * * ?").to_json().split(_CUT)
        self._pieces = pieces[: 256 - _INDEX_BASE]
        self._references = {piece: _REFERENCE + bytes((_INDEX_BASE + i,)) for i, piece in enumerate(self._pieces)}

    def pack(self, path: str, value: bytes) -> bytes | None:
        if not is_config(path) or _CONTROL.search(value) is not None:
            return None
        references = self._references
        packed = _NEXT.join([references.get(piece, piece) for piece in value.split(_CUT)])
        return packed if len(packed) <= len(value) - _WORTH else None

    def unpack(self, packed: bytes) -> bytes:
        pieces = self._pieces
        return _CUT.join(
            [
                pieces[piece[1] - _INDEX_BASE] if piece[:1] == _REFERENCE else piece
                for piece in packed.split(_NEXT)
            ]
        )
