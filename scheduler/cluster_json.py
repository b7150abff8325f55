"""The JSON forms of ``Cluster``'s views: what ``shardjob ... --json`` prints and what the
console's API serves, so the two never drift apart.

The keys named in docs/operations.md are stable: scripts rely on them. New keys may be
added; none is renamed or removed. Statuses are the enum names (``OK``, ``CRASHED``, ...),
times UNIX seconds (float), absent values ``null``.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from scheduler.cluster_views import InstanceView, ItemView, JobBrief, JobDetail, ServerBrief
from scheduler.config import JobConfig

__all__ = ["brief_json", "config_json", "detail_json", "dump_json", "server_json"]


def brief_json(brief: JobBrief) -> dict[str, Any]:
    return {
        "name": brief.name,
        "status": brief.status.name,
        "cron": brief.cron,
        "sharding_total_count": brief.sharding_total_count,
        "instances": brief.instances,
        "description": brief.description,
    }


def _instance_json(view: InstanceView) -> dict[str, Any]:
    return {
        "id": view.id,
        "ip": view.ip,
        "pid": view.pid,
        "since": view.since,
        "enabled": view.enabled,
        "items": list(view.items),
        "running_fire": view.running_fire,
        "leader": view.leader,
    }


def _item_json(view: ItemView) -> dict[str, Any]:
    return {
        "item": view.item,
        "instance": view.instance,
        "status": view.status.name,
        "parameter": view.parameter,
        "fire_time": view.fire_time,
        "failover_entries": view.failover_entries,
    }


def detail_json(detail: JobDetail) -> dict[str, Any]:
    """The brief's keys, with ``instances`` the list of live instances (not a count)."""
    return {
        **brief_json(detail.brief),
        "leader": detail.leader,
        "epoch": detail.epoch,
        "resharding_reason": detail.resharding_reason,
        "instances": [_instance_json(view) for view in detail.instances],
        "items": [_item_json(view) for view in detail.items],
        "config": None if detail.config is None else config_json(detail.config),
        "problems": list(detail.problems),
    }


def server_json(server: ServerBrief) -> dict[str, Any]:
    return {
        "ip": server.ip,
        "instances": server.instances,
        "jobs": server.jobs,
        "disabled_jobs": server.disabled_jobs,
        "online": server.online,
        "last_seen": server.last_seen,
    }


def config_json(config: JobConfig) -> dict[str, Any]:
    """The configuration's fields by their ``JobConfig`` names, as the registry stores them."""
    document: dict[str, Any] = json.loads(config.to_json())
    return document


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode("ascii")}
    return value


def dump_json(dump: dict[str, Any]) -> dict[str, Any]:
    """``Cluster.dump`` with raw values (bytes the layout cannot decode) as
    ``{"base64": ...}``."""
    nodes = {path: {**node, "value": _jsonable(node["value"])} for path, node in dump["nodes"].items()}
    return {**dump, "nodes": nodes}
