"""Real ``shardjob worker`` processes on ZooKeeper and etcd writing their run history to
one PostgreSQL (``--history``) and serving ``--http``: one is SIGKILLed with failover on;
its items' fires are run by the others and recorded as FAILOVER; every execution the
surviving workers recorded themselves has its history row once they stop, and ``shardjob
history`` reads it all back."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from scheduler.cli import main
from scheduler.cli_format import iso_utc
from scheduler.history import HistoryReader
from tests.harness import Harness
from tests.scenarios.workers import Fleet
from tests.waiting import wait_for

TOTAL = 6
SESSION_TIMEOUT = 2


def _repeated(keys: list[tuple[str, int, float]]) -> set[tuple[str, int, float]]:
    return {key for key, n in Counter(keys).items() if n > 1}


def test_fleet_history_in_postgresql_with_a_sigkilled_worker(
    server: Harness, pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = Fleet(
        server.url(server.fresh_namespace(), session_timeout=SESSION_TIMEOUT),
        tmp_path,
        job="settle",
        total=TOTAL,
        hold=0.3,
        extra_args=["--failover", "--history", pg_url, "--http", "127.0.0.1:0"],
    )
    reader = HistoryReader(pg_url)
    try:
        a, b, c = fleet.start("127.0.0.1@-@hist-a", "127.0.0.1@-@hist-b", "127.0.0.1@-@hist-c")

        def instances_in_history() -> set[str]:
            return {r.instance_id for r in reader.executions("settle", limit=200)}

        wait_for(lambda: instances_in_history() >= {a.instance_id, b.instance_id, c.instance_id}, 40,
                 message=lambda: f"all three write history: {instances_in_history()}")  # fmt: skip

        # the worker's --http endpoint answers with its own metrics
        match = re.search(r"at (http://\S+)", a.stdout_file.read_text())
        assert match, a.describe()
        with urllib.request.urlopen(match.group(1) + "/metrics", timeout=5) as resp:
            families = {f.name for f in text_string_to_metric_families(resp.read().decode())}
        assert {"shardjob_item_runs", "shardjob_fires_due", "shardjob_session_connected"} <= families

        # A FAILOVER row may predate the kill: a newcomer that planned a fire with no item
        # while the leader resharded queues that fire for its new items and runs it itself
        # (JobRunner._hand_over). So the rows that prove the kill's failover are the
        # survivors' for a fire after it, and the killed worker's rows all predate it.
        survivors = {a.instance_id, b.instance_id}

        def survivors_failover_after(moment: float) -> list[str]:
            return [r.instance_id for r in reader.executions("settle", source="FAILOVER", limit=None)
                    if r.instance_id in survivors and r.fire_time >= moment]  # fmt: skip

        killed_at = time.time()
        c.kill()
        wait_for(
            lambda: survivors_failover_after(killed_at), SESSION_TIMEOUT + 40,
            message=lambda: f"no FAILOVER row from a survivor:\n{fleet.describe()}",
        )  # fmt: skip
        failover_rows = reader.executions("settle", source="FAILOVER", limit=None)
        assert all(r.success and "FAILOVER" in r.task_id for r in failover_rows)
        assert all(
            r.fire_time <= killed_at for r in reader.executions("settle", instance=c.instance_id, limit=None)
        )
        for worker in (a, b):
            assert worker.terminate() == 0  # graceful: the writer flushes its buffer
        # every execution the survivors recorded themselves is in the history, and no more
        executions = [(r.instance, r.item, r.fire_time) for w in (a, b) for r in w.records()]
        assert not _repeated(executions), f"an item ran twice for one fire: {_repeated(executions)}"
        rows = reader.executions("settle", limit=None)
        survivors_rows = [r for r in rows if r.instance_id != c.instance_id]
        in_history = [(r.instance_id, r.sharding_item, r.fire_time) for r in survivors_rows]
        doubled = _repeated(in_history)
        assert not doubled, "history rows written twice:\n" + "\n".join(
            repr(r) for r in survivors_rows if (r.instance_id, r.sharding_item, r.fire_time) in doubled
        )
        assert set(in_history) == set(executions)
        failover_records = {
            (r.instance, r.item, r.fire_time) for w in (a, b) for r in w.records() if r.failover
        }
        assert failover_records == {
            (r.instance_id, r.sharding_item, r.fire_time)
            for r in rows
            if r.source == "FAILOVER" and r.instance_id in survivors
        }
    finally:
        fleet.close()
        reader.close()
    capsys.readouterr()
    # the runs from just before the kill on: the killed worker's last ones (those its
    # writer flushed), the failover runs of the fires it left, the survivors' own
    since = iso_utc(killed_at - 2.0)[:23]
    assert main(["history", "settle", "--since", since, "--limit", "60", "--history", pg_url]) == 0
    table = capsys.readouterr().out
    with capsys.disabled():
        print("\n" + table)  # the history as an operator reads it (-s shows it)
    assert "FAILOVER" in table
    assert main(["history", "settle", "--json", "--limit", "3", "--history", pg_url]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 3
