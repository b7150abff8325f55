"""Enums that stand for text print as that text: URLs, log lines and errors built from
them read ``etcd``, not ``Backend.ETCD`` (Python 3.11 prints a str-mixin member's name)."""

from __future__ import annotations

import json

import pytest

from registry.backends.op_failures import OpFailure
from registry.text_enum import TextEnum
from registry.url import Backend, parse_url
from scheduler.config import ErrorHandlerName, JobConfig
from sharding.errors import FenceReason


@pytest.mark.parametrize("member", [Backend.ETCD, OpFailure.NO_NODE, FenceReason.RUNNING, ErrorHandlerName.THROW])
def test_a_member_prints_compares_and_serialises_as_its_text(member: TextEnum) -> None:
    assert str(member) == f"{member}" == member.value
    assert member == member.value
    assert json.loads(json.dumps(member)) == member.value


def test_a_url_and_a_config_built_from_members_read_as_text() -> None:
    assert parse_url("zk://127.0.0.1:2181/app").masked().startswith("zk://127.0.0.1:2181/app")
    assert parse_url("etcd://127.0.0.1:2379/app").masked().startswith("etcd://")
    config = JobConfig(name="j", error_handler="throw")
    assert config.error_handler is ErrorHandlerName.THROW
    assert json.loads(config.to_json())["error_handler"] == "THROW"
