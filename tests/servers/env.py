"""The environment variables that point the test session at servers already running.

``SHARDJOB_TEST_ZK`` and ``SHARDJOB_TEST_ETCD`` hold ``host:port[,host:port...]``; when
set, the ``zk_server``/``etcd_server`` fixtures use those servers instead of starting
their own. ``tests/conftest.py`` and ``tests/test_compose.py`` both read the names from
here, so the compose files and the fixtures cannot drift apart.
"""

from __future__ import annotations

import os

__all__ = ["ETCD_ENV", "ZK_ENV", "external_address", "parse_hosts"]

ZK_ENV = "SHARDJOB_TEST_ZK"
ETCD_ENV = "SHARDJOB_TEST_ETCD"


def parse_hosts(value: str) -> list[tuple[str, int]]:
    """``"a:1,b:2"`` -> ``[("a", 1), ("b", 2)]``; a bad entry raises ``ValueError``."""
    hosts: list[tuple[str, int]] = []
    for raw in value.split(","):
        entry = raw.strip()
        host, sep, port = entry.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"expected host:port[,host:port...], got entry {entry!r} in {value!r}")
        hosts.append((host, int(port)))
    return hosts


def external_address(name: str) -> str | None:
    """The normalised ``host:port,...`` from variable ``name``, or None when unset/empty."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        hosts = parse_hosts(value)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
    return ",".join(f"{host}:{port}" for host, port in hosts)
