"""``registry.connect(url)``: pick the backend named by the URL and open a session.

Backends are found by name (``registry.backends.backend_class``) and imported only when
asked for, so ``memory://`` users never load kazoo or grpc.
"""

from __future__ import annotations

from registry.backends import backend_class
from registry.backends.base import BaseRegistry
from registry.url import parse_url

__all__ = ["connect"]


def connect(url: str, **options: object) -> BaseRegistry:
    """Open a connected client for ``url``; keyword options override the URL's query.

    Raises ``ValueError`` for a bad URL and ``RegistryConnectionError`` when no server
    answers within ``connect_timeout``.
    """
    parsed = parse_url(url, **options)
    return backend_class(parsed.backend)(parsed)
