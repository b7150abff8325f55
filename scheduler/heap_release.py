"""Handing the heap a start-up freed back to the operating system.

Hazard: starting thousands of jobs grows the maps that hold an entry per node or per job
(the cache, the memory store, a watch's versions, the interpreter's table of interned
strings) by doubling, and each growth frees the table it replaces. glibc's malloc keeps
such freed blocks inside its heap for later requests, and their pages stay in the
process's resident set: at 10,000 jobs, about a tenth of the process's RSS was free memory
nothing would ask for again (BENCHMARKS.md, "Many jobs").

The trick: glibc's ``malloc_trim(0)`` releases the free pages anywhere in its heap, not only
at its top (it ``madvise``-s them away; the blocks stay free and usable). It frees nothing
in use, so calling it once a start-up is over is safe in any process, an application's
own included. Without glibc (musl, macOS) there is no such call, and nothing is done.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable

__all__ = ["release_free_heap"]

log = logging.getLogger(__name__)


def _find_malloc_trim() -> Callable[[int], int] | None:
    try:
        process = ctypes.CDLL(None)  # the symbols the process already has, libc's among them
    except OSError:
        return None
    trim = getattr(process, "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim  # type: ignore[no-any-return]


_malloc_trim = _find_malloc_trim()


def release_free_heap() -> bool:
    """Return the free pages of the C heap to the operating system (glibc only); False
    where there is no ``malloc_trim``. Takes milliseconds for a heap of hundreds of MiB."""
    if _malloc_trim is None:
        return False
    _malloc_trim(0)
    return True
