"""The operator commands (``shardjob jobs``, ``status``, ``servers``, ``trigger``,
``disable``/``enable``, ``shutdown``, ``remove``, ``config``, ``dump``) on memory,
ZooKeeper and etcd, against schedulers of this process: both output forms say what the
registry holds (checked against ``Cluster``), every action lands, and bad input exits 2
(a missing job 4) naming it, with nothing written.

The commands run in this process through ``cli.main`` (a memory:// registry lives in one
process); one test runs the installed ``shardjob`` script as a user does, on the real
registries.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from registry.paths import parent
from scheduler import Cluster, ItemStatus, JobStatus, Scheduler
from scheduler.cli import main
from scheduler.exit_codes import ExitCode
from tests.harness import Harness
from tests.scheduler.cluster_kit import EVERY_SECOND, JOB, PATHS, A, B, Runs, config, owners, start
from tests.waiting import wait_for

CONSOLE_SCRIPT = Path(sys.executable).parent / "shardjob"


class Cli:
    """``shardjob ARGS --registry URL`` in this process: (exit code, stdout, stderr)."""

    def __init__(self, url: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.url = url
        self.capsys = capsys

    def __call__(self, *args: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        try:
            code = main([*args, "--registry", self.url])
        except SystemExit as exc:  # argparse's own usage errors
            code = int(exc.code or 0)
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *args: str) -> Any:
        code, out, err = self(*args, "--json")
        assert code == 0, f"exit {code}: {err}"
        return json.loads(out)

    def table(self, *args: str) -> list[list[str]]:
        """The output's lines, split on runs of two or more spaces."""
        code, out, err = self(*args)
        assert code == 0, f"exit {code}: {err}"
        return [re.split(r" {2,}", line.strip()) if line.strip() else [] for line in out.splitlines()]


