"""``shardjob`` commands for operators: read and steer a live cluster through ``Cluster``.

``jobs``, ``status JOB``, ``servers``, ``trigger``, ``disable``/``enable``, ``shutdown``,
``remove``, ``config get|set`` and ``dump``; each takes ``--registry URL`` (or
``SHARDJOB_REGISTRY`` from the environment, so a password in the URL stays off the command
line and out of shell history) and ``--json`` (the stable forms of ``cluster_json``).
Tables for people otherwise. docs/operations.md shows every command's output.
"""

from __future__ import annotations

import argparse
import json
import os
import typing
from collections.abc import Callable, Mapping
from typing import Any

from scheduler.cli_format import format_table, iso_utc
from scheduler.cluster import Cluster
from scheduler.cluster_json import brief_json, config_json, detail_json, dump_json, server_json
from scheduler.cluster_views import JobDetail
from scheduler.config import JobConfig
from scheduler.exit_codes import ExitCode

__all__ = ["COMMANDS", "REGISTRY_ENV", "add_operation_commands", "parse_field", "run_operation"]

#: the environment variable read when ``--registry`` is not given
REGISTRY_ENV = "SHARDJOB_REGISTRY"

#: the commands this module serves, by name
COMMANDS = ("jobs", "status", "servers", "trigger", "disable", "enable", "shutdown", "remove", "config", "dump")


# -- parser ---------------------------------------------------------------------------------
def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--registry", metavar="URL", help=f"zk://... or etcd://... (default: ${REGISTRY_ENV})"
    )
    parser.add_argument("--json", action="store_true", help="stable JSON for scripts instead of a table")


def add_operation_commands(commands: Any) -> None:
    """Register the operator commands on ``commands`` (an ``add_subparsers`` result)."""

    def add(name: str, help_text: str, *, job: bool = True) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = commands.add_parser(name, help=help_text, description=help_text)
        if job:
            parser.add_argument("job", help="the job's name")
        _common(parser)
        return parser

    add("jobs", "list every job with its status, cron, items and live instances", job=False)
    add("status", "one job: leader, epoch, instances and every item's owner and state")
    add("servers", "every server: live instances, jobs, disabled jobs, last seen", job=False)
    add("trigger", "run the job once now on every live instance, each its own items")
    for verb in ("disable", "enable"):
        scoped = add(verb, f"{verb} the job everywhere, on one server, or some items")
        scope = scoped.add_mutually_exclusive_group()
        scope.add_argument("--server", metavar="IP", help=f"{verb} the job on this server only")
        scope.add_argument(
            "--item",
            type=int,
            nargs="+",
            action="extend",
            metavar="N",
            dest="items",
            help=f"{verb} these items only (--item 1 2, or --item 1 --item 2)",
        )
    shutdown = add("shutdown", "ask instances to stop the job gracefully until they restart")
    shutdown.add_argument("--instance", metavar="ID", help="only this instance (default: every live one)")
    shutdown.add_argument(
        "--wait", type=float, metavar="SECONDS", help="wait until they have left (exit 1 if not in time)"
    )
    remove = add("remove", "delete the job from the registry (refused while instances run it)")
    remove.add_argument("--force", action="store_true", help="shut live instances down first")
    remove.add_argument(
        "--wait", type=float, default=60.0, metavar="SECONDS", help="with --force: how long to wait (60)"
    )
    config = commands.add_parser("config", help="read or change a job's configuration")
    actions = config.add_subparsers(dest="config_action", required=True, metavar="ACTION")
    get = actions.add_parser("get", help="the stored configuration, field by field")
    get.add_argument("job", help="the job's name")
    _common(get)
    set_ = actions.add_parser(
        "set",
        help="change fields (validated; one versioned write; running instances apply it at once)",
    )
    set_.add_argument("job", help="the job's name")
    set_.add_argument("changes", nargs="+", metavar="FIELD=VALUE", help="e.g. sharding_total_count=8")
    _common(set_)
    add("dump", "every node of the job as stored, decoded where the layout knows the format")


# -- field values from the command line -------------------------------------------------------
_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})


def _field_types() -> Mapping[str, Any]:
    return typing.get_type_hints(JobConfig)


