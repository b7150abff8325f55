"""shardjob's registry center: one protocol over ZooKeeper, etcd and an in-process store.

``registry.connect(url)`` opens a session on the backend the URL names (``zk://``,
``etcd://``, ``memory://``); everything above this package programs against
:class:`RegistryCenter` only and never learns which backend it runs on.
"""

from registry.connect import connect
from registry.errors import (
    BadVersionError,
    LockTimeout,
    NodeExistsError,
    NoNodeError,
    RegistryConnectionError,
    RegistryError,
    SessionLostError,
    ShardJobError,
    TransactionError,
)
from registry.protocol import (
    Check,
    Create,
    Delete,
    Event,
    EventKind,
    Node,
    Op,
    RegistryCenter,
    SessionState,
    Set,
    Watch,
)
from registry.url import RegistryURL, parse_url

__all__ = [
    "BadVersionError",
    "Check",
    "Create",
    "Delete",
    "Event",
    "EventKind",
    "LockTimeout",
    "NoNodeError",
    "Node",
    "NodeExistsError",
    "Op",
    "RegistryCenter",
    "RegistryConnectionError",
    "RegistryError",
    "RegistryURL",
    "SessionLostError",
    "SessionState",
    "Set",
    "ShardJobError",
    "TransactionError",
    "Watch",
    "connect",
    "parse_url",
]
