"""The registry's backends, found by name: the three built in, or a third party's through
the entry-point group ``shardjob.registry_backends`` (as tooz finds its drivers, and as
``sharding.get_strategy`` finds strategies).

Each backend is a ``BaseRegistry`` subclass that documents its URL options in its class
docstring and declares them (``url_options``) and its ``characteristics``. A backend is
imported only when a URL names it, so ``memory://`` users never load kazoo or grpc.

A server backend's client libraries come with the extra named as the backend
(``pip install 'shardjob[zookeeper]'``); asking for a backend whose extra is missing raises
``BackendUnavailable`` naming that install, never a bare ``ModuleNotFoundError``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from registry.errors import ShardJobError

if TYPE_CHECKING:
    from registry.backends.base import BaseRegistry

__all__ = ["BUILTIN_BACKENDS", "ENTRY_POINT_GROUP", "EXTRA_MODULES", "BackendUnavailable", "backend_class"]

ENTRY_POINT_GROUP = "shardjob.registry_backends"

#: the built-in backends, by the name a URL's scheme resolves to (``registry.url.Backend``)
BUILTIN_BACKENDS = {
    "memory": "registry.backends.memory:MemoryRegistry",
    "zookeeper": "registry.backends.zookeeper:ZooKeeperRegistry",
    "etcd": "registry.backends.etcd:EtcdRegistry",
}

#: per built-in backend with an extra of its name: the top-level modules of the third-party
#: packages the backend imports, and the distribution each comes from (pyproject's extra
#: lists the same distributions; tests/registry/test_backends.py holds the two together)
EXTRA_MODULES: dict[str, dict[str, str]] = {
    "zookeeper": {"kazoo": "kazoo"},
    "etcd": {"pyetcd": "etcd-sdk-python", "grpc": "grpcio", "google": "protobuf"},
}


class BackendUnavailable(ShardJobError):
    """A built-in backend was asked for but its extra is not installed.

    ``backend`` is its name, ``missing`` the distribution not found, ``install`` the pip
    command that installs the extra.
    """

    def __init__(self, backend: str, missing: str) -> None:
        self.backend = backend
        self.missing = missing
        self.install = f"pip install 'shardjob[{backend}]'"
        super().__init__(f"registry backend {backend!r} needs {missing}: {self.install}")


def backend_class(name: str) -> type[BaseRegistry]:
    """The backend class called ``name``: built in, or an entry point of group
    ``shardjob.registry_backends``; ``ValueError`` naming the known ones otherwise, and
    ``BackendUnavailable`` for a built-in one whose extra is not installed."""
    from registry.backends.base import BaseRegistry

    key = str(name)  # a url.Backend member prints as its enum name with !r
    spec = BUILTIN_BACKENDS.get(key)
    if spec is not None:
        module_name, _, attr = spec.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # only a third-party module of the backend's extra is the user's install to fix;
            # any other missing module (one of ours, a broken install) propagates as it is
            missing = EXTRA_MODULES.get(key, {}).get((exc.name or "").partition(".")[0])
            if missing is None:
                raise
            raise BackendUnavailable(key, missing) from None
        loaded: object = getattr(module, attr)
    else:
        from importlib.metadata import entry_points  # plugins only: it costs MiBs (registry.release)

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
