"""The namespace's layout version on every backend: recorded by the first leader of this
release, refused before any write when it is newer than this release knows, upgraded in
one fenced transaction exactly once however many leaders race.
"""

from __future__ import annotations

import functools
import json
import threading

import pytest

from registry.backends.base import BaseRegistry
from registry.protocol import Check, Node
from registry.recipes.cache import TreeCache
from scheduler import Scheduler, ShardingContext
from scheduler.cli import main as cli_main
from scheduler.exit_codes import ExitCode
from sharding.layout import validate_job_name
from sharding.layout_version import (
    LAYOUT,
    LAYOUT_NODE,
    LayoutUpgrader,
    LayoutVersionError,
    check_runnable,
    read_layout,
)
from tests.harness import Harness
from tests.waiting import wait_for

NEVER = "0 0 0 1 1 ? 2099"


def stored_layout(reg: BaseRegistry) -> int | None:
    node = reg.get_node(LAYOUT_NODE)
    return None if node is None else int(json.loads(node.value)["layout"])


def started(harness: Harness, namespace: str, made: list[Scheduler], instance: str = "i1") -> Scheduler:
    sched = Scheduler(harness.url(namespace), instance_id=instance)
    made.append(sched)

    @sched.job(name="job", cron=NEVER, sharding_total_count=2)
    def job(ctx: ShardingContext) -> None:
        pass

    sched.start()
    return sched


def test_a_fresh_namespace_gets_this_releases_layout(
    harness: Harness, namespace: str, made: list[Scheduler]
) -> None:
    reg = harness.connect(namespace)
    assert stored_layout(reg) is None
    started(harness, namespace, made)
    wait_for(lambda: stored_layout(reg) == LAYOUT, 10, message=lambda: f"layout is {stored_layout(reg)}")
    value = json.loads(reg.get(LAYOUT_NODE) or b"{}")
    assert value["release"], value


def test_a_newer_layout_is_refused_before_anything_is_written(
    harness: Harness, namespace: str, made: list[Scheduler]
) -> None:
    reg = harness.connect(namespace)
    reg.create(LAYOUT_NODE, json.dumps({"layout": LAYOUT + 1, "release": "9.1.0"}).encode())
    before = reg.read_tree("/")
    with pytest.raises(LayoutVersionError) as raised:
        started(harness, namespace, made)
    message = str(raised.value)
    assert f"layout {LAYOUT + 1}" in message and "9.1.0" in message, message
    assert f"layouts 1-{LAYOUT}" in message and "docs/upgrading.md" in message, message
    assert "nothing was written" in message
    assert reg.read_tree("/") == before


def test_the_worker_command_refuses_a_newer_layout_with_a_clear_error(
    harness: Harness, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    reg = harness.connect(namespace)
    reg.create(LAYOUT_NODE, json.dumps({"layout": LAYOUT + 1}).encode())
    before = reg.read_tree("/")
    argv = ["worker", "--registry", harness.url(namespace), "--job", "tests.scenarios.recording_job:record",
            "--name", "job", "--cron", NEVER]
    assert cli_main(argv) == ExitCode.ERROR
    err = capsys.readouterr().err
    assert f"layout {LAYOUT + 1}" in err and "Traceback" not in err, err
    assert reg.read_tree("/") == before


@pytest.mark.parametrize(
    "value", [b"2", b"{}", b'{"layout": "2"}', b'{"layout": 0}', b"\xff"], ids=["bare", "empty", "text", "zero", "binary"]
)
def test_an_unreadable_layout_node_is_named(value: bytes) -> None:
    with pytest.raises(LayoutVersionError, match=LAYOUT_NODE):
        read_layout(Node(value, 3))


def test_no_job_may_be_called_like_shardjobs_own_node() -> None:
    with pytest.raises(ValueError, match="reserved"):
        validate_job_name(".shardjob")


def test_a_deposed_leader_upgrades_nothing(reg: BaseRegistry) -> None:
    reg.create("/job/leader/election/term", b"1")
    term = reg.get_node("/job/leader/election/term")
    assert term is not None
    reg.put("/job/leader/election/term", b"2")  # someone else was elected since
    cache = TreeCache(reg, "/").start()
    try:
        upgrader = LayoutUpgrader(reg, cache)
        assert upgrader.upgrade([Check("/job/leader/election/term", term.version)]) is False
        assert reg.get_node(LAYOUT_NODE) is None
        assert not upgrader.done
    finally:
        cache.close()


def test_racing_leaders_upgrade_once(harness: Harness, namespace: str) -> None:
    """Four processes' upgraders, each fenced by its own job's term, race: the node is
    written once, every one ends knowing the namespace is current, and a second round
    writes nothing."""
    regs = [harness.connect(namespace) for _ in range(4)]
    fences = []
    for n, reg in enumerate(regs):
        reg.create(f"/job{n}/leader/election/term", b"1")
        node = reg.get_node(f"/job{n}/leader/election/term")
        assert node is not None
        fences.append([Check(f"/job{n}/leader/election/term", node.version)])
    caches = [TreeCache(reg, "/") for reg in regs]
    for cache in caches:
        cache.start()
    try:
        upgraders = [LayoutUpgrader(reg, cache) for reg, cache in zip(regs, caches, strict=True)]
        go = threading.Barrier(len(upgraders))

        def race(n: int) -> None:
            go.wait()
            upgraders[n].upgrade(fences[n])

        threads = [threading.Thread(target=race, args=(n,)) for n in range(len(upgraders))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        written = regs[0].get_node(LAYOUT_NODE)
        assert written is not None and read_layout(written).layout == LAYOUT
        for upgrader, fence in zip(upgraders, fences, strict=True):
            wait_for(functools.partial(upgrader.upgrade, fence), 10, message="an upgrader never done")
        assert regs[0].get_node(LAYOUT_NODE) == written  # not written again
        assert check_runnable(regs[0]).layout == LAYOUT
    finally:
        for cache in caches:
            cache.close()

