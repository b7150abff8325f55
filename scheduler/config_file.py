"""Many jobs from one TOML file: ``shardjob worker --config FILE`` runs them and
``shardjob check --config FILE`` only validates them. The reference of the format is in
docs/operations.md ("Many jobs from one file")::

    registry = "zk://127.0.0.1:2181/app"         # required
    instance_id = "..."  max_workers = 8         # optional, as shardjob worker's flags
    history = "sqlite:///runs.db"  http = "127.0.0.1:9100"

    [jobs.settle-orders]                          # one table per job; the key is its name
    target = "myapp.jobs:settle_orders"           # none for SCRIPT and HTTP jobs
    listeners = ["myapp.audit:AuditListener"]     # instances, or classes/factories called once
    error_handler = "LOG"                         # LOG, THROW, IGNORE or "module:attr"
    cron = "0 */5 * * * ?"                        # ... and any other JobConfig field by name
    job_parameter = "${SETTLE_TOKEN}"             # ${VAR}, ${VAR:-default}, $$ for "$"

Invariants:
- A ``WorkerFile`` that exists is valid: every ``JobConfig`` built (so validated), every
  target, listener and handler imported, every target checked against its job type by
  ``kinds.make_item_runner``. Loading never connects to the registry.
- Every error names the file, the job (``[jobs.NAME]``; nothing for a top-level key) and
  the field, and ``ConfigFileError.errors`` holds every error of the file (a job's in the
  order of its keys). No error is reported that only follows from another: a value whose
  substitution failed is not judged further, and once a field fails ``JobConfig``'s
  validation the fields whose validity depends on it (its group in ``_DEPENDENT``) are
  not judged.
- ``${...}`` is substituted in string values after TOML parsing: a value (a secret) can
  never change the file's syntax. An error message quotes a substituted value in its
  ``${...}`` form, not the secret, wherever it quotes the value as Python's ``repr``
  (every message of ``JobConfig`` does); a message quoting a part of it could still show
  that part.

Hazard: loading runs code of the user's: the modules of targets, listeners and handlers
are imported, and a listener given as a class or factory is called once per job that
names it — in ``shardjob check`` too.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import enum
import functools
import json
import os
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import registry
from scheduler.config import ERROR_HANDLERS, JobConfig, JobType
from scheduler.handlers import ErrorHandler, JobListener
from scheduler.http import parse_address
from scheduler.http_job import HttpUnavailable
from scheduler.kinds import JobTarget, close_item_runner, make_item_runner
from scheduler.scheduler import Scheduler
from sharding.instance import InstanceIdentity
from sharding.strategy_loader import import_object

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, as a package, before it joined the standard library
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

__all__ = [
    "TOP_LEVEL_KEYS",
    "ConfigFileError",
    "JobSpec",
    "WorkerFile",
    "build_scheduler",
    "load_worker_file",
    "make_listener",
    "parse_worker_file",
    "substitute",
]

#: the optional scheduler options of a file, named as ``Scheduler``'s keywords and
#: ``shardjob worker``'s flags (``http``: ``--http``, ``Scheduler.serve_http``)
SCHEDULER_OPTIONS = ("instance_id", "max_workers", "history", "http")
TOP_LEVEL_KEYS = ("registry", *SCHEDULER_OPTIONS, "jobs")
#: a job table's keys that are not ``JobConfig`` fields
JOB_EXTRA_KEYS = ("target", "listeners")
#: job types whose work is in the config (a command, a request): they take no target
TARGETLESS = {
    JobType.SCRIPT: "its command is script_command_line",
    JobType.HTTP: "its request is in props",
}
#: fields whose validity depends on each other: when one fails, the others of its group
#: are not judged (their errors could be consequences of it)
_DEPENDENT = (
    frozenset({"cron", "time_zone"}),
    frozenset({"sharding_total_count", "sharding_item_parameters"}),
    frozenset({"job_type", "script_command_line", "streaming_process", "props"}),
    frozenset({"failover", "monitor_execution"}),
)

_SUBSTITUTION = re.compile(
    r"\$(?:(?P<dollar>\$)"
    r"|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}"
    r"|(?P<bad>\{[^}]*\}?))"
)
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_FIELD_AT_START = re.compile(r"[a-z_]+")


class ConfigFileError(ValueError):
    """Everything wrong with one file, one message per error (each naming the file)."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = tuple(errors)


