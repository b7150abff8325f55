"""Job configuration: ElasticJob's defaults, per-field validation (every message names the
field and the value), item parameters, and the registry's JSON form, with property tests
for the round trips.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.config import (
    ERROR_HANDLERS,
    JobConfig,
    JobType,
    format_item_parameters,
    parse_item_parameters,
)
from scheduler.cron import CronSchedule
from sharding.assignment import CorruptNodeError
from sharding.strategy_loader import BUILTIN_STRATEGIES

PATH = "/sync-orders/config"


def test_defaults_are_elasticjobs() -> None:
    config = JobConfig(name="job")
    assert config.cron is None and config.is_one_off and config.schedule() is None
    assert config.time_zone is None
    assert config.sharding_total_count == 1
    assert config.sharding_item_parameters == ""
    assert config.job_parameter == ""
    assert config.monitor_execution is True
    assert config.failover is False
    assert config.misfire is True
    assert config.max_time_diff_seconds == -1
    assert config.reconcile_interval_minutes == 10
    assert config.sharding_strategy == "AVG_ALLOCATION"
    assert config.description == ""
    assert dict(config.props) == {}
    assert config.disabled is False
    assert config.overwrite is False
    assert config.static_sharding is False
    assert config.job_type is JobType.SIMPLE
    assert config.streaming_process is False
    assert config.script_command_line == ""
    assert config.error_handler == "LOG"
    assert config.item_parameters() == {}


def test_a_full_config() -> None:
    config = JobConfig(
        name="sync-orders",
        cron="0/10 * * * * ?",
        time_zone="Asia/Shanghai",
        sharding_total_count=3,
        sharding_item_parameters="0=Beijing,1=Shanghai,2=Guangzhou",
        failover=True,
    )
    assert not config.is_one_off
    schedule = config.schedule()
    assert schedule == CronSchedule.parse("0/10 * * * * ?", "Asia/Shanghai")
    assert config.item_parameters() == {0: "Beijing", 1: "Shanghai", 2: "Guangzhou"}


# -- per-field validation ---------------------------------------------------------------------
GOOD: list[dict[str, Any]] = [
    {"name": "a"},
    {"name": "Job_1.v2-x:y"},
    {"name": "同步订单"},
    {"name": "café"},
    {"cron": "* * * * *"},
    {"cron": "0 0 12 ? * MON-FRI 2030"},
    {"cron": ""},
    {"cron": "   "},
    {"cron": None},
    {"time_zone": "Asia/Shanghai"},
    {"time_zone": "GMT+08:00"},
    {"time_zone": "UTC", "cron": "0 0 * * *"},
    {"sharding_total_count": 10_000},
    {"sharding_item_parameters": "0=a", "sharding_total_count": 1},
    {"sharding_item_parameters": " 0 = a , 2=c ", "sharding_total_count": 3},
    {"job_parameter": "anything, even = and ,"},
    {"max_time_diff_seconds": 0},
    {"max_time_diff_seconds": 60},
    {"reconcile_interval_minutes": 0},
    {"reconcile_interval_minutes": -3},
    {"sharding_strategy": "ODEVITY"},
    {"sharding_strategy": "round_robin"},
    {"sharding_strategy": "sharding.strategies:avg_allocation"},
    {"description": "日本語"},
    {"props": {"a": "1", "b": ""}},
    {"failover": True},
    {"job_type": JobType.DATAFLOW, "streaming_process": True},
    {"job_type": "dataflow"},
    {"job_type": "SCRIPT", "script_command_line": "echo hi"},
    {"error_handler": "THROW"},
    {"error_handler": "ignore"},
    {"disabled": True, "overwrite": True, "static_sharding": True, "misfire": False},
]


@pytest.mark.parametrize("fields", GOOD, ids=lambda f: ",".join(f"{k}={v!r}" for k, v in f.items()))
def test_good_values(fields: dict[str, Any]) -> None:
    fields = {"name": "job", **fields}
    config = JobConfig(**fields)
    assert JobConfig.from_json(PATH, config.to_json()) == config


BAD: list[tuple[dict[str, Any], str]] = [
    ({"name": ""}, "name ''"),
    ({"name": "a/b"}, "name 'a/b': '/' not allowed"),
    ({"name": "a b"}, "name 'a b': ' ' not allowed"),
    ({"name": "."}, "name '.'"),
    ({"name": ".."}, "name '..'"),
    ({"name": "tab\t"}, "name 'tab\\t'"),
    ({"name": "nbsp\u00a0"}, "name 'nbsp\\xa0'"),
    ({"name": "zw\u200b"}, "name 'zw\\u200b'"),
    ({"name": 5}, "name 5"),
    ({"name": None}, "name None"),
    ({"cron": "0 0 25 * * ?"}, "cron '0 0 25 * * ?': hour 25 out of range 0-23"),
    ({"cron": "x"}, "cron 'x': expected 5 fields (Unix) or 6-7 (Quartz), got 1"),
    ({"cron": 5}, "cron 5"),
    ({"time_zone": "Mars/Olympus"}, "time_zone 'Mars/Olympus'"),
    ({"time_zone": "Mars/Olympus", "cron": "* * * * *"}, "time_zone 'Mars/Olympus'"),
    ({"time_zone": 8}, "time_zone 8"),
    ({"sharding_total_count": 0}, "sharding_total_count 0: must be an int >= 1"),
    ({"sharding_total_count": -1}, "sharding_total_count -1"),
    ({"sharding_total_count": True}, "sharding_total_count True"),
    ({"sharding_total_count": 2.0}, "sharding_total_count 2.0"),
    ({"sharding_total_count": "3"}, "sharding_total_count '3'"),
    (
        {"sharding_item_parameters": "1-b", "sharding_total_count": 2},
        "sharding_item_parameters: '1-b' is not 'item=parameter'",
    ),
    (
        {"sharding_item_parameters": "0=a,,1=b", "sharding_total_count": 2},
        "sharding_item_parameters: '' is not 'item=parameter'",
    ),
    ({"sharding_item_parameters": "0=a=b"}, "sharding_item_parameters: '0=a=b' is not 'item=parameter'"),
    ({"sharding_item_parameters": "0="}, "sharding_item_parameters: '0=' is not 'item=parameter'"),
    ({"sharding_item_parameters": "=a"}, "sharding_item_parameters: '=a' is not 'item=parameter'"),
    ({"sharding_item_parameters": "x=a"}, "sharding_item_parameters: item 'x' in 'x=a' is not a number"),
    ({"sharding_item_parameters": "-1=a"}, "sharding_item_parameters: item '-1' in '-1=a' is not a number"),
    ({"sharding_item_parameters": "1=a"}, "sharding_item_parameters: item 1 out of range 0-0"),
    (
        {"sharding_item_parameters": "0=a,0=b", "sharding_total_count": 2},
        "sharding_item_parameters: item 0 given twice",
    ),
    ({"sharding_item_parameters": 5}, "sharding_item_parameters 5: must be a str"),
    ({"job_parameter": None}, "job_parameter None: must be a str"),
    ({"description": 1}, "description 1: must be a str"),
    ({"monitor_execution": 1}, "monitor_execution 1: must be a bool"),
    ({"failover": "yes"}, "failover 'yes': must be a bool"),
    ({"misfire": None}, "misfire None: must be a bool"),
    ({"disabled": 0}, "disabled 0: must be a bool"),
    ({"overwrite": "false"}, "overwrite 'false': must be a bool"),
    ({"static_sharding": 1}, "static_sharding 1: must be a bool"),
    ({"streaming_process": "x"}, "streaming_process 'x': must be a bool"),
    ({"max_time_diff_seconds": -2}, "max_time_diff_seconds -2"),
    ({"max_time_diff_seconds": 1.5}, "max_time_diff_seconds 1.5"),
    ({"max_time_diff_seconds": False}, "max_time_diff_seconds False"),
    ({"reconcile_interval_minutes": "10"}, "reconcile_interval_minutes '10'"),
    ({"reconcile_interval_minutes": True}, "reconcile_interval_minutes True"),
    ({"sharding_strategy": "NOPE"}, "sharding_strategy 'NOPE': unknown sharding strategy 'NOPE'; known: "),
    ({"sharding_strategy": ""}, "sharding_strategy ''"),
    ({"sharding_strategy": "no.such.module:x"}, "sharding_strategy 'no.such.module:x'"),
    ({"sharding_strategy": None}, "sharding_strategy None: must be a str"),
    ({"props": {"a": 1}}, "props {'a': 1}: keys and values must be str"),
    ({"props": {1: "a"}}, "props {1: 'a'}: keys and values must be str"),
    ({"props": [("a", "b")]}, "props [('a', 'b')]: must be a mapping"),
    ({"job_type": "FTP"}, "job_type 'FTP': not one of SIMPLE, DATAFLOW, SCRIPT, HTTP"),
    ({"job_type": "HTTP"}, "props 'http.uri' '': an HTTP job needs an http:// or https:// URL"),
    (
        {"job_type": "HTTP", "props": {"http.uri": "http://h/x", "http.method": "FETCH"}},
        "props 'http.method' 'FETCH': must be one of GET, POST",
    ),
    (
        {"job_type": "HTTP", "props": {"http.uri": "http://h/x", "http.method": "GET", "http.data": "x"}},
        "props 'http.data': a GET request carries no body",
    ),
    (
        {"job_type": "HTTP", "props": {"http.uri": "http://h", "http.method": "GET", "http.read.timeout.milliseconds": "1s"}},
        "props 'http.read.timeout.milliseconds' '1s': must be a whole number of milliseconds > 0",
    ),
    ({"timeout_seconds": 0}, "timeout_seconds 0: must be a number of seconds > 0, or None"),
    ({"timeout_seconds": "5"}, "timeout_seconds '5'"),
    ({"retries": -1}, "retries -1: must be an int >= 0"),
    ({"retries": 1.0}, "retries 1.0"),
    ({"retry_backoff_seconds": -0.5}, "retry_backoff_seconds -0.5: must be a number of seconds >= 0"),
    ({"jitter_seconds": float("nan")}, "jitter_seconds nan"),
    ({"job_type": 3}, "job_type 3"),
    ({"job_type": JobType.SCRIPT}, "script_command_line '': a SCRIPT job needs a command"),
    ({"job_type": JobType.SCRIPT, "script_command_line": "  "}, "script_command_line '  '"),
    ({"script_command_line": "echo"}, "script_command_line 'echo': only for SCRIPT jobs, this is SIMPLE"),
    ({"streaming_process": True}, "streaming_process True: only for DATAFLOW jobs, this is SIMPLE"),
    ({"failover": True, "monitor_execution": False}, "failover True: needs monitor_execution=True"),
    ({"error_handler": "EMAIL"}, "error_handler 'EMAIL': not one of LOG, THROW, IGNORE"),
    ({"error_handler": None}, "error_handler None"),
]


@pytest.mark.parametrize(("fields", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_values_name_the_field_and_value(fields: dict[str, Any], message: str) -> None:
    fields = {"name": "job", **fields}
    with pytest.raises(ValueError) as caught:
        JobConfig(**fields)
    assert type(caught.value) is ValueError
    assert str(caught.value).startswith(message), str(caught.value)


def test_unknown_field_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        JobConfig(name="job", shardingTotalCount=3)  # type: ignore[call-arg]


# -- normalisation and immutability -----------------------------------------------------------
def test_blank_cron_is_a_one_off_job() -> None:
    for blank in ("", "  ", None):
        config = JobConfig(name="job", cron=blank)
        assert config.cron is None and config.is_one_off and config.schedule() is None


def test_kind_and_handler_names_are_normalised() -> None:
    config = JobConfig(name="job", job_type="dataflow", error_handler="throw")  # type: ignore[arg-type]
    assert config.job_type is JobType.DATAFLOW
    assert config.error_handler == "THROW"
    assert set(ERROR_HANDLERS) == {"LOG", "THROW", "IGNORE"}


def test_props_are_frozen_and_private() -> None:
    source = {"a": "1"}
    config = JobConfig(name="job", props=source)
    source["a"] = "changed"
    assert config.props["a"] == "1"
    with pytest.raises(TypeError):
        config.props["b"] = "2"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.name = "other"  # type: ignore[misc]
    assert config == JobConfig(name="job", props={"a": "1"})
    assert hash(config) == hash(JobConfig(name="job", props={"a": "1"}))
    assert config != JobConfig(name="job", props={"a": "2"})


def test_with_changes_validates() -> None:
    config = JobConfig(name="job", cron="0 * * * *", sharding_total_count=3)
    changed = config.with_changes(sharding_total_count=5, time_zone="Europe/Berlin")
    assert changed.sharding_total_count == 5 and changed.time_zone == "Europe/Berlin"
    assert config.sharding_total_count == 3
    with pytest.raises(ValueError, match=r"^sharding_total_count 0"):
        config.with_changes(sharding_total_count=0)
    with pytest.raises(ValueError, match=r"^cron 'bad'"):
        config.with_changes(cron="bad")
    # item parameters are checked against the new total
    with_params = config.with_changes(sharding_item_parameters="2=c")
    with pytest.raises(ValueError, match=r"item 2 out of range 0-1"):
        with_params.with_changes(sharding_total_count=2)
    # fields that must change together can
    script = config.with_changes(job_type=JobType.SCRIPT, script_command_line="run.sh")
    assert script.job_type is JobType.SCRIPT


# -- item parameters ----------------------------------------------------------------------------
def test_item_parameters() -> None:
    assert parse_item_parameters("0=Beijing,1=Shanghai,2=Guangzhou", 3) == {
        0: "Beijing",
        1: "Shanghai",
        2: "Guangzhou",
    }
    assert parse_item_parameters(" 0 = Beijing ,\t1=Shang hai ", 3) == {0: "Beijing", 1: "Shang hai"}
    assert parse_item_parameters("2=c", 3) == {2: "c"}
    assert parse_item_parameters("", 3) == {}
    assert parse_item_parameters("   ", 3) == {}
    assert parse_item_parameters("0=a,", 1) == {0: "a"}  # Java's split drops trailing empties
    assert parse_item_parameters("007=a", 8) == {7: "a"}
    assert JobConfig(
        name="j", sharding_total_count=4, sharding_item_parameters="1=x,3=y"
    ).item_parameters() == {1: "x", 3: "y"}


PARAMETER = (
    st.text(alphabet=st.characters(codec="utf-8", exclude_characters=",="), min_size=1, max_size=12)
    .map(str.strip)
    .filter(bool)
)


@settings(max_examples=200, deadline=None)
@given(total=st.integers(1, 40), data=st.data())
def test_item_parameters_round_trip(total: int, data: st.DataObject) -> None:
    parameters = data.draw(st.dictionaries(st.integers(0, total - 1), PARAMETER, max_size=total))
    text = format_item_parameters(parameters)
    assert parse_item_parameters(text, total) == parameters
    spaced = " , ".join(f" {k} = {v} " for k, v in parameters.items())
    assert parse_item_parameters(spaced, total) == parameters


# -- registry form ------------------------------------------------------------------------------
def test_to_json_is_stable_sorted_utf8() -> None:
    config = JobConfig(name="同步", description="é", props={"b": "2", "a": "1"})
    raw = config.to_json()
    assert isinstance(raw, bytes)
    document = json.loads(raw.decode("utf-8"))
    assert list(document) == sorted(document)
    assert "同步".encode() in raw  # not \\u-escaped
    assert document["job_type"] == "SIMPLE"
    assert document["props"] == {"a": "1", "b": "2"}
    same = JobConfig(name="同步", description="é", props={"a": "1", "b": "2"})
    assert same.to_json() == raw


def test_from_json_ignores_unknown_keys_and_defaults_missing_ones() -> None:
    document = {"name": "job", "sharding_total_count": 2, "from_a_newer_version": {"x": 1}, "jobName": "x"}
    config = JobConfig.from_json(PATH, json.dumps(document).encode())
    assert config == JobConfig(name="job", sharding_total_count=2)


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (b"\xff\xfe", "not UTF-8"),
        (b"", "not JSON"),
        (b"{", "not JSON"),
        (b"name: job", "not JSON"),
        (b"[]", "a JSON list, not an object"),
        (b"null", "a JSON NoneType, not an object"),
        (b"{}", "has no 'name'"),
        (b'{"name": "job", "sharding_total_count": 0}', "sharding_total_count 0"),
        (b'{"name": "job", "cron": "61 * * * *"}', "cron '61 * * * *': minute 61"),
        (b'{"name": "job", "time_zone": "Nowhere/Land"}', "time_zone 'Nowhere/Land'"),
        (b'{"name": "job", "job_type": "FTP"}', "job_type 'FTP'"),
        (b'{"name": "job", "job_type": "HTTP"}', "props 'http.uri'"),
        (b'{"name": "job", "props": [1]}', "props [1]"),
        (b'{"name": "job", "props": {"a": 1}}', "props {'a': 1}"),
        (b'{"name": "job", "failover": "true"}', "failover 'true'"),
        (b'{"name": "a/b"}', "name 'a/b'"),
        (b'{"name": "job", "sharding_item_parameters": "0:a"}', "sharding_item_parameters: '0:a'"),
    ],
)
def test_corrupt_nodes(raw: bytes, problem: str) -> None:
    with pytest.raises(CorruptNodeError) as caught:
        JobConfig.from_json(PATH, raw)
    assert caught.value.path == PATH
    assert problem in caught.value.problem
    assert PATH in str(caught.value)
    assert isinstance(caught.value, ValueError)


NAME = st.text(
    alphabet=st.one_of(
        st.sampled_from("abcXYZ019_.-:"),
        st.characters(
            min_codepoint=0x80, exclude_categories=("Cs", "Zs", "Zl", "Zp", "Cc", "Cf", "Co", "Cn")
        ),
    ),
    min_size=1,
    max_size=20,
).filter(lambda n: n not in (".", ".."))
CRONS = st.sampled_from(
    [
        None,
        "* * * * *",
        "0/10 * * * * ?",
        "0 0 12 ? * MON-FRI",
        "0 30 2 * * ? 2030",
        "0 0 12 L * ?",
        "0 0 12 ? * 6#3",
        "@daily",
    ]
)
ZONES = st.sampled_from([None, "UTC", "Asia/Shanghai", "GMT+08:00", "Europe/Berlin", "America/New_York"])


@st.composite
def configs(draw: st.DrawFn) -> JobConfig:
    total = draw(st.integers(1, 30))
    parameters = draw(st.dictionaries(st.integers(0, total - 1), PARAMETER, max_size=total))
    kind = draw(st.sampled_from(list(JobType)))
    monitor = draw(st.booleans())
    return JobConfig(
        name=draw(NAME),
        cron=draw(CRONS),
        time_zone=draw(ZONES),
        sharding_total_count=total,
        sharding_item_parameters=format_item_parameters(parameters),
        job_parameter=draw(st.text(max_size=20)),
        monitor_execution=monitor,
        failover=monitor and draw(st.booleans()),
        misfire=draw(st.booleans()),
        max_time_diff_seconds=draw(st.integers(-1, 10**6)),
        reconcile_interval_minutes=draw(st.integers(-5, 10**4)),
        sharding_strategy=draw(st.sampled_from(sorted(BUILTIN_STRATEGIES))),
        description=draw(st.text(max_size=30)),
        props=draw(st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=4))
        if kind is not JobType.HTTP
        else {"http.uri": "http://127.0.0.1:8080/run", "http.method": draw(st.sampled_from(["GET", "POST"]))},
        disabled=draw(st.booleans()),
        overwrite=draw(st.booleans()),
        static_sharding=draw(st.booleans()),
        job_type=kind,
        streaming_process=kind is JobType.DATAFLOW and draw(st.booleans()),
        script_command_line=draw(st.sampled_from(["run.sh", "python -m job --x 'a b'"]))
        if kind is JobType.SCRIPT
        else "",
        error_handler=draw(st.sampled_from(ERROR_HANDLERS)),
        timeout_seconds=draw(st.one_of(st.none(), st.floats(0.001, 10**5))),
        retries=draw(st.integers(0, 10)),
        retry_backoff_seconds=draw(st.floats(0, 600)),
        jitter_seconds=draw(st.floats(0, 60)),
    )


@settings(max_examples=200, deadline=None)
@given(config=configs())
def test_json_round_trip(config: JobConfig) -> None:
    raw = config.to_json()
    back = JobConfig.from_json(PATH, raw)
    assert back == config
    assert back.to_json() == raw
    assert back.item_parameters() == config.item_parameters()
    assert dataclasses.replace(config) == config