def parse_field(assignment: str) -> tuple[str, Any]:
    """``FIELD=VALUE`` -> ``(field, value)``, the value read as the field's type: bools as
    true/false (yes/no, on/off, 1/0), numbers as numbers, ``props`` as a JSON object, an
    empty value as None where the field allows None (``cron=`` makes a one-off job).
    ``ValueError`` naming the field and the value."""
    name, sep, text = assignment.partition("=")
    name = name.strip()
    if not sep or not name:
        raise ValueError(f"{assignment!r}: expected FIELD=VALUE")
    types = _field_types()
    if name not in types:
        raise ValueError(f"{name}: no such configuration field (fields: {', '.join(sorted(types))})")
    kind = types[name]
    args = typing.get_args(kind)
    if type(None) in args:
        if text == "":
            return name, None
        kind = next(arg for arg in args if arg is not type(None))
    try:
        return name, _convert(kind, text)
    except ValueError as exc:
        raise ValueError(f"{name}={text!r}: {exc}") from None


def _convert(kind: Any, text: str) -> Any:
    if kind is bool:
        lowered = text.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ValueError("expected true or false")
    if kind is int:
        try:
            return int(text)
        except ValueError:
            raise ValueError("expected a whole number") from None
    if kind is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError("expected a number") from None
    if typing.get_origin(kind) is Mapping or kind is Mapping:
        try:
            value = json.loads(text)
        except ValueError:
            raise ValueError('expected a JSON object such as {"key": "value"}') from None
        if not isinstance(value, dict):
            raise ValueError('expected a JSON object such as {"key": "value"}')
        return value
    return text


# -- commands ---------------------------------------------------------------------------------
def _registry_url(args: argparse.Namespace) -> str:
    url = args.registry or os.environ.get(REGISTRY_ENV, "").strip()
    if not url:
        raise ValueError(f"no registry: give --registry URL or set {REGISTRY_ENV}")
    return str(url)


def _emit(args: argparse.Namespace, document: Any, text: Callable[[], str]) -> None:
    print(json.dumps(document, indent=2, ensure_ascii=False) if args.json else text())


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _jobs(cluster: Cluster, args: argparse.Namespace) -> None:
    briefs = cluster.jobs()

    def text() -> str:
        if not briefs:
            return "(no jobs in this registry)"
        rows = [
            (b.name, b.status.name, b.cron or "(one-off)", str(b.sharding_total_count), str(b.instances), b.description)
            for b in briefs
        ]
        return format_table(("JOB", "STATUS", "CRON", "ITEMS", "INSTANCES", "DESCRIPTION"), rows)

    _emit(args, [brief_json(b) for b in briefs], text)


def _status_text(detail: JobDetail) -> str:
    config = detail.config
    zone = f"  ({config.time_zone})" if config is not None and config.time_zone else ""
    running = sum(1 for item in detail.items if item.fire_time is not None)
    head = [
        ("job", detail.name),
        ("status", detail.status.name + (f"  ({detail.resharding_reason})" if detail.resharding_reason else "")),
        ("cron", (detail.brief.cron or "(one-off)") + zone),
        ("leader", detail.leader or "(none)"),
        ("epoch", "(not sharded yet)" if detail.epoch is None else str(detail.epoch)),
        ("items", f"{detail.brief.sharding_total_count} ({running} running)"),
    ]
    parts = [format_table(None, head)]
    instances = [
        (
            view.id + (" *" if view.leader else ""),
            view.ip,
            iso_utc(view.since, timespec="seconds")[:19],
            _yes(view.enabled),
            ",".join(map(str, view.items)) or "-",
            iso_utc(view.running_fire, timespec="seconds")[:19],
        )
        for view in detail.instances
    ]
    if instances:
        header = ("INSTANCE (* leader)", "IP", "SINCE (UTC)", "ENABLED", "ITEMS", "RUNNING FIRE (UTC)")
        parts.append(format_table(header, instances))
    else:
        parts.append("(no live instance)")
    items = [
        (
            str(view.item),
            view.instance or "-",
            view.status.name + (f" ({view.failover_entries} queued)" if view.failover_entries else ""),
            iso_utc(view.fire_time, timespec="seconds")[:19],
            view.parameter,
        )
        for view in detail.items
    ]
    parts.append(format_table(("ITEM", "INSTANCE", "STATUS", "FIRE (UTC)", "PARAMETER"), items))
    if detail.problems:
        parts.append("problems (nodes that do not decode; `shardjob dump` shows them):")
        parts.extend(f"  {problem}" for problem in detail.problems)
    return "\n\n".join(parts)


def _status(cluster: Cluster, args: argparse.Namespace) -> None:
    detail = cluster.job(args.job)
    _emit(args, detail_json(detail), lambda: _status_text(detail))


