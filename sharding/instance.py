"""Who an instance is: ``{ip}@-@{pid}`` as in ElasticJob, made unique within a process.

Invariant: two schedulers in one process never share an id (the second gets ``@-@2``…),
so their ephemeral instance nodes, running marks and leadership never collide.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import threading
import time
from dataclasses import dataclass

__all__ = ["InstanceIdentity", "local_ip", "new_instance_id"]

_counter = itertools.count(1)
_counter_lock = threading.Lock()
_SEPARATOR = "@-@"


def local_ip() -> str:
    """The address other hosts would see (no packet is sent); loopback as a fallback."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: routing lookup only, nothing sent
            return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"


def new_instance_id(ip: str | None = None) -> str:
    with _counter_lock:
        n = next(_counter)
    base = f"{ip or local_ip()}{_SEPARATOR}{os.getpid()}"
    return base if n == 1 else f"{base}{_SEPARATOR}{n}"


@dataclass(frozen=True)
class InstanceIdentity:
    """An instance id and the server (ip) it runs on."""

    instance_id: str
    ip: str

    @classmethod
    def create(cls, instance_id: str | None = None, ip: str | None = None) -> InstanceIdentity:
        address = ip or local_ip()
        if instance_id is None:
            instance_id = new_instance_id(address)
        elif not instance_id or "/" in instance_id:
            raise ValueError(f"instance_id must be non-empty and contain no '/', got {instance_id!r}")
        elif ip is None and _SEPARATOR in instance_id:
            address = instance_id.split(_SEPARATOR, 1)[0]
        return cls(instance_id, address)

    def node_value(self) -> bytes:
        return json.dumps(
            {"id": self.instance_id, "ip": self.ip, "pid": os.getpid(), "started": round(time.time(), 3)},
            sort_keys=True,
        ).encode()
