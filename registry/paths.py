"""Path rules shared by every backend.

Invariant: a path that reaches a backend is absolute, has no trailing slash and no empty
segment; the namespace is a prefix applied and removed here, so callers never see it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

__all__ = [
    "Namespace",
    "ancestors",
    "basename",
    "excluded_below",
    "excluded_subtree",
    "is_below",
    "join",
    "parent",
    "shared",
    "validate_path",
]

_FORBIDDEN_SEGMENTS = {".", ".."}


def validate_path(path: object) -> str:
    """Return ``path`` unchanged if it is a valid registry path, else raise ``ValueError``.

    Every op of every fire passes here, so a well-formed path is recognised by a few
    substring scans (a segment ``.`` or ``..`` always shows as ``/.``); only a path that
    fails them is split into segments, to raise the error that names its fault or to
    accept a name that merely starts with a dot. No cache: at 10,000 jobs one holding
    every path a fire names cost 8 MiB for 0.1 µs saved per path.
    """
    if not isinstance(path, str):
        raise ValueError(f"registry path must be a str, got {type(path).__name__}")
    if path[:1] == "/" and path[-1:] != "/" and "//" not in path and "/." not in path and "\x00" not in path:
        return path
    return _validate_slowly(path)


def _validate_slowly(path: str) -> str:
    if not path.startswith("/"):
        raise ValueError(f"registry path must be absolute (start with '/'): {path!r}")
    if path == "/":
        return path
    if path.endswith("/"):
        raise ValueError(f"registry path must not end with '/': {path!r}")
    for segment in path[1:].split("/"):
        if not segment:
            raise ValueError(f"registry path has an empty segment: {path!r}")
        if segment in _FORBIDDEN_SEGMENTS:
            raise ValueError(f"registry path has a relative segment {segment!r}: {path!r}")
    if "\x00" in path:
        raise ValueError(f"registry path contains a NUL character: {path!r}")
    return path


def shared(path: str) -> str:
    """The one ``str`` object for ``path`` that long-lived maps keep as their key.

    Invariant: a map that holds a path for as long as its node exists (the cache, a watch's
    known nodes, the memory store, the client's watcher tables) keys it by ``shared(path)``.
    Each of a job's dozen nodes is a key in four or five such maps, and every event and
    read makes its path anew (sliced, joined, decoded); interned, each path is stored once
    (about 80 bytes saved per extra copy). CPython frees an interned string once nothing
    else holds it.
    """
    return sys.intern(path)


def join(base: str, *names: str) -> str:
    """Join a validated base path with child names."""
    out = base.rstrip("/")
    for name in names:
        out = f"{out}/{name}"
    return out or "/"


def parent(path: str) -> str:
    head, _, _ = path.rpartition("/")
    return head or "/"


def basename(path: str) -> str:
    return path.rpartition("/")[2]


def ancestors(path: str) -> tuple[str, ...]:
    """Proper ancestors of ``path``, root excluded, outermost first: /a/b/c -> (/a, /a/b).
    Not cached (every create asks, a fire's mark included): slicing at each ``/`` costs
    about what a cache lookup does, and a cache of every created path held 16 MiB at
    10,000 jobs."""
    found = []
    cut = path.find("/", 1)
    while cut != -1:
        found.append(path[:cut])
        cut = path.find("/", cut + 1)
    return tuple(found)


def is_below(path: str, root: str) -> bool:
    """True when ``path`` is ``root`` or lies under it."""
    return root == "/" or path == root or path.startswith(root + "/")


def excluded_below(path: str, root: str, exclude: Callable[[str], bool]) -> bool:
    """True when ``exclude`` holds for ``path`` or one of its ancestors strictly below
    ``root`` (a watch's and a cache's ``exclude`` leave out whole subtrees)."""
    while path != root and path != "/":
        if exclude(path):
            return True
        path = parent(path)
    return False


def excluded_subtree(path: str, root: str, exclude: Callable[[str], bool]) -> str | None:
    """The top of the excluded subtree ``path`` lies in (the shallowest of ``path`` and
    its ancestors strictly below ``root`` that ``exclude`` holds for), or None: what a
    backend can leave out of a watch as a whole (etcd's key ranges)."""
    top = None
    while path != root and path != "/":
        if exclude(path):
            top = path
        path = parent(path)
    return top


class Namespace:
    """Maps caller paths to stored paths and back (a chroot)."""

    def __init__(self, prefix: str = "") -> None:
        if prefix:
            validate_path(prefix)
            if prefix == "/":
                prefix = ""
        self.prefix = prefix

    def to_server(self, path: str) -> str:
        validate_path(path)
        prefix = self.prefix  # to_server_valid's body, not a call: every op of every fire
        if not prefix:
            return path
        return prefix if path == "/" else prefix + path

    def to_server_valid(self, path: str) -> str:
        """``to_server`` of a path already validated (a join, no checks)."""
        if not self.prefix:
            return path
        return self.prefix if path == "/" else self.prefix + path

    def to_client(self, stored: str) -> str:
        if not self.prefix:
            return stored
        if stored == self.prefix:
            return "/"
        return stored[len(self.prefix) :]

    def __repr__(self) -> str:
        return f"Namespace({self.prefix!r})"