@pytest.fixture
def cli(harness: Harness, namespace: str, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(harness.url(namespace), capsys)


def two_instances(harness: Harness, made: list[Scheduler], namespace: str, cluster: Cluster, runs: Runs) -> None:
    job = config(sharding_item_parameters="0=north,2=south", description="nightly totals")
    start(harness, made, namespace, A, job, runs)
    start(harness, made, namespace, B, job, runs)
    wait_for(lambda: set(owners(cluster).values()) == {A, B}, 15, message=lambda: repr(cluster.job(JOB)))
    wait_for(lambda: cluster.job(JOB).status is JobStatus.OK, 15, message=lambda: repr(cluster.job(JOB)))


def rows_of(table: list[list[str]], header: str) -> list[list[str]]:
    """The rows of the table whose header row starts with ``header``, up to a blank line."""
    start = next(i for i, row in enumerate(table) if row and row[0] == header)
    rows = []
    for row in table[start + 1 :]:
        if not row:
            break
        rows.append(row)
    return rows


def test_jobs_status_and_servers_in_both_forms(
    harness: Harness, namespace: str, made: list[Scheduler], cluster: Cluster, cli: Cli
) -> None:
    two_instances(harness, made, namespace, cluster, Runs())
    detail = cluster.job(JOB)

    assert cli.json("jobs") == [
        {
            "name": JOB,
            "status": "OK",
            "cron": EVERY_SECOND,
            "sharding_total_count": 4,
            "instances": 2,
            "description": "nightly totals",
        }
    ]
    assert cli.table("jobs") == [
        ["JOB", "STATUS", "CRON", "ITEMS", "INSTANCES", "DESCRIPTION"],
        [JOB, "OK", EVERY_SECOND, "4", "2", "nightly totals"],
    ]

    status = cli.json("status", JOB)
    assert (status["name"], status["status"], status["leader"], status["epoch"]) == (JOB, "OK", A, detail.epoch)
    assert [(i["id"], i["ip"], i["enabled"]) for i in status["instances"]] == [
        (A, "10.0.0.1", True),
        (B, "10.0.0.2", True),
    ]
    assert [(i["item"], i["instance"], i["parameter"]) for i in status["items"]] == [
        (v.item, v.instance, v.parameter) for v in detail.items
    ]
    assert {i["status"] for i in status["items"]} <= {"PENDING", "RUNNING"}
    text = cli.table("status", JOB)
    head = {row[0]: row[1] for row in text[:6]}
    assert (head["job"], head["status"], head["leader"], head["cron"]) == (JOB, "OK", A, EVERY_SECOND)
    instances = rows_of(text, "INSTANCE (* leader)")
    assert [row[0] for row in instances] == [f"{A} *", B]
    items = rows_of(text, "ITEM")
    assert [(row[0], row[1]) for row in items] == [(str(v.item), v.instance) for v in detail.items]
    assert items[0][-1] == "north" and items[2][-1] == "south"

    servers = cli.json("servers")
    assert [{k: v for k, v in s.items() if k != "last_seen"} for s in servers] == [
        {"ip": "10.0.0.1", "instances": 1, "jobs": 1, "disabled_jobs": 0, "online": True},
        {"ip": "10.0.0.2", "instances": 1, "jobs": 1, "disabled_jobs": 0, "online": True},
    ]
    assert all(isinstance(s["last_seen"], float) for s in servers)  # now, for a server online
    assert cli.table("servers") == [
        ["SERVER", "ONLINE", "INSTANCES", "JOBS", "DISABLED JOBS", "LAST SEEN (UTC)"],
        ["10.0.0.1", "yes", "1", "1", "0", "now"],
        ["10.0.0.2", "yes", "1", "1", "0", "now"],
    ]


def test_disable_enable_trigger_and_shutdown_act_on_the_cluster(
    harness: Harness, namespace: str, made: list[Scheduler], cluster: Cluster, cli: Cli
) -> None:
    runs = Runs()
    two_instances(harness, made, namespace, cluster, runs)

    assert cli.json("disable", JOB, "--item", "1", "--item", "3") == {
        "job": JOB,
        "enabled": False,
        "scope": "items",
        "server": None,
        "items": [1, 3],
    }
    assert [v.item for v in cluster.job(JOB).items if v.status is ItemStatus.DISABLED] == [1, 3]
    code, out, _ = cli("enable", JOB, "--item", "1", "3")
    assert code == 0 and out.strip() == f"enabled items 1, 3 of job {JOB!r}"
    assert not [v for v in cluster.job(JOB).items if v.status is ItemStatus.DISABLED]

    code, out, _ = cli("disable", JOB, "--server", "10.0.0.2")
    assert code == 0 and out.strip() == f"disabled job {JOB!r} on server 10.0.0.2"
    wait_for(lambda: set(owners(cluster).values()) == {A}, 15, message=lambda: repr(cluster.job(JOB)))
    assert [(s["ip"], s["disabled_jobs"]) for s in cli.json("servers")] == [("10.0.0.1", 0), ("10.0.0.2", 1)]
    assert cli.json("enable", JOB, "--server", "10.0.0.2")["scope"] == "server"
    wait_for(lambda: set(owners(cluster).values()) == {A, B}, 15, message=lambda: repr(cluster.job(JOB)))

    assert cli.json("disable", JOB)["scope"] == "job"
    wait_for(lambda: cluster.job(JOB).status is JobStatus.DISABLED, 15, message=lambda: repr(cluster.job(JOB)))
    assert cli.json("jobs")[0]["status"] == "DISABLED" and cluster.config(JOB).disabled
    code, out, _ = cli("enable", JOB)
    assert code == 0 and out.startswith(f"enabled job {JOB!r} on every server")
    wait_for(lambda: cluster.job(JOB).status is JobStatus.OK, 15, message=lambda: repr(cluster.job(JOB)))

    assert cli.json("trigger", JOB) == {"job": JOB, "instances": [A, B]}

    assert cli.json("shutdown", JOB, "--instance", B, "--wait", "15") == {"job": JOB, "instances": [B], "left": True}
    assert [i.id for i in cluster.job(JOB).instances] == [A]
    wait_for(lambda: set(owners(cluster).values()) == {A}, 15, message=lambda: repr(cluster.job(JOB)))


def test_config_get_and_set(
    harness: Harness, namespace: str, made: list[Scheduler], cluster: Cluster, cli: Cli
) -> None:
    two_instances(harness, made, namespace, cluster, Runs())
    stored = cli.json("config", "get", JOB)
    assert stored["name"] == JOB and stored["sharding_total_count"] == 4 and stored["cron"] == EVERY_SECOND
    assert {row[0]: row[1] for row in cli.table("config", "get", JOB)[1:]}["sharding_item_parameters"] == (
        "0=north,2=south"
    )

    updated = cli.json("config", "set", JOB, "sharding_total_count=6", "failover=true", "description=hourly")
    assert (updated["sharding_total_count"], updated["failover"], updated["description"]) == (6, True, "hourly")
    assert cluster.config(JOB).sharding_total_count == 6
    wait_for(lambda: len(owners(cluster)) == 6 and set(owners(cluster).values()) == {A, B}, 15)
    code, out, _ = cli("config", "set", JOB, "cron=0/5 * * * * ?")
    assert code == 0 and out.splitlines()[1:] == ["FIELD  VALUE", "cron   0/5 * * * * ?"]
    assert cli.json("config", "set", JOB, "cron=")["cron"] is None  # a one-off job now


@pytest.mark.parametrize(
    ("change", "names"),
    [
        ("sharding_total_count=0", "sharding_total_count"),
        ("sharding_total_count=many", "sharding_total_count"),
        ("failover=perhaps", "failover"),
        ("cron=61 * * * *", "cron"),
        ("colour=blue", "colour"),
        ("name=other", "name"),
        ("props=[1]", "props"),
        ("no-equals-sign", "no-equals-sign"),
    ],
)
def test_bad_config_changes_exit_2_naming_the_field_and_change_nothing(
    harness: Harness, namespace: str, made: list[Scheduler], cluster: Cluster, cli: Cli, change: str, names: str
) -> None:
    start(harness, made, namespace, A, config(), Runs())
    before = cluster.registry.get_node(PATHS.config)
    code, out, err = cli("config", "set", JOB, "description=kept?", change)
    assert code == ExitCode.USAGE, f"exit {code}: {out} {err}"
    assert names in err and "Traceback" not in err
    assert cluster.registry.get_node(PATHS.config) == before


def test_remove_is_refused_while_live_then_forced(
    harness: Harness, namespace: str, made: list[Scheduler], cluster: Cluster, cli: Cli
) -> None:
    sched = start(harness, made, namespace, A, config(), Runs())
    wait_for(lambda: set(owners(cluster).values()) == {A}, 15)
    code, _, err = cli("remove", JOB)
    assert code == ExitCode.ERROR and "live instance" in err and A in err
    assert [b["name"] for b in cli.json("jobs")] == [JOB]
    code, out, _ = cli("remove", JOB, "--force", "--wait", "20")
    assert code == 0 and out.strip() == f"removed job {JOB!r}"
    # nothing of the job is left; the namespace's own record (its layout) stays
    assert cli.json("jobs") == [] and cluster.registry.children("/") == [".shardjob"]
    assert list(sched.shut_down_jobs) == [JOB]


def test_dump_shows_every_node_decoded(
    harness: Harness, namespace: str, made: list[Scheduler], cluster: Cluster, cli: Cli
) -> None:
    start(harness, made, namespace, A, config(), Runs())
    wait_for(lambda: set(owners(cluster).values()) == {A}, 15)
    dump = cli.json("dump", JOB)
    assert dump["job"] == JOB and dump["problems"] == []
    assert dump["nodes"][PATHS.config]["value"]["name"] == JOB
    assert A in json.dumps(dump["nodes"][PATHS.assignment]["value"])
    instance_nodes = [p for p in dump["nodes"] if parent(p) == PATHS.instances]
    assert instance_nodes == [f"{PATHS.instances}/{A}"] and dump["nodes"][instance_nodes[0]]["ephemeral"]
    cluster.registry.put(f"{PATHS.root}/stray", b"\xff\xfe")  # not in the layout, not text
    dump = cli.json("dump", JOB)
    assert dump["nodes"][f"{PATHS.root}/stray"]["value"] == {"base64": "//4="}
    text = cli.table("dump", JOB)
    assert text[0] == ["PATH", "VERSION", "KIND", "VALUE"]
    rows = {row[0]: row for row in text[1:]}
    assert rows[PATHS.config][2] == "persistent" and json.loads(rows[PATHS.config][3])["name"] == JOB
    assert rows[f"{PATHS.root}/stray"][3] == "(raw) b'\\xff\\xfe'"


@pytest.mark.parametrize(
    "args",
    [["status", "nojob"], ["trigger", "nojob"], ["disable", "nojob"], ["config", "get", "nojob"], ["dump", "nojob"]],
)
def test_a_job_that_does_not_exist_exits_4(cli: Cli, cluster: Cluster, args: list[str]) -> None:
    code, _, err = cli(*args)
    assert code == ExitCode.NO_SUCH_JOB, err
    assert "nojob" in err
    assert cluster.registry.children("/") == [], "a node was created for a job that does not exist"


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["status", "a/b"], "a/b"),
        (["disable", JOB, "--item", "9"], "9"),
        (["disable", JOB, "--server", "10.9.9.9"], "10.9.9.9"),
        (["disable", JOB, "--server", "10.0.0.1", "--item", "1"], "--item"),
    ],
)
def test_bad_names_and_values_exit_2_naming_them(
    harness: Harness, namespace: str, made: list[Scheduler], cluster: Cluster, cli: Cli, args: list[str], names: str
) -> None:
    start(harness, made, namespace, A, config(), Runs())
    wait_for(lambda: set(owners(cluster).values()) == {A}, 15)
    before = cluster.registry.read_tree(PATHS.root)
    code, _, err = cli(*args)
    assert code == ExitCode.USAGE and names in err, err
    after = cluster.registry.read_tree(PATHS.root)
    # the running marks (and their parent, created by the first run) change with every fire
    assert {p: n.version for p, n in after.items() if not p.startswith(PATHS.running)} == {
        p: n.version for p, n in before.items() if not p.startswith(PATHS.running)
    }, "bad input changed the registry"


