"""``TextEnum``: an enum whose members are their text.

A ``(str, Enum)`` member compares equal to its text and serialises as it (``json``), but on
Python 3.11 ``str()`` and f-strings give ``Class.NAME``: a URL, a log line or an error
message built from one would read ``Backend.ETCD://`` or ``FenceReason.RUNNING``. Members
of this base print as their value on every supported Python (``enum.StrEnum`` is 3.11+).
"""

from __future__ import annotations

import enum

__all__ = ["TextEnum"]


class TextEnum(str, enum.Enum):
    def __str__(self) -> str:
        return str(self.value)
