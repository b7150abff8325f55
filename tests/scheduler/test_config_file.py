"""``scheduler.config_file`` (a TOML file of many jobs) and ``shardjob check --config``:
what a valid file becomes, ``${VAR}`` substitution, and every kind of error with its
exact message (file, job and field named), all of a file's errors at once.

The workers that run such a file, on every backend: tests/scenarios/test_config_file_workers.py.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from scheduler import DistributeOnceListener, JobConfig, JobType
from scheduler.config_file import (
    ConfigFileError,
    WorkerFile,
    load_worker_file,
    make_listener,
    parse_worker_file,
    substitute,
)
from tests.scheduler import file_jobs
from tests.scheduler.test_cli import shardjob, unreachable

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

FJ = "tests.scheduler.file_jobs"
REGISTRY = 'registry = "memory://config-file"\n'
#: one valid job, for files whose error is elsewhere
VALID_JOB = f'[jobs.ok]\ntarget = "{FJ}:record"\n'
NAME = "jobs.toml"


def parse(text: str, environ: Mapping[str, str] | None = None) -> WorkerFile:
    return parse_worker_file(text, NAME, environ or {})


def errors_of(text: str, environ: Mapping[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigFileError) as caught:
        parse(text, environ)
    assert str(caught.value) == "\n".join(caught.value.errors)
    return list(caught.value.errors)


# -- a valid file -------------------------------------------------------------------------------
FULL = f"""
registry = "zk://127.0.0.1:2181/app"
instance_id = "10.0.0.1@-@worker-1"
max_workers = 8
history = "sqlite:///runs.db"
http = "127.0.0.1:9100"

[jobs.settle-orders]
target = "{FJ}:record"
cron = "0/5 * * * * ?"
time_zone = "Asia/Shanghai"
sharding_total_count = 3
sharding_item_parameters = "0=Beijing,1=Shanghai,2=Guangzhou"
job_parameter = "fast"
failover = true
misfire = false
listeners = ["{FJ}:LISTENER", "{FJ}:RecordingListener", "{FJ}:make_listener"]
error_handler = "{FJ}:handler"
timeout_seconds = 30
retries = 2
retry_backoff_seconds = 0.5
reconcile_interval_minutes = 0.5
props = {{ owner = "payments" }}

[jobs.flow]
target = "{FJ}:Dataflow"
job_type = "dataflow"
streaming_process = true
error_handler = "throw"

[jobs."nightly.report"]
job_type = "SCRIPT"
script_command_line = "echo hello"
cron = "0 30 2 * * ?"
listeners = ["tests.scenarios.once_listener:RecordingOnce"]

[jobs.ping]
job_type = "http"
cron = "0 * * * * ?"
[jobs.ping.props]
http.uri = "https://example.test/ping"
http.method = "GET"
"http.read.timeout.milliseconds" = "2000"

