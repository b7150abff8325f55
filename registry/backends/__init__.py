"""The registry's backends, found by name: the three built in, or a third party's through
the entry-point group ``shardjob.registry_backends`` (as tooz finds its drivers, and as
``sharding.get_strategy`` finds strategies).

Each backend is a ``BaseRegistry`` subclass that documents its URL options in its class
docstring and declares them (``url_options``) and its ``characteristics``. A backend is
imported only when a URL names it, so ``memory://`` users never load kazoo or grpc.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from registry.backends.base import BaseRegistry

__all__ = ["BUILTIN_BACKENDS", "ENTRY_POINT_GROUP", "backend_class"]

ENTRY_POINT_GROUP = "shardjob.registry_backends"

#: the built-in backends, by the name a URL's scheme resolves to (``registry.url.Backend``)
BUILTIN_BACKENDS = {
    "memory": "registry.backends.memory:MemoryRegistry",
    "zookeeper": "registry.backends.zookeeper:ZooKeeperRegistry",
    "etcd": "registry.backends.etcd:EtcdRegistry",
}


def backend_class(name: str) -> type[BaseRegistry]:
    """The backend class called ``name``: built in, or an entry point of group
    ``shardjob.registry_backends``; ``ValueError`` naming the known ones otherwise."""
    from registry.backends.base import BaseRegistry

    spec = BUILTIN_BACKENDS.get(str(name))
    if spec is not None:
        module_name, _, attr = spec.partition(":")
        loaded: object = getattr(importlib.import_module(module_name), attr)
    else:
        plugins = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
        if name not in plugins:
            known = sorted({*BUILTIN_BACKENDS, *plugins})
            raise ValueError(f"unknown registry backend {name!r}; known: {', '.join(known)}")
        try:
            loaded = plugins[name].load()
        except Exception as exc:
            raise ValueError(f"registry backend {name!r}: entry point failed to load: {exc}") from None
    if not (isinstance(loaded, type) and issubclass(loaded, BaseRegistry)):
        raise ValueError(f"registry backend {name!r} is not a BaseRegistry subclass: {loaded!r}")
    return loaded
