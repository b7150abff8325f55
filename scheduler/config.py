"""Job configuration: ElasticJob's ``JobConfiguration`` fields in snake_case with its
defaults, validated as a whole, and its registry form (JSON).

Invariants:
- A ``JobConfig`` that exists is valid: ``__post_init__`` validates, so a bad value is a
  ``ValueError`` naming the field and the value before anything reaches the registry;
  ``with_changes`` validates the result the same way.
- ``to_json`` is stable (sorted keys, UTF-8): equal configs give equal bytes, so writing
  an unchanged config changes nothing. ``from_json`` reads what any version wrote: keys
  it does not know (a newer version's) are ignored, keys it lacks take their defaults,
  and anything that does not decode or validate is a ``CorruptNodeError`` naming the
  node and the field.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from registry.text_enum import TextEnum
from scheduler.cron import CronSchedule, parse_time_zone
from sharding.assignment import CorruptNodeError
from sharding.strategy_loader import get_strategy

__all__ = ["ERROR_HANDLERS", "ErrorHandlerName", "JobConfig", "JobType", "OwedFires", "format_item_parameters", "parse_item_parameters"]

#: error handlers a configuration can name (a callable one is attached by the scheduler)
class OwedFires(enum.Enum):
    """What a fire that cannot run when due (the job still running, the session down, the
    timer late) leaves behind, as the job's configuration decides."""

    #: failover: each such fire, replayed in fire order — every (item, fire) at least once
    EVERY = "every"
    #: misfire: one run right after stands for all of them, as ElasticJob's
    ONE = "one"
    #: neither: skipped
    NONE = "none"


class ErrorHandlerName(TextEnum):
    """The built-in error handlers a configuration names (a callable is given to
    ``add_job`` instead)."""

    LOG = "LOG"
    THROW = "THROW"
    IGNORE = "IGNORE"


ERROR_HANDLERS = tuple(name.value for name in ErrorHandlerName)

# one registry path segment: ASCII letters, digits, '_', '.', '-', ':'; any printable
# non-ASCII character except whitespace
_NAME_CHARS = re.compile(r"[A-Za-z0-9_.:\-]|[^\x00-\x7f]")
_ITEM_KEY = re.compile(r"[0-9]+")


class JobType(enum.Enum):
    """What the scheduler calls per item."""

    SIMPLE = "SIMPLE"
    DATAFLOW = "DATAFLOW"
    SCRIPT = "SCRIPT"
    #: one HTTP request per item to ``props["http.uri"]`` (ElasticJob's HTTP job; ``scheduler.http_job``)
    HTTP = "HTTP"


#: the props of every config that has none: one proxy, not a dict and a proxy per job
_NO_PROPS: Mapping[str, str] = MappingProxyType({})


def _frozen_props(props: Mapping[str, str]) -> Mapping[str, str]:
    # a private copy: a caller's dict (or the dict behind a caller's proxy) can change later
    return MappingProxyType(dict(props)) if props else _NO_PROPS


