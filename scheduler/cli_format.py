"""How ``shardjob`` commands print for people: aligned tables and UTC times."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone

__all__ = ["format_table", "iso_utc"]


def iso_utc(stamp: float | None, *, timespec: str = "milliseconds") -> str:
    """``2026-01-31T02:00:00.000+00:00``; ``""`` for None."""
    return "" if stamp is None else datetime.fromtimestamp(stamp, timezone.utc).isoformat(timespec=timespec)


def format_table(header: Sequence[str] | None, rows: Sequence[Sequence[str]]) -> str:
    """Columns aligned to their widest cell (no header line when ``header`` is None); the
    last column is not padded, so a long message there does not widen the others."""
    table = ([] if header is None else [list(header)]) + [list(row) for row in rows]
    if not table:
        return ""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    lines = []
    for row in table:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(lines)
