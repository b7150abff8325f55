"""What the console's forms and request bodies mean: pure functions from submitted text to
typed values, each ``ValueError`` naming the field and what was expected.

Invariant: nothing here touches the registry or the request; the routes (``app``) decide
what to do with the values.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from scheduler.cluster_json import config_json
from scheduler.config import JobConfig

__all__ = ["FIXED_FIELDS", "form_values", "format_items", "history_query", "json_body", "parse_items"]

#: configuration fields an operator may not edit (``Cluster.update_config`` refuses them)
FIXED_FIELDS = ("name", "job_type", "script_command_line", "streaming_process", "error_handler", "overwrite")


def parse_items(text: str) -> list[int] | None:
    """``"1 2"`` or ``"1,2"`` -> ``[1, 2]``; None for nothing (the whole job)."""
    if not text.strip():
        return None
    try:
        return [int(part) for part in text.replace(",", " ").split()]
    except ValueError:
        raise ValueError(f"items {text!r}: expected whole numbers such as 1 2 3") from None


def format_items(items: Sequence[int] | None) -> str:
    """``[1, 2]`` -> ``"1, 2"`` (flash messages)."""
    return ", ".join(str(i) for i in items or ())


def form_values(config: JobConfig) -> dict[str, str]:
    """The editable fields as the form shows them (``parse_field`` reads them back)."""
    values: dict[str, str] = {}
    for field, value in config_json(config).items():
        if field in FIXED_FIELDS:
            continue
        if value is None:
            values[field] = ""
        elif isinstance(value, bool):
            values[field] = "true" if value else "false"
        elif isinstance(value, dict):
            values[field] = json.dumps(value, sort_keys=True)
        else:
            values[field] = str(value)
    return values


def history_query(filters: dict[str, str]) -> dict[str, Any]:
    """The history page's filters (text, empty when not set) -> ``HistoryReader.executions``
    keyword arguments."""
    from scheduler.cli import parse_since

    query: dict[str, Any] = {}
    if filters["job"]:
        query["job"] = filters["job"]
    if filters["item"]:
        try:
            query["item"] = int(filters["item"])
        except ValueError:
            raise ValueError(f"item {filters['item']!r}: expected a whole number") from None
    if filters["instance"]:
        query["instance"] = filters["instance"]
    if filters["outcome"]:
        if filters["outcome"] not in ("success", "failure"):
            raise ValueError(f"outcome {filters['outcome']!r}: expected success or failure")
        query["outcome"] = filters["outcome"]
    for bound in ("since", "until"):
        if filters[bound]:
            try:
                query[bound] = parse_since(filters[bound])
            except ValueError:
                raise ValueError(f"{bound} {filters[bound]!r}: expected 30m, 2h, 7d or an ISO time") from None
    return query


def json_body(raw: bytes) -> dict[str, Any]:
    """An action's JSON body: ``{}``, ``{"server": IP}`` or ``{"items": [N, ...]}``."""
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError:
        raise ValueError("the body is not JSON (expected an object such as {\"items\": [1, 2]})") from None
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object such as {\"server\": \"10.0.0.1\"}")
    unknown = sorted(set(body) - {"server", "items"})
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)}: expected server or items")
    return body