@dataclass(frozen=True, slots=True)
class JobConfig:
    """One job's configuration; ElasticJob's fields and defaults (see the module doc)."""

    name: str
    #: Unix (5 fields) or Quartz (6-7, seconds first); None or "" is a one-off job
    cron: str | None = None
    #: IANA name or offset ('Asia/Shanghai', 'GMT+08:00'); None: the machine's zone
    time_zone: str | None = None
    sharding_total_count: int = 1
    #: "0=Beijing,1=Shanghai"; unlisted items get ""
    sharding_item_parameters: str = ""
    job_parameter: str = ""
    monitor_execution: bool = True
    failover: bool = False
    misfire: bool = True
    #: allowed clock skew against the registry; -1 disables the check
    max_time_diff_seconds: int = -1
    #: below 1 disables reconciliation
    reconcile_interval_minutes: float = 10
    #: the leader's reconcile deletes a server's status once no instance has run on it
    #: for this long (<= 0: never)
    server_expiry_minutes: float = 1440
    sharding_strategy: str = "AVG_ALLOCATION"
    description: str = ""
    props: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    disabled: bool = False
    overwrite: bool = False
    static_sharding: bool = False
    job_type: JobType = JobType.SIMPLE
    #: dataflow: fetch again until a fetch returns nothing
    streaming_process: bool = False
    #: script: the command; the sharding context is appended as a JSON argument
    script_command_line: str = ""
    #: LOG, THROW or IGNORE
    error_handler: str = "LOG"
    #: an item running longer is cancelled and fails with ``JobTimeout`` (None: no limit)
    timeout_seconds: float | None = None
    #: a failed item is run again up to this many times in the same fire, while this
    #: instance still owns it
    retries: int = 0
    #: the first retry's delay; each next one doubles it, with random jitter
    retry_backoff_seconds: float = 1.0
    #: each fire starts after a random delay of up to this many seconds
    jitter_seconds: float = 0.0

    def __post_init__(self) -> None:
        # normalise the forms callers may pass before validating the canonical ones
        if self.cron is not None and isinstance(self.cron, str) and not self.cron.strip():
            object.__setattr__(self, "cron", None)
        if isinstance(self.job_type, str):
            try:
                object.__setattr__(self, "job_type", JobType[self.job_type.upper()])
            except KeyError:
                raise ValueError(
                    f"job_type {self.job_type!r}: not one of {', '.join(t.name for t in JobType)}"
                ) from None
        if isinstance(self.error_handler, str) and self.error_handler.upper() in ERROR_HANDLERS:
            object.__setattr__(self, "error_handler", ErrorHandlerName(self.error_handler.upper()))
        if isinstance(self.props, Mapping):
            object.__setattr__(self, "props", _frozen_props(self.props))
        self.validate()

    # -- validation -----------------------------------------------------------------------
    def validate(self) -> None:
        """Check every field; ``ValueError`` naming the first bad field and its value."""
        _check_name(self.name)
        if self.cron is not None:
            if not isinstance(self.cron, str):
                raise ValueError(f"cron {self.cron!r}: must be a str or None")
            CronSchedule.parse(self.cron, self.time_zone)
        elif self.time_zone is not None:
            if not isinstance(self.time_zone, str):
                raise ValueError(f"time_zone {self.time_zone!r}: must be a str or None")
            parse_time_zone(self.time_zone)
        total = self.sharding_total_count
        if not _is_int(total) or total < 1:
            raise ValueError(f"sharding_total_count {total!r}: must be an int >= 1")
        _check_str("sharding_item_parameters", self.sharding_item_parameters)
        parse_item_parameters(self.sharding_item_parameters, total)
        for name in ("job_parameter", "description", "script_command_line", "sharding_strategy"):
            _check_str(name, getattr(self, name))
        for name in (
            "monitor_execution",
            "failover",
            "misfire",
            "disabled",
            "overwrite",
            "static_sharding",
            "streaming_process",
        ):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ValueError(f"{name} {value!r}: must be a bool")
        diff = self.max_time_diff_seconds
        if not _is_int(diff) or diff < -1:
            raise ValueError(f"max_time_diff_seconds {diff!r}: must be an int, -1 (off) or >= 0")
        minutes = self.reconcile_interval_minutes
        if isinstance(minutes, bool) or not isinstance(minutes, int | float) or not math.isfinite(minutes):
            raise ValueError(
                f"reconcile_interval_minutes {minutes!r}: must be a number of minutes (<= 0: off; "
                "fractions allowed, e.g. 0.5 for 30 s)"
            )
        expiry = self.server_expiry_minutes
        if isinstance(expiry, bool) or not isinstance(expiry, int | float) or not math.isfinite(expiry):
            raise ValueError(f"server_expiry_minutes {expiry!r}: must be a number of minutes (<= 0: never)")
        try:
            get_strategy(self.sharding_strategy)
        except ValueError as exc:
            raise ValueError(f"sharding_strategy {self.sharding_strategy!r}: {exc}") from None
        _check_props(self.props)
        if not isinstance(self.job_type, JobType):
            raise ValueError(
                f"job_type {self.job_type!r}: must be one of {', '.join(t.name for t in JobType)}"
            )
        if self.job_type is JobType.SCRIPT and not self.script_command_line.strip():
            raise ValueError(
                f"script_command_line {self.script_command_line!r}: a SCRIPT job needs a command"
            )
        if self.job_type is not JobType.SCRIPT and self.script_command_line:
            raise ValueError(
                f"script_command_line {self.script_command_line!r}: only for SCRIPT jobs, "
                f"this is {self.job_type.name}"
            )
        if self.streaming_process and self.job_type is not JobType.DATAFLOW:
            raise ValueError(f"streaming_process True: only for DATAFLOW jobs, this is {self.job_type.name}")
        if self.failover and not self.monitor_execution:
            raise ValueError("failover True: needs monitor_execution=True (which items were running)")
        if self.error_handler not in ERROR_HANDLERS:
            raise ValueError(f"error_handler {self.error_handler!r}: not one of {', '.join(ERROR_HANDLERS)}")
        if self.timeout_seconds is not None and not (_is_number(self.timeout_seconds) and self.timeout_seconds > 0):
            raise ValueError(f"timeout_seconds {self.timeout_seconds!r}: must be a number of seconds > 0, or None")
        if not _is_int(self.retries) or self.retries < 0:
            raise ValueError(f"retries {self.retries!r}: must be an int >= 0")
        for name in ("retry_backoff_seconds", "jitter_seconds"):
            value = getattr(self, name)
            if not _is_number(value) or value < 0:
                raise ValueError(f"{name} {value!r}: must be a number of seconds >= 0")
        if self.job_type is JobType.HTTP:
            from scheduler.http_job import check_http_props

            check_http_props(self.props)

    # -- derived views --------------------------------------------------------------------
    @property
    def owed_fires(self) -> OwedFires:
        if self.failover:
            return OwedFires.EVERY
        return OwedFires.ONE if self.misfire else OwedFires.NONE

    @property
    def is_one_off(self) -> bool:
        """No cron: the job runs only when triggered."""
        return self.cron is None

    def schedule(self) -> CronSchedule | None:
        """The parsed cron in the job's zone, or None for a one-off job."""
        return None if self.cron is None else CronSchedule.parse(self.cron, self.time_zone)

    def item_parameters(self) -> dict[int, str]:
        """``sharding_item_parameters`` as ``{item: parameter}``; unlisted items absent."""
        return parse_item_parameters(self.sharding_item_parameters, self.sharding_total_count)

    def with_changes(self, **changes: Any) -> JobConfig:
        """A copy with ``changes`` applied, validated like a new config."""
        return dataclasses.replace(self, **changes)

    # -- registry form --------------------------------------------------------------------
    def to_json(self) -> bytes:
        """The registry form: a JSON object, sorted keys, UTF-8."""
        document: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, JobType):
                value = value.name
            elif isinstance(value, Mapping):
                value = dict(value)
            document[f.name] = value
        return json.dumps(document, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    @classmethod
    def from_json(cls, path: str, raw: bytes) -> JobConfig:
        """Read the registry form at ``path``; ``CorruptNodeError`` naming the problem."""
        try:
            text = raw.decode("utf-8")
        except (UnicodeDecodeError, AttributeError):
            raise CorruptNodeError(path, "job configuration is not UTF-8 text") from None
        try:
            document = json.loads(text)
        except ValueError as exc:
            raise CorruptNodeError(path, f"job configuration is not JSON: {exc}") from None
        if not isinstance(document, dict):
            raise CorruptNodeError(
                path, f"job configuration is a JSON {type(document).__name__}, not an object"
            )
        if "name" not in document:
            raise CorruptNodeError(path, "job configuration has no 'name'")
        known = {f.name for f in dataclasses.fields(cls)}
        values = {key: value for key, value in document.items() if key in known}
        try:
            return cls(**values)
        except (ValueError, TypeError) as exc:
            raise CorruptNodeError(path, f"job configuration: {exc}") from None


# -- field checks -------------------------------------------------------------------------------
def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_str(name: str, value: object) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{name} {value!r}: must be a str")


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"name {name!r}: must be a non-empty str")
    if name in (".", ".."):
        raise ValueError(f"name {name!r}: '.' and '..' are not job names")
    for char in name:
        if not _NAME_CHARS.fullmatch(char) or (
            not char.isascii() and (char.isspace() or not char.isprintable())
        ):
            raise ValueError(
                f"name {name!r}: {char!r} not allowed (one path segment: letters, digits, "
                "'_', '.', '-', ':' and printable non-ASCII characters)"
            )


