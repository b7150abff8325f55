"""etcd's space quota: when its database is full (the NOSPACE alarm) every write is refused
with an error that names the cause and the cure, nothing stored is lost, and a scheduler's
runs stop while it lasts and resume once an operator has made room.

A real etcd with a small ``--quota-backend-bytes`` fills in a few large puts; shardjob's
own writes are what would fill a production etcd that keeps its whole history (each
job-fire adds its mark and the mark's removal; see docs/registry.md).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

import registry
from registry.errors import RegistryError
from scheduler import JobConfig, Scheduler, ShardingContext
from tests.conftest import need_local
from tests.servers.etcd import EtcdServer, etcd_available
from tests.waiting import holds_for, wait_for

#: the quota of the test's server: 8 MiB, full after a handful of 1 MB puts
QUOTA = 8 * 1024 * 1024
FILLER = b"x" * 1_000_000


@pytest.fixture
def small_etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    need_local(etcd_available())
    server = EtcdServer(tmp_path / "etcd-small", extra_args=["--quota-backend-bytes", str(QUOTA)])
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _fill(reg: registry.RegistryCenter) -> tuple[int, RegistryError]:
    """Put 1 MB values until etcd refuses one; the count put and the refusal."""
    for count in range(4 * QUOTA // len(FILLER)):
        try:
            reg.put(f"/filler/{count}", FILLER)
        except RegistryError as exc:
            return count, exc
    raise AssertionError(f"etcd took {4 * QUOTA} bytes without refusing a write (quota {QUOTA})")


def _make_room(server: EtcdServer, reg: registry.RegistryCenter, count: int) -> None:
    """What an operator does (the error's advice): delete, compact, defragment, disarm."""
    for index in range(count):
        reg.delete(f"/filler/{index}")
    revision = json.loads(server.etcdctl("endpoint", "status", "-w", "json"))[0]["Status"]["header"]["revision"]
    server.etcdctl("compact", str(revision))
    server.etcdctl("defrag")
    server.etcdctl("alarm", "disarm")


def test_a_full_etcd_refuses_writes_with_the_cure_and_keeps_what_is_stored(small_etcd: EtcdServer) -> None:
    with registry.connect(f"etcd://{small_etcd.address}/space") as reg:
        reg.put("/kept", b"value")
        count, refused = _fill(reg)
        assert count >= 1
        message = str(refused)
        assert "database is full" in message
        assert "--auto-compaction-retention" in message
        assert "etcdctl alarm disarm" in message
        with pytest.raises(RegistryError, match="database is full"):
            reg.create("/new", b"v")
        assert reg.get("/kept") == b"value"  # reads go on; nothing stored is lost
        assert reg.get(f"/filler/{count - 1}") == FILLER
        _make_room(small_etcd, reg, count)
        reg.create("/new", b"v")
        assert reg.get("/new") == b"v"


def test_runs_stop_while_etcd_is_full_and_resume_once_it_has_room(
    small_etcd: EtcdServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="scheduler")
    runs: list[tuple[str, float]] = []

    def job(ctx: ShardingContext) -> None:
        runs.append((ctx.job_name, ctx.fire_time))

    names = [f"space-{index}" for index in range(3)]
    url = f"etcd://{small_etcd.address}/space-jobs"
    sched = Scheduler(url)
    for name in names:
        sched.add_job(JobConfig(name=name, cron="* * * * * ?"), job)
    with registry.connect(f"etcd://{small_etcd.address}/space-filler") as filler:
        sched.start()
        try:
            wait_for(lambda: {name for name, _ in runs} == set(names), 10, message=lambda: f"runs: {runs}")
            count, _ = _fill(filler)

            def refused_jobs() -> set[str]:
                return {
                    name
                    for record in caplog.records
                    if "database is full" in record.getMessage()
                    for name in names
                    if f"job {name}:" in record.getMessage()
                }

            # each job's next fire is refused, with the cure in the log ...
            wait_for(lambda: refused_jobs() == set(names), 10, message=lambda: f"refused: {refused_jobs()}")
            # ... and no run starts while the database is full (two fires of every job)
            during = len(runs)
            holds_for(lambda: len(runs) == during, 2.5, message=lambda: f"ran while full: {runs[during:]}")
            _make_room(small_etcd, filler, count)
            after = len(runs)
            wait_for(
                lambda: {name for name, _ in runs[after:]} == set(names),
                10,
                message=lambda: f"runs after the room was made: {runs[after:]}",
            )
        finally:
            sched.shutdown()
    assert len(runs) == len(set(runs)), f"a fire ran twice: {sorted(runs)}"