@dataclass(frozen=True)
class JobSpec:
    """One ``[jobs.NAME]`` table, resolved: what ``Scheduler.add_job`` takes."""

    config: JobConfig
    target: JobTarget | None = None
    target_spec: str | None = None
    listeners: tuple[JobListener, ...] = ()
    listener_specs: tuple[str, ...] = ()
    #: a callable handler named by ``"module:attr"``; None: ``config.error_handler`` (a name)
    error_handler: ErrorHandler | None = None
    error_handler_spec: str | None = None

    def describe(self) -> str:
        """One line for ``shardjob check``; never a value that may hold a secret
        (job_parameter, script_command_line, props)."""
        c = self.config
        parts = [c.job_type.name + (f" {self.target_spec}" if self.target_spec else "")]
        if c.cron is None:
            parts.append("one-off (runs when triggered)")
        else:
            parts.append(f"cron {c.cron!r}" + (f" in {c.time_zone}" if c.time_zone else ""))
        parts.append(f"{c.sharding_total_count} item{'s' if c.sharding_total_count != 1 else ''}")
        if c.failover:
            parts.append("failover")
        if self.listener_specs:
            parts.append("listeners " + ", ".join(self.listener_specs))
        parts.append(f"error_handler {self.error_handler_spec or str(c.error_handler)}")
        return f"{_table(c.name)} ok: " + ", ".join(parts)


@dataclass(frozen=True)
class WorkerFile:
    """A whole file, valid (see the module doc): the scheduler options and the jobs."""

    path: str
    registry: str
    instance_id: str | None = None
    max_workers: int | None = None
    history: str | None = None
    http: str | None = None
    jobs: tuple[JobSpec, ...] = field(default=())

    def describe(self) -> list[str]:
        """One line per job, in the file's order."""
        return [job.describe() for job in self.jobs]


def build_scheduler(
    worker_file: WorkerFile,
    *,
    instance_id: str | None = None,
    max_workers: int | None = None,
    history: str | None = None,
) -> Scheduler:
    """A ``Scheduler`` (not started) with every job of the file added; a keyword given here
    wins over the file's option (the worker's command line over the file)."""
    sched = Scheduler(
        worker_file.registry,
        instance_id=instance_id or worker_file.instance_id,
        max_workers=max_workers or worker_file.max_workers,
        history=history or worker_file.history,
    )
    for job in worker_file.jobs:
        sched.add_job(job.config, job.target, listeners=job.listeners, error_handler=job.error_handler)
    return sched