def _check_props(props: object) -> None:
    if not isinstance(props, Mapping):
        raise ValueError(f"props {props!r}: must be a mapping of str to str")
    for key, value in props.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValueError(f"props {{{key!r}: {value!r}}}: keys and values must be str")


# -- sharding item parameters ----------------------------------------------------------------
def parse_item_parameters(text: str, total: int) -> dict[int, str]:
    """``"0=Beijing, 1=Shanghai"`` -> ``{0: "Beijing", 1: "Shanghai"}``; items in
    ``0..total-1``, each at most once; whitespace around tokens ignored; trailing commas
    tolerated (as ElasticJob's Java split does). ``ValueError`` naming
    ``sharding_item_parameters`` and the bad piece."""
    result: dict[int, str] = {}
    if not text.strip():
        return result
    pieces = text.split(",")
    while pieces and not pieces[-1].strip():
        pieces.pop()
    for piece in pieces:
        key, equals, value = piece.partition("=")
        key, value = key.strip(), value.strip()
        if not equals or "=" in value or not key or not value:
            raise ValueError(f"sharding_item_parameters: {piece.strip()!r} is not 'item=parameter'")
        if not _ITEM_KEY.fullmatch(key):
            raise ValueError(f"sharding_item_parameters: item {key!r} in {piece.strip()!r} is not a number")
        item = int(key)
        if item >= total:
            raise ValueError(
                f"sharding_item_parameters: item {item} out of range 0-{total - 1} "
                f"(sharding_total_count {total})"
            )
        if item in result:
            raise ValueError(f"sharding_item_parameters: item {item} given twice")
        result[item] = value
    return result


def format_item_parameters(parameters: Mapping[int, str]) -> str:
    """The inverse of :func:`parse_item_parameters` (items ascending)."""
    return ",".join(f"{item}={parameters[item]}" for item in sorted(parameters))