def _servers(cluster: Cluster, args: argparse.Namespace) -> None:
    servers = cluster.servers()

    def text() -> str:
        if not servers:
            return "(no servers in this registry)"
        rows = [
            (
                s.ip,
                _yes(s.online),
                str(s.instances),
                str(s.jobs),
                str(s.disabled_jobs),
                "now" if s.online else (iso_utc(s.last_seen, timespec="seconds")[:19] or "(not checked yet)"),
            )
            for s in servers
        ]
        return format_table(("SERVER", "ONLINE", "INSTANCES", "JOBS", "DISABLED JOBS", "LAST SEEN (UTC)"), rows)

    _emit(args, [server_json(s) for s in servers], text)


def _trigger(cluster: Cluster, args: argparse.Namespace) -> None:
    instances = cluster.trigger(args.job)
    text = f"triggered job {args.job!r} on {len(instances)} live instance(s): {', '.join(instances)}"
    _emit(args, {"job": args.job, "instances": instances}, lambda: text)


def _set_enabled(cluster: Cluster, args: argparse.Namespace) -> None:
    enabled = args.command == "enable"
    action = cluster.enable if enabled else cluster.disable
    action(args.job, server=args.server, items=args.items)
    if args.items is not None:
        scope, where = "items", f"items {', '.join(map(str, sorted(set(args.items))))} of job {args.job!r}"
    elif args.server is not None:
        scope, where = "server", f"job {args.job!r} on server {args.server}"
    else:
        scope = "job"
        where = f"job {args.job!r} on every server (servers that join later start {args.command}d)"
    document = {"job": args.job, "enabled": enabled, "scope": scope, "server": args.server, "items": args.items}
    _emit(args, document, lambda: f"{args.command}d {where}")


def _shutdown(cluster: Cluster, args: argparse.Namespace) -> None:
    asked = cluster.shutdown(args.job, instance=args.instance, timeout=args.wait)
    waited = args.wait is not None
    text = f"asked {len(asked)} instance(s) to stop job {args.job!r}: {', '.join(asked) or '(none live)'}"
    if waited:
        text += "\nall of them have left"
    _emit(args, {"job": args.job, "instances": asked, "left": waited}, lambda: text)


def _remove(cluster: Cluster, args: argparse.Namespace) -> None:
    cluster.remove(args.job, force=args.force, timeout=args.wait)
    _emit(args, {"job": args.job, "removed": True}, lambda: f"removed job {args.job!r}")


def _config_text(config: JobConfig, only: set[str] | None = None) -> str:
    document = config_json(config)
    rows = [
        (name, value if isinstance(value, str) and value else json.dumps(value, ensure_ascii=False))
        for name, value in document.items()
        if only is None or name in only
    ]
    return format_table(("FIELD", "VALUE"), rows)


def _config(cluster: Cluster, args: argparse.Namespace) -> None:
    if args.config_action == "get":
        config = cluster.config(args.job)
        _emit(args, config_json(config), lambda: _config_text(config))
        return
    changes = dict(parse_field(change) for change in args.changes)
    updated = cluster.update_config(args.job, **changes)
    _emit(args, config_json(updated), lambda: f"job {args.job!r} updated:\n" + _config_text(updated, set(changes)))


def _dump_text(dump: Mapping[str, Any]) -> str:
    lines = []
    for path, node in dump["nodes"].items():
        value = node["value"]
        if isinstance(value, bytes):
            shown = f"(raw) {value!r}"
        elif isinstance(value, str):
            shown = value.replace("\n", "\\n")
        else:
            shown = json.dumps(value, ensure_ascii=False, sort_keys=True)
        kind = "ephemeral" if node["ephemeral"] else "persistent"
        lines.append((path, f"v{node['version']}", kind, shown))
    text = format_table(("PATH", "VERSION", "KIND", "VALUE"), lines)
    if dump["problems"]:
        text += "\n\nproblems:\n" + "\n".join(f"  {problem}" for problem in dump["problems"])
    return text


def _dump(cluster: Cluster, args: argparse.Namespace) -> None:
    dump = cluster.dump(args.job)
    _emit(args, dump_json(dump), lambda: _dump_text(dump))


_HANDLERS: dict[str, Callable[[Cluster, argparse.Namespace], None]] = {
    "jobs": _jobs,
    "status": _status,
    "servers": _servers,
    "trigger": _trigger,
    "disable": _set_enabled,
    "enable": _set_enabled,
    "shutdown": _shutdown,
    "remove": _remove,
    "config": _config,
    "dump": _dump,
}


def run_operation(args: argparse.Namespace) -> int:
    """Run one operator command; errors propagate to ``cli.main``, which maps them to
    exit codes."""
    handler = _HANDLERS[args.command]
    if args.command == "config" and args.config_action == "set":
        for change in args.changes:  # bad input is refused before anything connects
            parse_field(change)
    with Cluster(_registry_url(args)) as cluster:
        handler(cluster, args)
    return ExitCode.OK