"""


def test_a_valid_file_becomes_scheduler_options_and_resolved_jobs() -> None:
    made_before = file_jobs.RecordingListener.made
    loaded = parse(FULL)
    assert (loaded.path, loaded.registry, loaded.instance_id, loaded.max_workers, loaded.history, loaded.http) == (
        NAME, "zk://127.0.0.1:2181/app", "10.0.0.1@-@worker-1", 8, "sqlite:///runs.db", "127.0.0.1:9100",
    )  # fmt: skip
    assert [job.config.name for job in loaded.jobs] == ["settle-orders", "flow", "nightly.report", "ping"]
    settle, flow, nightly, ping = loaded.jobs
    assert settle.config == JobConfig(
        name="settle-orders",
        cron="0/5 * * * * ?",
        time_zone="Asia/Shanghai",
        sharding_total_count=3,
        sharding_item_parameters="0=Beijing,1=Shanghai,2=Guangzhou",
        job_parameter="fast",
        failover=True,
        misfire=False,
        timeout_seconds=30,
        retries=2,
        retry_backoff_seconds=0.5,
        reconcile_interval_minutes=0.5,
        props={"owner": "payments"},
    )
    assert dict(settle.config.props) == {"owner": "payments"}
    assert settle.target is file_jobs.record
    # an instance is used as it is; a class and a factory are each called once
    assert settle.listeners[0] is file_jobs.LISTENER
    assert [type(x) for x in settle.listeners] == [file_jobs.RecordingListener] * 3
    assert [getattr(x, "label", None) for x in settle.listeners] == ["instance", "class", "factory"]
    assert file_jobs.RecordingListener.made == made_before + 2
    # a callable handler goes to add_job; the config keeps the built-in default
    assert settle.error_handler is file_jobs.handler
    assert settle.config.error_handler == "LOG"
    assert isinstance(flow.target, file_jobs.Dataflow)  # a class target is instantiated once
    assert flow.config.job_type is JobType.DATAFLOW and flow.config.streaming_process
    assert (flow.config.error_handler, flow.error_handler) == ("THROW", None)
    assert nightly.target is None and nightly.config.job_type is JobType.SCRIPT
    # a once-per-cluster listener is a listener like any other: made once, passed as it is
    (once,) = nightly.listeners
    assert isinstance(once, DistributeOnceListener) and type(once).__name__ == "RecordingOnce"
    assert ping.target is None and ping.config.job_type is JobType.HTTP
    assert dict(ping.config.props) == {
        "http.uri": "https://example.test/ping",
        "http.method": "GET",
        "http.read.timeout.milliseconds": "2000",
    }


def test_props_nested_tables_become_dotted_prop_names() -> None:
    """``http.uri = ...`` in a props table is TOML for a table ``http``; ElasticJob's prop
    is ``"http.uri"``: both spellings give the same props."""
    text = (
        REGISTRY
        + f'[jobs.a]\ntarget = "{FJ}:record"\n[jobs.a.props]\nhttp.uri = "u"\n"http.method" = "GET"\nx = "1"\n'
    )
    (job,) = parse(text).jobs
    assert dict(job.config.props) == {"http.uri": "u", "http.method": "GET", "x": "1"}


def test_every_jobconfig_field_is_a_key_of_a_job_table() -> None:
    """Each ``JobConfig`` field but ``name`` (the table's key) is accepted under its own name
    (here at its default), so a field added to ``JobConfig`` needs no change to the loader."""

    def toml(value: Any) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int | float):
            return repr(value)
        if isinstance(value, JobType):
            return json.dumps(value.name)
        if isinstance(value, Mapping):
            return "{ " + ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in value.items()) + " }"
        return json.dumps(str(value))

    defaults = JobConfig(name="every-field")
    lines = [
        f"{f.name} = {toml(getattr(defaults, f.name))}"
        for f in dataclasses.fields(JobConfig)
        if f.name != "name" and getattr(defaults, f.name) is not None
    ]
    (job,) = parse(REGISTRY + f'[jobs.every-field]\ntarget = "{FJ}:record"\n' + "\n".join(lines)).jobs
    assert job.config == defaults


def test_check_lines_describe_each_job_without_secrets() -> None:
    lines = parse(
        FULL.replace('job_parameter = "fast"', 'job_parameter = "${TOKEN}"'), {"TOKEN": "s3cret"}
    ).describe()
    assert lines == [
        f"[jobs.settle-orders] ok: SIMPLE {FJ}:record, cron '0/5 * * * * ?' in Asia/Shanghai, 3 items, failover, "
        f"listeners {FJ}:LISTENER, {FJ}:RecordingListener, {FJ}:make_listener, error_handler {FJ}:handler",
        f"[jobs.flow] ok: DATAFLOW {FJ}:Dataflow, one-off (runs when triggered), 1 item, error_handler THROW",
        "[jobs.\"nightly.report\"] ok: SCRIPT, cron '0 30 2 * * ?', 1 item, "
        "listeners tests.scenarios.once_listener:RecordingOnce, error_handler LOG",
        "[jobs.ping] ok: HTTP, cron '0 * * * * ?', 1 item, error_handler LOG",
    ]
    printed = "\n".join(lines)
    assert "s3cret" not in printed and "echo hello" not in printed and "example.test" not in printed


# -- environment substitution ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "environ", "expected"),
    [
        ("${A}", {"A": "x"}, "x"),
        ("pre-${A}-post", {"A": "x"}, "pre-x-post"),
        ("${A}${B}", {"A": "1", "B": "2"}, "12"),
        ("${A:-dflt}", {}, "dflt"),
        ("${A:-dflt}", {"A": ""}, "dflt"),
        ("${A:-dflt}", {"A": "set"}, "set"),
        ("${A:-}", {}, ""),
        ("${A:-a b:c/d}", {}, "a b:c/d"),
        ("${A}", {"A": ""}, ""),
        ("$$", {}, "$"),
        ("$${A}", {"A": "x"}, "${A}"),
        ("cost $$5", {}, "cost $5"),
        ("echo $HOME $1", {"HOME": "/h"}, "echo $HOME $1"),
        ("trailing $", {}, "trailing $"),
        ('quote " and \\n newline ${A}', {"A": '"\n]'}, 'quote " and \\n newline "\n]'),
    ],
)  # fmt: skip
def test_substitute(text: str, environ: dict[str, str], expected: str) -> None:
    result, problems, _ = substitute(text, environ)
    assert (result, problems) == (expected, [])


def test_substitution_reaches_every_string_value_after_parsing() -> None:
    """A value that would break TOML's syntax (a quote, a newline, a bracket) arrives as it
    is: substitution runs on the parsed values."""
    environ = {"URL": "memory://subst", "TOKEN": 'tok"en\n[jobs.x]', "MOD": FJ, "OWNER": "ops"}
    text = (
        'registry = "${URL}"\n'
        '[jobs.a]\ntarget = "${MOD}:record"\njob_parameter = "${TOKEN}"\n'
        'listeners = ["${MOD}:LISTENER"]\ndescription = "costs $$5 for ${WHO:-nobody}"\n'
        'props = { owner = "${OWNER}" }\n'
    )
    loaded = parse(text, environ)
    (job,) = loaded.jobs
    assert loaded.registry == "memory://subst"
    assert job.config.job_parameter == 'tok"en\n[jobs.x]'
    assert job.target is file_jobs.record and job.listeners == (file_jobs.LISTENER,)
    assert job.config.description == "costs $5 for nobody"
    assert dict(job.config.props) == {"owner": "ops"}


def test_load_reads_os_environ_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDJOB_TEST_FILE_TOKEN", "from-env")
    path = tmp_path / "jobs.toml"
    path.write_text(
        REGISTRY + VALID_JOB + 'job_parameter = "${SHARDJOB_TEST_FILE_TOKEN}"\n', encoding="utf-8"
    )
    assert load_worker_file(path).jobs[0].config.job_parameter == "from-env"
    assert load_worker_file(str(path)).path == str(path)


# -- errors: one per kind, exact messages -------------------------------------------------------------
UNSET = "environment variable {0} is not set (give a default with ${{{0}:-default}})"


@pytest.mark.parametrize(
    ("text", "environ", "expected"),
    [
        (VALID_JOB, {}, 'jobs.toml: registry: missing (the registry URL, e.g. registry = "zk://127.0.0.1:2181/app")'),
        ("registry = 5\n" + VALID_JOB, {}, "jobs.toml: registry 5: must be a string (a registry URL), not an integer"),
        ('registry = "bogus://h"\n' + VALID_JOB, {},
         "jobs.toml: registry: registry URL has an unknown scheme 'bogus'; known: etcd, memory, zk, zookeeper"),
        ('registry = "${ZK}"\n' + VALID_JOB, {}, "jobs.toml: registry: ${ZK}: " + UNSET.format("ZK")),
        (REGISTRY + "max_workers = 0\n" + VALID_JOB, {}, "jobs.toml: max_workers 0: must be an integer >= 1"),
        (REGISTRY + 'max_workers = "8"\n' + VALID_JOB, {}, "jobs.toml: max_workers '8': must be an integer >= 1"),
        (REGISTRY + 'http = "9100"\n' + VALID_JOB, {}, "jobs.toml: http '9100': must be HOST:PORT, e.g. 127.0.0.1:9100"),
        (REGISTRY + 'instance_id = "a/b"\n' + VALID_JOB, {}, "jobs.toml: instance_id 'a/b': must contain no '/'"),
        (REGISTRY + 'history = ""\n' + VALID_JOB, {}, "jobs.toml: history '': must be a non-empty string"),
        (REGISTRY + 'job = "x"\n' + VALID_JOB, {}, "jobs.toml: job: unknown field; did you mean jobs?"),
        (REGISTRY + 'zzz = "x"\n' + VALID_JOB, {},
         "jobs.toml: zzz: unknown field (known: registry, instance_id, max_workers, history, http, jobs)"),
        (REGISTRY, {}, "jobs.toml: jobs: no jobs (declare each in a table of its own: [jobs.NAME])"),
        (REGISTRY + "[jobs]\n", {}, "jobs.toml: jobs: no jobs (declare each in a table of its own: [jobs.NAME])"),
        (REGISTRY + "jobs = 3\n", {}, "jobs.toml: jobs: must be tables, one per job ([jobs.NAME]), not an integer"),
        (REGISTRY + "[jobs]\nx = 3\n", {}, "jobs.toml: [jobs.x]: must be a table of the job's fields, not an integer"),
        (REGISTRY + VALID_JOB + "sharding_total_count = 0\n", {},
         "jobs.toml: [jobs.ok] sharding_total_count 0: must be an int >= 1"),
        (REGISTRY + VALID_JOB + 'sharding_total_count = "3"\n', {},
         "jobs.toml: [jobs.ok] sharding_total_count '3': must be an integer, not a string"),
        (REGISTRY + VALID_JOB + "sharding_total_count = true\n", {},
         "jobs.toml: [jobs.ok] sharding_total_count True: must be an integer, not a boolean"),
        (REGISTRY + VALID_JOB + 'failover = "yes"\n', {},
         "jobs.toml: [jobs.ok] failover 'yes': must be a boolean (true or false), not a string"),
        (REGISTRY + VALID_JOB + "cron = 5\n", {}, "jobs.toml: [jobs.ok] cron 5: must be a string, not an integer"),
        (REGISTRY + VALID_JOB + 'retry_backoff_seconds = "1"\n', {},
         "jobs.toml: [jobs.ok] retry_backoff_seconds '1': must be a number, not a string"),
        (REGISTRY + VALID_JOB + "job_parameter = 1979-05-27\n", {},
         "jobs.toml: [jobs.ok] job_parameter datetime.date(1979, 5, 27): must be a string, not a date"),
        (REGISTRY + VALID_JOB + 'cron = "61 * * * *"\n', {},
         "jobs.toml: [jobs.ok] cron '61 * * * *': minute 61 out of range 0-59"),
        (REGISTRY + VALID_JOB + 'job_type = "batch"\n', {},
         "jobs.toml: [jobs.ok] job_type 'batch': not one of SIMPLE, DATAFLOW, SCRIPT, HTTP"),
        (REGISTRY + VALID_JOB + "props = { retries = 3 }\n", {},
         'jobs.toml: [jobs.ok] props \'retries\' 3: must be a string (quote it: "3")'),
        (REGISTRY + VALID_JOB + 'props = "a=b"\n', {},
         "jobs.toml: [jobs.ok] props 'a=b': must be a table of strings, not a string"),
        (REGISTRY + VALID_JOB + 'props = { "a.b" = "1", a = { b = "2" } }\n', {},
         "jobs.toml: [jobs.ok] props 'a.b': given twice (as a dotted key and a quoted one)"),
        (REGISTRY + VALID_JOB + "shardng_total_count = 3\n", {},
         "jobs.toml: [jobs.ok] shardng_total_count: unknown field; did you mean sharding_total_count?"),
        (REGISTRY + VALID_JOB + "listener = []\n", {}, "jobs.toml: [jobs.ok] listener: unknown field; did you mean listeners?"),
        (REGISTRY + VALID_JOB + "zzz = 1\n", {}, "jobs.toml: [jobs.ok] zzz: unknown field"),
        (REGISTRY + VALID_JOB + 'name = "other"\n', {},
         "jobs.toml: [jobs.ok] name: not a field here: a job is named by its table ([jobs.NAME])"),
        (REGISTRY + VALID_JOB + 'job_parameter = "${TOKEN}"\n', {},
         "jobs.toml: [jobs.ok] job_parameter: ${TOKEN}: " + UNSET.format("TOKEN")),
        (REGISTRY + VALID_JOB + 'props = { key = "${KEY}" }\n', {},
         "jobs.toml: [jobs.ok] props 'key': ${KEY}: " + UNSET.format("KEY")),
        (REGISTRY + VALID_JOB + 'job_parameter = "${TOKEN"\n', {},
         "jobs.toml: [jobs.ok] job_parameter: ${TOKEN: not a substitution (write ${NAME} or ${NAME:-default}, "
         "and $$ for a literal $)"),
        (REGISTRY + VALID_JOB + 'job_parameter = "${9LIVES}"\n', {},
         "jobs.toml: [jobs.ok] job_parameter: ${9LIVES}: not a substitution (write ${NAME} or "
         "${NAME:-default}, and $$ for a literal $)"),
        (REGISTRY + '[jobs."a b"]\n' + f'target = "{FJ}:record"\n', {},
         "jobs.toml: [jobs.\"a b\"] name 'a b': ' ' not allowed (one path segment: letters, digits, '_', '.', "
         "'-', ':' and printable non-ASCII characters)"),
        # targets
        (REGISTRY + "[jobs.ok]\n", {}, 'jobs.toml: [jobs.ok] target: missing (a SIMPLE job needs target = "module:attr")'),
        (REGISTRY + '[jobs.ok]\ntarget = "no_such_module_xyz:run"\n', {},
         "jobs.toml: [jobs.ok] target 'no_such_module_xyz:run': cannot import 'no_such_module_xyz': "
         "No module named 'no_such_module_xyz'"),
        (REGISTRY + f'[jobs.ok]\ntarget = "{FJ}:nope"\n', {},
         f"jobs.toml: [jobs.ok] target '{FJ}:nope': '{FJ}' has no attribute 'nope'"),
        (REGISTRY + '[jobs.ok]\ntarget = "tests.scheduler.file_jobs_broken:run"\n', {},
         "jobs.toml: [jobs.ok] target 'tests.scheduler.file_jobs_broken:run': importing "
         "'tests.scheduler.file_jobs_broken' raised RuntimeError: broken on purpose"),
        (REGISTRY + '[jobs.ok]\ntarget = "just_a_name"\n', {},
         "jobs.toml: [jobs.ok] target 'just_a_name': expected 'package.module:attr'"),
        (REGISTRY + "[jobs.ok]\ntarget = 5\n", {}, 'jobs.toml: [jobs.ok] target 5: must be a string "module:attr", not an integer'),
        (REGISTRY + f'[jobs.ok]\ntarget = "{FJ}:NOT_CALLABLE"\n', {},
         f"jobs.toml: [jobs.ok] target '{FJ}:NOT_CALLABLE': a simple job needs a callable taking a ShardingContext"),
        (REGISTRY + f'[jobs.ok]\ntarget = "{FJ}:record"\njob_type = "dataflow"\n', {},
         f"jobs.toml: [jobs.ok] target '{FJ}:record': a dataflow job needs an object with fetch_data and process_data"),
        (REGISTRY + f'[jobs.ok]\ntarget = "{FJ}:record"\njob_type = "script"\nscript_command_line = "true"\n', {},
         f"jobs.toml: [jobs.ok] target '{FJ}:record': a SCRIPT job takes no target (its command is script_command_line)"),
        (REGISTRY + f'[jobs.ok]\ntarget = "{FJ}:record"\njob_type = "http"\n'
         'props = { "http.uri" = "http://127.0.0.1:1/", "http.method" = "GET" }\n', {},
         f"jobs.toml: [jobs.ok] target '{FJ}:record': an HTTP job takes no target (its request is in props)"),
        (REGISTRY + '[jobs.ok]\njob_type = "script"\n', {},
         "jobs.toml: [jobs.ok] script_command_line '': a SCRIPT job needs a command"),
        # listeners and error handlers
        (REGISTRY + VALID_JOB + 'listeners = "x:y"\n', {},
         "jobs.toml: [jobs.ok] listeners 'x:y': must be an array of strings \"module:attr\""),
        (REGISTRY + VALID_JOB + 'listeners = ["no_such_module_xyz:L"]\n', {},
         "jobs.toml: [jobs.ok] listeners 'no_such_module_xyz:L': cannot import 'no_such_module_xyz': "
         "No module named 'no_such_module_xyz'"),
        (REGISTRY + VALID_JOB + f'listeners = ["{FJ}:NOT_CALLABLE"]\n', {},
         f"jobs.toml: [jobs.ok] listeners '{FJ}:NOT_CALLABLE': an int is not a listener (it needs "
         "before_job(run) and after_job(run), as a scheduler.JobListener has)"),
        (REGISTRY + VALID_JOB + f'listeners = ["{FJ}:Unmakeable"]\n', {},
         f"jobs.toml: [jobs.ok] listeners '{FJ}:Unmakeable': calling it to make a listener raised "
         "RuntimeError: no listener today"),
        (REGISTRY + VALID_JOB + 'error_handler = "LOGG"\n', {},
         "jobs.toml: [jobs.ok] error_handler 'LOGG': not one of LOG, THROW, IGNORE, nor \"module:attr\" of a "
         "handler(ctx, exc)"),
        (REGISTRY + VALID_JOB + f'error_handler = "{FJ}:NOT_CALLABLE"\n', {},
         f"jobs.toml: [jobs.ok] error_handler '{FJ}:NOT_CALLABLE': an int is not callable as handler(ctx, exc)"),
        (REGISTRY + VALID_JOB + 'error_handler = "no_such_module_xyz:h"\n', {},
         "jobs.toml: [jobs.ok] error_handler 'no_such_module_xyz:h': cannot import 'no_such_module_xyz': "
         "No module named 'no_such_module_xyz'"),
    ],
)  # fmt: skip
def test_each_error_names_file_job_and_field(text: str, environ: dict[str, str], expected: str) -> None:
    assert errors_of(text, environ) == [expected]


def test_toml_syntax_error_gives_tomllibs_line_and_column() -> None:
    text = REGISTRY + "[jobs.ok]\ntarget = \n"
    with pytest.raises(tomllib.TOMLDecodeError) as reference:
        tomllib.loads(text)
    assert errors_of(text) == [f"jobs.toml: not valid TOML: {reference.value}"]
    assert "line 3" in str(reference.value)


def test_unreadable_and_non_utf8_files(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    with pytest.raises(ConfigFileError) as caught:
        load_worker_file(missing)
    assert caught.value.errors == (f"{missing}: cannot read it: No such file or directory",)
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b'registry = "memory://x"\n# caf\xe9\n')
    with pytest.raises(ConfigFileError) as caught:
        load_worker_file(latin)
    assert caught.value.errors == (f"{latin}: not UTF-8 text (byte 29): TOML files are UTF-8",)


def test_all_errors_of_a_file_are_reported_at_once() -> None:
    text = f"""
max_workers = 0
[jobs.settle-orders]
target = "{FJ}:record"
sharding_total_count = 0
shardng_total_count = 3
job_parameter = "${{TOKEN}}"
[jobs.good]
target = "{FJ}:record"
[jobs.report]
target = "no_such_module_xyz:run"
failover = "yes"
cron = "every minute"
listeners = ["{FJ}:NOT_CALLABLE"]
"""
    assert errors_of(text) == [
        'jobs.toml: registry: missing (the registry URL, e.g. registry = "zk://127.0.0.1:2181/app")',
        "jobs.toml: max_workers 0: must be an integer >= 1",
        "jobs.toml: [jobs.settle-orders] sharding_total_count 0: must be an int >= 1",
        "jobs.toml: [jobs.settle-orders] shardng_total_count: unknown field; did you mean sharding_total_count?",
        "jobs.toml: [jobs.settle-orders] job_parameter: ${TOKEN}: " + UNSET.format("TOKEN"),
        "jobs.toml: [jobs.report] target 'no_such_module_xyz:run': cannot import 'no_such_module_xyz': "
        "No module named 'no_such_module_xyz'",
        "jobs.toml: [jobs.report] failover 'yes': must be a boolean (true or false), not a string",
        "jobs.toml: [jobs.report] cron 'every minute': expected 5 fields (Unix) or 6-7 (Quartz), got 2",
        f"jobs.toml: [jobs.report] listeners '{FJ}:NOT_CALLABLE': an int is not a listener (it needs "
        "before_job(run) and after_job(run), as a scheduler.JobListener has)",
    ]


def test_independent_bad_fields_of_one_job_are_all_reported() -> None:
    text = (
        REGISTRY
        + VALID_JOB
        + 'cron = "61 * * * *"\nsharding_total_count = 0\nretries = -1\njob_type = "batch"\n'
    )
    assert errors_of(text) == [
        "jobs.toml: [jobs.ok] cron '61 * * * *': minute 61 out of range 0-59",
        "jobs.toml: [jobs.ok] sharding_total_count 0: must be an int >= 1",
        "jobs.toml: [jobs.ok] retries -1: must be an int >= 0",
        "jobs.toml: [jobs.ok] job_type 'batch': not one of SIMPLE, DATAFLOW, SCRIPT, HTTP",
    ]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ('sharding_total_count = 0\nsharding_item_parameters = "0=a,1=b,2=c"\n',
         "sharding_total_count 0: must be an int >= 1"),
        ('cron = "61 * * * *"\ntime_zone = "Asia/Shanghai"\n', "cron '61 * * * *': minute 61 out of range 0-59"),
        ('job_type = "batch"\nstreaming_process = true\n', "job_type 'batch': not one of SIMPLE, DATAFLOW, SCRIPT, HTTP"),
        ("failover = true\nmonitor_execution = false\n",
         "failover True: needs monitor_execution=True (which items were running)"),
    ],
    ids=["total-and-items", "cron-and-zone", "type-and-streaming", "failover-and-monitoring"],
)  # fmt: skip
def test_an_error_is_not_followed_by_its_consequences(fields: str, expected: str) -> None:
    """Fields that depend on a refused one are not judged without it: total 0 with three
    item parameters is one error, not also "item 1 out of range" against the default 1."""
    assert errors_of(REGISTRY + VALID_JOB + fields) == [f"jobs.toml: [jobs.ok] {expected}"]


def test_an_error_quotes_a_substituted_secret_by_its_variable() -> None:
    """The value of a field that fails is quoted in the message; a substituted one in its
    ``${...}`` form, so the secret (a webhook's token, here) is not printed."""
    text = REGISTRY + (
        '[jobs.ping]\njob_type = "http"\n'
        'props = { "http.uri" = "htps://hooks.example.test/${HOOK_TOKEN}", "http.method" = "POST" }\n'
    )
    errors = errors_of(text, {"HOOK_TOKEN": "hunter2"})
    assert errors == [
        "jobs.toml: [jobs.ping] props 'http.uri' 'htps://hooks.example.test/${HOOK_TOKEN}': an HTTP job needs "
        "an http:// or https:// URL"
    ]
    assert "hunter2" not in "\n".join(errors)


def test_make_listener_names_the_option() -> None:
    assert make_listener(f"{FJ}:LISTENER", "--listener") is file_jobs.LISTENER
    with pytest.raises(ValueError, match=r"^--listener 'nope:x': cannot import 'nope'"):
        make_listener("nope:x", "--listener")


# -- shardjob check --config ---------------------------------------------------------------------------
def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "jobs.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_check_valid_file_exits_0_one_line_per_job_and_never_connects(tmp_path: Path) -> None:
    """The registry in the file is unreachable (a free port, 1 s connect timeout): a
    connection attempt would fail with 3; check does not make one."""
    path = write(
        tmp_path,
        f'registry = "{unreachable("zk")}"\n'
        f'[jobs.a]\ntarget = "{FJ}:record"\ncron = "* * * * * ?"\nsharding_total_count = 2\n'
        f'job_parameter = "${{SHARDJOB_TEST_UNSET_TOKEN:-dflt}}"\nlisteners = ["{FJ}:RecordingListener"]\n'
        '[jobs.b]\njob_type = "script"\nscript_command_line = "true"\n',
    )
    done = shardjob("check", "--config", str(path))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.splitlines() == [
        f"[jobs.a] ok: SIMPLE {FJ}:record, cron '* * * * * ?', 2 items, listeners {FJ}:RecordingListener, "
        "error_handler LOG",
        "[jobs.b] ok: SCRIPT, one-off (runs when triggered), 1 item, error_handler LOG",
    ]


def test_check_invalid_file_exits_2_with_every_error_on_stderr(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[jobs.a]\ntarget = "no_such_module_xyz:run"\nsharding_total_count = 0\n[jobs.b]\nshardng_total_count = 1\n',
    )
    done = shardjob("check", "--config", str(path))
    assert done.returncode == 2, done.stdout
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f'shardjob: {path}: registry: missing (the registry URL, e.g. registry = "zk://127.0.0.1:2181/app")',
        f"shardjob: {path}: [jobs.a] target 'no_such_module_xyz:run': cannot import 'no_such_module_xyz': "
        "No module named 'no_such_module_xyz'",
        f"shardjob: {path}: [jobs.a] sharding_total_count 0: must be an int >= 1",
        f"shardjob: {path}: [jobs.b] shardng_total_count: unknown field; did you mean sharding_total_count?",
        f'shardjob: {path}: [jobs.b] target: missing (a SIMPLE job needs target = "module:attr")',
    ]


def test_check_missing_file_and_missing_option_exit_2(tmp_path: Path) -> None:
    done = shardjob("check", "--config", str(tmp_path / "nope.toml"))
    assert (done.returncode, done.stderr) == (
        2, f"shardjob: {tmp_path / 'nope.toml'}: cannot read it: No such file or directory\n",
    )  # fmt: skip
    done = shardjob("check")
    assert done.returncode == 2 and "--config" in done.stderr


def test_worker_with_an_invalid_file_exits_2_before_connecting(tmp_path: Path) -> None:
    path = write(
        tmp_path, f'registry = "{unreachable("etcd")}"\n[jobs.a]\ntarget = "{FJ}:record"\nretries = -1\n'
    )
    done = shardjob("worker", "--config", str(path))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == f"shardjob: {path}: [jobs.a] retries -1: must be an int >= 0\n"
    assert "running" not in done.stdout


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--job", f"{FJ}:record"], "--job"),
        (["--registry", "memory://x"], "--registry"),
        (["--total", "3", "--failover"], "--total, --failover"),
        (["--listener", f"{FJ}:LISTENER"], "--listener"),
    ],
)
def test_worker_config_refuses_job_options(tmp_path: Path, extra: list[str], named: str) -> None:
    path = write(tmp_path, REGISTRY + VALID_JOB)
    done = shardjob("-v", "worker", "--config", str(path), *extra)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == (
        f"shardjob: --config: {named} cannot go with it (with --config the registry and the jobs are "
        "declared in the file)\n"
    )


def test_worker_needs_registry_or_config() -> None:
    done = shardjob("worker", "--job", f"{FJ}:record")
    assert (done.returncode, done.stderr) == (2, "shardjob: --registry is required (or --config FILE)\n")


def test_worker_listener_flag_that_does_not_import_exits_2() -> None:
    done = shardjob(
        "worker", "--registry", unreachable("zk"), "--job", f"{FJ}:record", "--listener", f"{FJ}:NOT_CALLABLE"
    )
    assert done.returncode == 2, done.stderr
    assert f"--listener '{FJ}:NOT_CALLABLE': an int is not a listener" in done.stderr


def test_help_names_config_check_and_listener() -> None:
    assert "check" in shardjob("--help").stdout
    worker_help = shardjob("worker", "--help").stdout
    assert "--config" in worker_help and "--listener" in worker_help
    check_help = shardjob("check", "--help")
    assert check_help.returncode == 0 and "--config" in check_help.stdout
