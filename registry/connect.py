"""``registry.connect(url)``: pick the backend named by the URL and open a session.

Backends are imported only when asked for, so ``memory://`` users never load kazoo or grpc.
"""

from __future__ import annotations

from registry.backends.base import BaseRegistry
from registry.url import Backend, parse_url

__all__ = ["connect"]


def connect(url: str, **options: object) -> BaseRegistry:
    """Open a connected client for ``url``; keyword options override the URL's query.

    Raises ``ValueError`` for a bad URL and ``RegistryConnectionError`` when no server
    answers within ``connect_timeout``.
    """
    parsed = parse_url(url, **options)
    if parsed.backend is Backend.MEMORY:
        from registry.backends.memory import MemoryRegistry

        return MemoryRegistry(parsed)
    if parsed.backend is Backend.ZOOKEEPER:
        from registry.backends.zookeeper import ZooKeeperRegistry

        return ZooKeeperRegistry(parsed)
    from registry.backends.etcd import EtcdRegistry

    return EtcdRegistry(parsed)
