"""Tiny inline SVG sparklines (no JS library): a polyline of values, oldest first.

Pure functions of their input; the caller escapes nothing, since the output holds only
numbers formatted here.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["sparkline_svg"]


def sparkline_svg(values: Sequence[float], *, width: int = 160, height: int = 28, label: str = "") -> str:
    """An ``<svg>`` with one polyline scaled to the values' range; an empty string when
    there are fewer than two values. ``label`` (plain words) becomes its ``aria-label``."""
    if len(values) < 2:
        return ""
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    step = width / (len(values) - 1)
    points = " ".join(
        f"{i * step:.1f},{height - 2 - (v - low) / span * (height - 4):.1f}" for i, v in enumerate(values)
    )
    safe_label = "".join(c for c in label if c.isalnum() or c in " -_.,:()")
    return (
        f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="{safe_label}"><polyline fill="none" stroke="currentColor" '
        f'stroke-width="1.5" points="{points}"/></svg>'
    )
