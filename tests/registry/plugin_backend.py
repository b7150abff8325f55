"""A third party's registry backend, for tests/registry/test_backends.py: the memory
backend under another name, registered through an entry point the test writes."""

from __future__ import annotations

from registry.backends.memory import MemoryRegistry
from registry.protocol import Characteristic


class EchoRegistry(MemoryRegistry):
    """``echo://host:port/namespace``: the memory store of this process (URL options
    ``session_timeout`` and ``connect_timeout``)."""

    backend_name = "echo"
    url_options = frozenset({"session_timeout", "connect_timeout"})
    characteristics = frozenset({Characteristic.DISTRIBUTED})


class NotABackend:
    """What an entry point may wrongly name."""