def test_the_registry_comes_from_the_environment_and_its_absence_is_named(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SHARDJOB_REGISTRY", raising=False)
    assert main(["jobs"]) == ExitCode.USAGE
    assert "SHARDJOB_REGISTRY" in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["zookeeper", "etcd"])
def test_the_installed_script_reads_a_live_cluster(
    backend: str, request: pytest.FixtureRequest, made: list[Scheduler]
) -> None:
    from tests.conftest import close_harness, make_harness

    harness = make_harness(backend, request)
    try:
        namespace = harness.fresh_namespace()
        start(harness, made, namespace, A, config(), Runs())
        with Cluster(harness.url(namespace)) as cluster:
            wait_for(lambda: set(owners(cluster).values()) == {A}, 15)
        env = {**os.environ, "SHARDJOB_REGISTRY": harness.url(namespace)}
        done = subprocess.run(
            [str(CONSOLE_SCRIPT), "status", JOB, "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode == 0, done.stderr
        status = json.loads(done.stdout)
        assert status["leader"] == A and [i["instance"] for i in status["items"]] == [A] * 4
        missing = subprocess.run(
            [str(CONSOLE_SCRIPT), "status", "nojob"], env=env, capture_output=True, text=True, timeout=60
        )
        assert missing.returncode == ExitCode.NO_SUCH_JOB and "nojob" in missing.stderr
    finally:
        for sched in made:
            sched.shutdown(wait=True)
        made.clear()
        close_harness(harness)