# -- loading ------------------------------------------------------------------------------------
def load_worker_file(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> WorkerFile:
    """Read, substitute (from ``environ``, default ``os.environ``) and validate the file at
    ``path``; ``ConfigFileError`` with every error otherwise. Messages name the file as
    ``path`` is written."""
    name = os.fspath(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigFileError([f"{name}: cannot read it: {exc.strerror or exc}"]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigFileError([f"{name}: not UTF-8 text (byte {exc.start}): TOML files are UTF-8"]) from None
    return parse_worker_file(text, name, environ)


def parse_worker_file(text: str, name: str, environ: Mapping[str, str] | None = None) -> WorkerFile:
    """As :func:`load_worker_file`, for the file's ``text``; ``name`` names it in messages."""
    try:
        document: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError([f"{name}: not valid TOML: {exc}"]) from None
    loader = _Loader(name, os.environ if environ is None else environ)
    worker_file = loader.load(document)
    if loader.errors or worker_file is None:
        raise ConfigFileError(loader.redacted_errors())
    return worker_file


def make_listener(spec: str, what: str) -> JobListener:
    """The listener that ``"module:attr"`` names: the attribute itself when it is one (has
    ``before_job`` and ``after_job``), else what calling it with no argument returns (a
    class, a factory). ``ValueError`` naming ``what`` and ``spec`` otherwise."""
    found = _import(spec, what)
    if isinstance(found, type) or (callable(found) and not _is_listener(found)):
        try:
            found = found()
        except Exception as exc:
            raise ValueError(
                f"{what} {spec!r}: calling it to make a listener raised {type(exc).__name__}: {exc}"
            ) from None
    if not _is_listener(found):
        raise ValueError(
            f"{what} {spec!r}: {_a(type(found).__name__)} is not a listener (it needs before_job(run) "
            "and after_job(run), as a scheduler.JobListener has)"
        )
    return cast(JobListener, found)


def substitute(text: str, environ: Mapping[str, str]) -> tuple[str, list[str], bool]:
    """``${VAR}``, ``${VAR:-default}`` (the default when VAR is unset or empty) and ``$$``
    (a literal ``$``) in ``text``; any other ``$`` stays as it is. Returns the text, the
    problems (an unset VAR without default, a malformed ``${``) and whether a variable or
    default was substituted."""
    problems: list[str] = []
    used = False

    def one(match: re.Match[str]) -> str:
        nonlocal used
        if match["dollar"]:
            return "$"
        if match["bad"] is not None:
            problems.append(
                f"${match['bad']}: not a substitution (write ${{NAME}} or ${{NAME:-default}}, "
                "and $$ for a literal $)"
            )
            return match.group(0)
        variable = match["name"]
        value = environ.get(variable)
        if match["default"] is not None:
            used = True
            return value if value else match["default"]
        if value is None:
            problems.append(
                f"${{{variable}}}: environment variable {variable} is not set "
                f"(give a default with ${{{variable}:-default}})"
            )
            return match.group(0)
        used = True
        return value

    return _SUBSTITUTION.sub(one, text), problems, used


# -- the loader ---------------------------------------------------------------------------------
class _Loader:
    """One file's validation: collects every error instead of stopping at the first."""

    def __init__(self, name: str, environ: Mapping[str, str]) -> None:
        self.name = name
        self.environ = environ
        self.errors: list[str] = []
        #: (repr of a substituted value, repr of its ${...} form) for every substitution
        self._redactions: list[tuple[str, str]] = []

    def redacted_errors(self) -> list[str]:
        errors = []
        for message in self.errors:
            for secret, written in self._redactions:
                message = message.replace(secret, written)
            errors.append(message)
        return errors

    def error(self, where: str, message: str) -> None:
        self.errors.append(f"{self.name}: {where}{message}")

    # -- values ---------------------------------------------------------------------------
    def substituted(self, value: Any, where: str, path: str) -> Any:
        """``value`` with substitutions in every string in it; problems named by ``path``."""
        if isinstance(value, str):
            text, problems, used = substitute(value, self.environ)
            for problem in problems:
                self.error(where, f"{path}: {problem}")
            if used and text:
                self._redactions.append((repr(text), repr(value)))
            return text
        if isinstance(value, list):
            return [self.substituted(item, where, f"{path}[{i}]") for i, item in enumerate(value)]
        if isinstance(value, dict):
            return {key: self.substituted(item, where, f"{path} {key!r}") for key, item in value.items()}
        return value

    def unknown(self, where: str, key: str, known: tuple[str, ...]) -> None:
        close = difflib.get_close_matches(key, known, n=1)
        if close:
            hint = f"; did you mean {close[0]}?"
        else:  # the top level's few keys are listed; a job's many are in docs/operations.md
            hint = f" (known: {', '.join(known)})" if len(known) <= len(TOP_LEVEL_KEYS) else ""
        self.error(where, f"{key}: unknown field{hint}")

    # -- the file -------------------------------------------------------------------------
    def load(self, document: dict[str, Any]) -> WorkerFile | None:
        for key in document:
            if key not in TOP_LEVEL_KEYS:
                self.unknown("", key, TOP_LEVEL_KEYS)
        options: dict[str, Any] = {}
        for key in ("registry", *SCHEDULER_OPTIONS):
            if key in document:
                before = len(self.errors)
                value = self.substituted(document[key], "", key)
                if len(self.errors) == before:  # a value not substituted is not judged further
                    options[key] = value
        unsubstituted = "registry" in document and "registry" not in options
        url = None if unsubstituted else self.registry(options.get("registry"))
        instance_id = self.text_option(options, "instance_id", _check_instance_id)
        max_workers = options.get("max_workers")
        if max_workers is not None and (not _is_int(max_workers) or max_workers < 1):
            self.error("", f"max_workers {max_workers!r}: must be an integer >= 1")
            max_workers = None
        history = self.text_option(options, "history", None)
        http = self.text_option(options, "http", _check_http)
        jobs = self.jobs(document.get("jobs"))
        if self.errors or url is None:
            return None
        return WorkerFile(self.name, url, instance_id, max_workers, history, http, tuple(jobs))

    def registry(self, url: Any) -> str | None:
        if url is None:
            self.error("", 'registry: missing (the registry URL, e.g. registry = "zk://127.0.0.1:2181/app")')
            return None
        if not isinstance(url, str):
            self.error("", f"registry {url!r}: must be a string (a registry URL), not {_toml_type(url)}")
            return None
        try:
            registry.parse_url(url)
        except ValueError as exc:
            self.error("", f"registry: {exc}")
            return None
        return url

    def text_option(
        self, options: Mapping[str, Any], key: str, check: Callable[[str], None] | None
    ) -> str | None:
        value = options.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            self.error("", f"{key} {value!r}: must be a non-empty string")
            return None
        if check is not None:
            try:
                check(value)
            except ValueError as exc:
                self.error("", f"{key} {value!r}: {exc}")
                return None
        return value

    def jobs(self, tables: Any) -> list[JobSpec]:
        if tables is None:
            self.error("", "jobs: no jobs (declare each in a table of its own: [jobs.NAME])")
            return []
        if not isinstance(tables, dict):
            self.error("", f"jobs: must be tables, one per job ([jobs.NAME]), not {_toml_type(tables)}")
            return []
        if not tables:
            self.error("", "jobs: no jobs (declare each in a table of its own: [jobs.NAME])")
        specs = []
        for job_name, table in tables.items():
            if not isinstance(table, dict):
                self.error(
                    "", f"{_table(job_name)}: must be a table of the job's fields, not {_toml_type(table)}"
                )
                continue
            spec = self.job(job_name, table)
            if spec is not None:
                specs.append(spec)
        return specs

    # -- one job --------------------------------------------------------------------------
    def job(self, job_name: str, table: dict[str, Any]) -> JobSpec | None:
        where = f"{_table(job_name)} "
        before = len(self.errors)
        kinds = _field_kinds()
        known = (*JOB_EXTRA_KEYS, *kinds)
        fields: dict[str, Any] = {}
        target_spec: str | None = None
        listener_specs: list[str] = []
        handler_spec: str | None = None
        for key, raw in table.items():
            if key == "name":
                self.error(where, "name: not a field here: a job is named by its table ([jobs.NAME])")
                continue
            if key not in known:
                self.unknown(where, key, known)
                continue
            known_errors = len(self.errors)
            value = _flatten_props(self, where, raw) if key == "props" else raw
            value = self.substituted(value, where, key)
            if len(self.errors) > known_errors:
                continue  # a value not substituted is not judged further
            if key == "target":
                target_spec = self.spec_value(where, key, value)
            elif key == "listeners":
                listener_specs = self.listener_values(where, value)
            elif key == "error_handler" and isinstance(value, str) and value.upper() not in ERROR_HANDLERS:
                if ":" in value:
                    handler_spec = value
                else:
                    self.error(
                        where,
                        f"error_handler {value!r}: not one of {', '.join(ERROR_HANDLERS)}, "
                        'nor "module:attr" of a handler(ctx, exc)',
                    )
            elif self.typed(where, key, value, kinds[key]):
                fields[key] = value
        config = self.config(where, job_name, fields)
        target = self.target(where, config, target_spec, given="target" in table)
        listeners = []
        for spec in listener_specs:
            try:
                listeners.append(make_listener(spec, "listeners"))
            except ValueError as exc:
                self.error(where, str(exc))
        handler = self.handler(where, handler_spec)
        if len(self.errors) > before:
            self.errors[before:] = sorted(self.errors[before:], key=_in_order(self.name, where, list(table)))
            return None
        if config is None:
            return None
        return JobSpec(
            config, target, target_spec, tuple(listeners), tuple(listener_specs), handler, handler_spec
        )

    def spec_value(self, where: str, key: str, value: Any) -> str | None:
        if isinstance(value, str) and value:
            return value
        self.error(where, f'{key} {value!r}: must be a string "module:attr", not {_toml_type(value)}')
        return None

    def listener_values(self, where: str, value: Any) -> list[str]:
        if isinstance(value, list) and all(isinstance(item, str) and item for item in value):
            return list(value)
        self.error(where, f'listeners {value!r}: must be an array of strings "module:attr"')
        return []

    def typed(self, where: str, key: str, value: Any, kind: str | None) -> bool:
        """Whether ``value`` has the TOML type of field ``key`` (an error if not)."""
        if kind == "props" and isinstance(value, dict):
            strings = True
            for prop, item in value.items():
                if not isinstance(item, str):
                    hint = f' (quote it: "{json.dumps(item)}")' if isinstance(item, int | float) else ""
                    self.error(where, f"props {prop!r} {item!r}: must be a string{hint}")
                    strings = False
            if not strings:
                return False
        expected = {
            "str": (str,),
            "int": (int,),
            "number": (int, float),
            "bool": (bool,),
            "props": (dict,),
        }.get(kind or "")
        if expected is None:
            return True  # a type this loader does not know: JobConfig's own check judges it
        if isinstance(value, bool) != (kind == "bool") or not isinstance(value, expected):
            words = {
                "str": "a string",
                "int": "an integer",
                "number": "a number",
                "bool": "a boolean (true or false)",
                "props": "a table of strings",
            }
            self.error(where, f"{key} {value!r}: must be {words[kind or '']}, not {_toml_type(value)}")
            return False
        return True

    def config(self, where: str, job_name: str, fields: dict[str, Any]) -> JobConfig | None:
        """``JobConfig`` of ``fields``; each field it refuses is reported and left out, with
        the fields that depend on it, and the rest tried again (see ``_DEPENDENT``)."""
        try:
            JobConfig(name=job_name)
        except ValueError as exc:
            self.error(where, str(exc))
            return None
        remaining = dict(fields)
        failed = False
        while True:
            try:
                config = JobConfig(name=job_name, **remaining)
            except (ValueError, TypeError) as exc:
                failed = True
                self.error(where, str(exc))
                found = _FIELD_AT_START.match(str(exc))
                bad = found.group(0) if found else ""
                group = next((g for g in _DEPENDENT if bad in g), frozenset({bad}))
                dropped = [name for name in group if name in remaining]
                if not dropped:
                    return None  # nothing left to leave out: no further error can be told apart
                for name in dropped:
                    del remaining[name]
                continue
            # without the fields left out it validates, but it is not the job the file declares
            return None if failed else config

    def target(self, where: str, config: JobConfig | None, spec: str | None, given: bool) -> JobTarget | None:
        """The target ``spec`` names, checked against the job type; ``given``: the table has
        a ``target`` key (a bad one is reported already, not again as missing)."""
        target: Any = None
        if spec is not None:
            try:
                target = _import(spec, "target")
                if isinstance(target, type):  # a class is instantiated once, as --job's is
                    target = target()
            except ValueError as exc:
                self.error(where, str(exc))
                return None
            except Exception as exc:
                self.error(where, f"target {spec!r}: calling the class raised {type(exc).__name__}: {exc}")
                return None
        if config is None or (given and spec is None):
            return None
        kind = config.job_type
        if kind in TARGETLESS:
            if spec is not None:
                self.error(
                    where, f"target {spec!r}: {_a(kind.name)} job takes no target ({TARGETLESS[kind]})"
                )
                return None
        elif spec is None:
            self.error(where, f'target: missing ({_a(kind.name)} job needs target = "module:attr")')
            return None
        field_name = f"target {spec!r}" if spec is not None else f"job_type {kind.name!r}"
        try:
            item_runner = make_item_runner(config, target)
        except ValueError as exc:
            self.error(where, f"{field_name}: {str(exc).removeprefix(f'job {config.name}: ')}")
            return None
        except HttpUnavailable as exc:  # an HTTP job without the http extra
            self.error(where, f"{field_name}: {exc}")
            return None
        close_item_runner(item_runner)  # made to check only; add_job makes the job's own
        return cast(JobTarget | None, target)

    def handler(self, where: str, spec: str | None) -> ErrorHandler | None:
        if spec is None:
            return None
        try:
            found = _import(spec, "error_handler")
        except ValueError as exc:
            self.error(where, str(exc))
            return None
        if not callable(found):
            self.error(
                where,
                f"error_handler {spec!r}: {_a(type(found).__name__)} is not callable as handler(ctx, exc)",
            )
            return None
        return cast(ErrorHandler, found)


# -- helpers ------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _field_kinds() -> dict[str, str | None]:
    """Each ``JobConfig`` field but ``name`` -> the kind of TOML value it takes (None: one
    this loader does not know, left to ``JobConfig``'s check). Read from the dataclass, so
    a field added to ``JobConfig`` is a key of the file without a change here."""
    hints = typing.get_type_hints(JobConfig)
    return {f.name: _kind(hints[f.name]) for f in dataclasses.fields(JobConfig) if f.name != "name"}


def _kind(hint: Any) -> str | None:
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        rest = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return _kind(rest[0]) if len(rest) == 1 else None  # TOML has no null: absent is None
    if hint is bool:
        return "bool"
    if hint is int:
        return "int"
    if hint is float:
        return "number"
    if hint is str or (isinstance(hint, type) and issubclass(hint, enum.Enum)):
        return "str"  # an enum by its name: JobConfig takes job_type = "dataflow"
    if origin is collections.abc.Mapping:
        return "props"
    return None


def _in_order(name: str, where: str, keys: list[str]) -> Callable[[str], int]:
    """A sort key putting a job's errors in the order of the fields they name in the file
    (an error naming no key of the table, such as a missing target, last)."""
    skip = len(f"{name}: {where}")

    def position(message: str) -> int:
        found = _FIELD_AT_START.match(message, skip)
        return keys.index(found.group(0)) if found and found.group(0) in keys else len(keys)

    return position


def _flatten_props(loader: _Loader, where: str, value: Any) -> Any:
    """``props``' nested tables as dotted keys: ``http.uri = "..."`` in TOML is a table
    ``http`` holding ``uri``, and ElasticJob's prop is ``"http.uri"``."""
    if not isinstance(value, dict):
        return value
    flat: dict[str, Any] = {}
    for key, item in _dotted(value, ""):
        if key in flat:
            loader.error(where, f"props {key!r}: given twice (as a dotted key and a quoted one)")
        flat[key] = item
    return flat


def _dotted(table: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, Any]]:
    for key, item in table.items():
        if isinstance(item, dict):
            yield from _dotted(item, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", item


def _import(spec: str, what: str) -> Any:
    """``import_object``, with an import that fails in any way (not only ImportError) a
    ``ValueError`` naming ``what``, ``spec`` and the module."""
    try:
        return import_object(spec, what)
    except ValueError:
        raise
    except Exception as exc:
        module = spec.partition(":")[0]
        raise ValueError(
            f"{what} {spec!r}: importing {module!r} raised {type(exc).__name__}: {exc}"
        ) from None


def _is_listener(value: object) -> bool:
    return callable(getattr(value, "before_job", None)) and callable(getattr(value, "after_job", None))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_instance_id(value: str) -> None:
    try:
        InstanceIdentity.create(value, ip="127.0.0.1")
    except ValueError:
        raise ValueError("must contain no '/'") from None


def _check_http(value: str) -> None:
    try:
        parse_address(value)
    except ValueError:
        raise ValueError("must be HOST:PORT, e.g. 127.0.0.1:9100") from None


def _a(word: str) -> str:
    """``word`` with its indefinite article ("an HTTP job", "an int", "a SCRIPT job")."""
    return f"{'an' if word[:1].upper() in 'AEIOU' or word == 'HTTP' else 'a'} {word}"


def _table(name: str) -> str:
    """How the job's table header is written in TOML (quoted when not a bare key)."""
    key = name if _BARE_KEY.fullmatch(name) else json.dumps(name, ensure_ascii=False)
    return f"[jobs.{key}]"


def _toml_type(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__}"  # TOML's dates and times
