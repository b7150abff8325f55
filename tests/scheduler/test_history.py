"""Run history end to end: schedulers on every backend write their item runs and run
state changes to SQLite and to a real PostgreSQL; the rows say what ran, where, why and
how it ended; a database outage costs counted rows, never a run; retention bounds it."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler import JobConfig, Scheduler, ShardingContext
from scheduler.cli import main, parse_since
from scheduler.history import Execution, HistoryReader, HistoryWriter
from sharding.layout import JobPaths
from tests.harness import Harness
from tests.servers.postgres import PostgresServer
from tests.waiting import wait_for

EVERY_SECOND = "* * * * * ?"


@pytest.fixture
def schedulers() -> Iterator[list[Scheduler]]:
    made: list[Scheduler] = []
    yield made
    for sched in made:
        sched.shutdown(wait=True)


def rows(url: str, job: str | None = None, **filters: object) -> list[Execution]:
    with HistoryReader(url) as reader:
        return reader.executions(job, limit=None, **filters)  # type: ignore[arg-type]


def flaky(ctx: ShardingContext) -> None:
    if ctx.sharding_item == 1:
        raise ValueError(f"item 1 fails at {ctx.fire_time}")


def test_normal_failed_and_triggered_runs_are_recorded(
    harness: Harness, history_url: str, schedulers: list[Scheduler]
) -> None:
    namespace = harness.fresh_namespace()
    sched = Scheduler(harness.url(namespace), history=history_url, max_workers=2)
    schedulers.append(sched)
    sched.add_job(
        JobConfig(name="settle", cron=EVERY_SECOND, sharding_total_count=2, sharding_item_parameters="0=a,1=b"),
        flaky,
    )
    started = time.time()
    sched.start()
    assert sched.history is not None

    def normal_fires() -> set[float]:
        sched.history.flush()  # type: ignore[union-attr]
        return {r.fire_time for r in rows(history_url, "settle", source="NORMAL")}

    wait_for(lambda: len(normal_fires()) >= 2, 20, message="two fires recorded")
    sched.trigger("settle")
    wait_for(lambda: sched.history.flush() and rows(history_url, source="TRIGGER"), 20, message="trigger recorded")  # type: ignore[union-attr]
    sched.shutdown(wait=True)

    recorded = rows(history_url, "settle")
    ok = [r for r in recorded if r.sharding_item == 0]
    bad = [r for r in recorded if r.sharding_item == 1]
    assert ok and bad
    for r in ok:
        assert r.success and r.outcome == "success" and r.failure_cause is None and r.parameter == "a"
    for r in bad:
        assert not r.success and r.outcome == "failure" and r.parameter == "b"
        assert r.failure_cause is not None and r.failure_cause.startswith("ValueError: item 1 fails at")
    for r in recorded:
        assert r.instance_id == sched.instance_id
        assert r.job_name == "settle" and r.epoch >= 1
        assert started - 1 <= r.fire_time <= r.start_time <= (r.end_time or 0) <= time.time()
    assert {r.source for r in recorded} == {"NORMAL", "TRIGGER"}
    # newest first
    assert [r.start_time for r in recorded] == sorted((r.start_time for r in recorded), reverse=True)
    assert rows(history_url, "settle", failed=True) == [r for r in recorded if not r.success]
    assert rows(history_url, "settle", item=0) == ok
    # the status trace: RUNNING then ERROR (item 1 failed) for each run
    with HistoryReader(history_url) as reader:
        states = {t.state for t in reader.status_trace("settle", limit=None)}
    assert {"RUNNING", "ERROR", "RESHARDED"} <= states


@pytest.mark.parametrize("failover", [False, True], ids=["misfire", "owed"])
def test_fires_a_busy_run_passed_are_recorded_as_misfire_or_owed(
    harness: Harness, tmp_path: object, schedulers: list[Scheduler], failover: bool
) -> None:
    url = f"sqlite:///{tmp_path}/h.db"
    sched = Scheduler(harness.url(harness.fresh_namespace()), history=url, max_workers=2)
    schedulers.append(sched)

    released = threading.Event()  # set once the rows are read: the shutdown waits for no run

    def slow(ctx: ShardingContext) -> None:
        released.wait(1.6)  # the item's own work outlasts the next fire

    sched.add_job(JobConfig(name="slow", cron=EVERY_SECOND, failover=failover), slow)
    sched.start()
    expected = "OWED" if failover else "MISFIRE"
    try:
        wait_for(
            lambda: sched.history.flush() and rows(url, "slow", source=expected),  # type: ignore[union-attr]
            20,
            message=f"a {expected} run recorded",
        )
        with HistoryReader(url) as reader:
            states = {t.state for t in reader.status_trace("slow", limit=None)}
        assert expected in states  # the deferral itself is traced
    finally:
        released.set()


def test_failover_runs_are_recorded(harness: Harness, history_url: str, schedulers: list[Scheduler]) -> None:
    namespace = harness.fresh_namespace()
    timeout = harness.min_session_timeout
    link = harness.link()
    config = JobConfig(name="fo", cron=EVERY_SECOND, sharding_total_count=4, failover=True)

    victim_running = [0]
    lock = threading.Lock()

    def hold(ctx: ShardingContext) -> None:
        threading.Event().wait(0.3)  # the item's work: the cut lands inside it

    def victim_hold(ctx: ShardingContext) -> None:
        with lock:
            victim_running[0] += 1
        try:
            hold(ctx)
        finally:
            with lock:
                victim_running[0] -= 1

    survivor = Scheduler(harness.url(namespace, session_timeout=timeout), history=history_url, max_workers=4)
    victim = Scheduler(link.url(namespace, session_timeout=timeout), max_workers=4)
    for sched, job in ((survivor, hold), (victim, victim_hold)):
        sched.add_job(config, job)
        schedulers.append(sched)
        sched.start()
    wait_for(lambda: victim.runner("fo").sharding.ready() is not None, 20, message="victim has items")
    observer = harness.connect(namespace)  # straight to the server: caches leave marks out
    mark = JobPaths("fo").running_of(victim.instance_id)
    # inside a run: an item of the victim running before and after its mark is read
    wait_for(
        lambda: victim_running[0] > 0 and observer.exists(mark) and victim_running[0] > 0,
        5,
        interval=0.005,
        message="inside a run",
    )
    link.cut()
    try:
        wait_for(
            lambda: survivor.history.flush() and rows(history_url, "fo", source="FAILOVER"),  # type: ignore[union-attr]
            timeout + 30,
            message="a failover run recorded",
        )
        for r in rows(history_url, "fo", source="FAILOVER"):
            assert r.instance_id == survivor.instance_id and r.success
            assert "FAILOVER" in r.task_id
    finally:
        link.restore()


def test_database_outage_counts_the_loss_and_rows_resume(
    pg_server: PostgresServer | str, pg_url: str, schedulers: list[Scheduler]
) -> None:
    if isinstance(pg_server, str):
        pytest.skip("external PostgreSQL: cannot stop it")
    from tests.harnesses.memory import MemoryHarness

    harness = MemoryHarness()
    ran: list[float] = []
    writer = HistoryWriter(pg_url, buffer_size=5, retry_interval=0.2, flush_interval=0.1)
    sched = Scheduler(harness.url("/outage"), history=writer, max_workers=4)
    schedulers.append(sched)
    sched.add_job(JobConfig(name="o", cron=EVERY_SECOND, sharding_total_count=4), lambda ctx: ran.append(ctx.fire_time))
    sched.start()
    wait_for(lambda: writer.flush() and rows(pg_url, "o"), 20, message="rows written before the outage")
    pg_server.stop()
    down_at = time.time()
    try:
        # runs go on while the database is down; 4 items a second overflow 5 buffered rows
        wait_for(lambda: len([f for f in ran if f > down_at]) >= 12, 20, message="runs go on")
        wait_for(lambda: writer.dropped > 0, 10, message="the loss is counted")
    finally:
        pg_server.start()
    back_at = time.time()
    wait_for(
        lambda: any(r.fire_time > back_at for r in rows(pg_url, "o")), 30, message="rows resume after the outage"
    )
    assert writer.errors > 0


def test_a_full_buffer_counts_every_row_it_drops_while_threads_put_at_once(tmp_path: Path) -> None:
    """Puts take no lock: with four threads putting into a full buffer and the interpreter
    switching threads every microsecond, every row is either still buffered or counted
    (and reported) as dropped, and the buffer overshoots its size by at most a row per
    thread."""
    import sys

    size, threads, per_thread = 50, 4, 5000
    writer = HistoryWriter(f"sqlite:///{tmp_path / 'h.db'}", buffer_size=size)  # not started: nothing drains
    reported: list[int] = []
    writer.on_drop = reported.append
    barrier = threading.Barrier(threads)

    def put_many(tag: int) -> None:
        barrier.wait(10)
        for i in range(per_thread):
            writer.put_row("status_trace", (tag, i))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        workers = [threading.Thread(target=put_many, args=(tag,)) for tag in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
    finally:
        sys.setswitchinterval(interval)
        writer.close()
    assert writer.dropped + writer.buffered == threads * per_thread
    assert sum(reported) == writer.dropped
    assert size <= writer.buffered <= size + threads


def test_rows_the_database_refuses_are_dropped_alone(history_url: str) -> None:
    """A batch with rows the database refuses (a NOT NULL broken on both databases; on
    PostgreSQL also an item beyond its int4 column, which binary COPY would store wrapped,
    and a NUL in a text) is written in halves down to those rows: every other row is
    stored, in order, and the writer goes on with the next batch."""
    postgres = history_url.startswith("postgresql")
    writer = HistoryWriter(history_url, flush_interval=0.05, max_age=None)
    reported: list[int] = []
    writer.on_reject = reported.append

    def row(i: int) -> dict[str, object]:
        return {
            "job_name": None if i == 3 else "refused", "task_id": "t", "hostname": "h", "ip": "127.0.0.1",
            "instance_id": "i", "sharding_item": 2**40 if i == 11 else i, "parameter": None, "epoch": 1,
            "fire_time": float(i), "execution_source": "NORMAL", "start_time": float(i),
            "complete_time": float(i), "is_success": i != 15, "outcome": "success",
            "failure_cause": "a\x00b" if i == 15 else None, "attempt": 1,
        }  # fmt: skip

    for i in range(20):
        writer.put("executions", row(i))
    writer.start()
    try:
        assert writer.flush(30), "the refused rows hold back the batch"
        refused = {3, 11, 15} if postgres else {3}
        assert (writer.rejected, sum(reported), writer.written) == (len(refused), len(refused), 20 - len(refused))
        writer.put("executions", row(20))
        assert writer.flush(30)
    finally:
        writer.close()
    stored = sorted(rows(history_url, "refused"), key=lambda r: r.fire_time)
    kept = [i for i in range(21) if i not in refused]
    assert [r.fire_time for r in stored] == [float(i) for i in kept]
    assert [r.sharding_item for r in stored] == [2**40 if i == 11 else i for i in kept]  # never wrapped


def test_tables_dropped_under_a_running_writer_are_created_again(history_url: str) -> None:
    """The writer checks the schema again after a failed write: history dropped by hand (or a
    database replaced by an empty one) resumes in new tables, losing only what was dropped."""
    from scheduler.history.engine import make_engine

    def row(i: int) -> tuple[object, ...]:  # COLUMNS["executions"] order
        return ("dropped", "t", "h", "127.0.0.1", "i", i, None, 1, float(i), "NORMAL", float(i), float(i), True,
                "success", None, 1)  # fmt: skip

    writer = HistoryWriter(history_url, flush_interval=0.05, retry_interval=0.1, max_age=None)
    writer.start()
    engine = make_engine(history_url)
    try:
        writer.put_row("executions", row(0))
        assert writer.flush(30)
        with engine.begin() as conn:
            conn.exec_driver_sql("DROP TABLE job_execution_log")
        writer.put_row("executions", row(1))
        writer.put_row("executions", row(2))
        assert writer.flush(30), "the rows after the drop never reached the database"
    finally:
        writer.close()
        engine.dispose()
    assert [r.sharding_item for r in sorted(rows(history_url, "dropped"), key=lambda r: r.fire_time)] == [1, 2]
    assert writer.errors >= 1 and writer.dropped == 0 and writer.rejected == 0


def test_the_writers_column_order_is_the_schemas() -> None:
    """The recorder hands rows over as tuples in ``COLUMNS`` order; the INSERT and COPY
    take them in that order too, so it must be the tables' own."""
    from scheduler.history.schema import executions, status_trace
    from scheduler.history.writer import COLUMNS

    for name, table in (("executions", executions), ("status_trace", status_trace)):
        assert COLUMNS[name] == tuple(c.name for c in table.columns if c.name != "id")


def test_an_sqlite_history_is_tuned_for_large_batches(tmp_path: Path) -> None:
    from scheduler.history.engine import make_engine

    engine = make_engine(f"sqlite:///{tmp_path / 'runs.db'}")
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
            assert conn.exec_driver_sql("PRAGMA cache_size").scalar() == -16_384
            assert conn.exec_driver_sql("PRAGMA page_size").scalar() == 16_384
            assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 2_560  # 40 MiB
    finally:
        engine.dispose()


def test_an_sqlite_history_made_with_small_pages_keeps_them(tmp_path: Path) -> None:
    import sqlite3

    from scheduler.history.engine import make_engine
    from scheduler.history.schema import ensure_schema

    path = tmp_path / "runs.db"
    with contextlib.closing(sqlite3.connect(path)) as old:  # as SQLite makes a file by default
        old.execute("CREATE TABLE earlier (x INTEGER)")
        old.commit()
    engine = make_engine(f"sqlite:///{path}")
    try:
        ensure_schema(engine)
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA page_size").scalar() == 4_096
            assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 10_240  # 40 MiB
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    finally:
        engine.dispose()


def test_retention_by_rows_and_by_age(history_url: str) -> None:
    writer = HistoryWriter(history_url, max_rows=10, max_age=3600, retention_interval=0.1, flush_interval=0.05)
    writer.start()
    try:
        now = time.time()

        def row(i: int, start: float) -> dict[str, object]:
            return {
                "job_name": "r", "task_id": "t", "hostname": "h", "ip": "127.0.0.1", "instance_id": "i",
                "sharding_item": i, "parameter": None, "epoch": 1, "fire_time": start, "execution_source": "NORMAL",
                "start_time": start, "complete_time": start + 0.1, "is_success": True, "outcome": "success",
                "failure_cause": None, "attempt": 1,
            }  # fmt: skip

        for i in range(5):
            writer.put("executions", row(i, now - 7200))  # older than max_age
        for i in range(25):
            writer.put("executions", row(100 + i, now))
        assert writer.flush()
        wait_for(
            lambda: len(rows(history_url, "r")) == 10, 10, message=lambda: f"{len(rows(history_url, 'r'))} rows kept"
        )
        kept = rows(history_url, "r")
        assert sorted(r.sharding_item for r in kept) == list(range(115, 125))  # the newest ten
    finally:
        writer.close()


def _version_1_schema(url: str) -> None:
    """A database as shardjob 0.1.0 (history schema 1) left it, with one row."""
    import sqlalchemy as sa

    from scheduler.history.engine import make_engine
    from scheduler.history.schema import schema_version, status_trace

    engine = make_engine(url)
    metadata = sa.MetaData()
    v1 = sa.Table(
        "job_execution_log",
        metadata,
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("job_name", sa.String(255), nullable=False),
        sa.Column("task_id", sa.String(1024), nullable=False),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.Column("ip", sa.String(64), nullable=False),
        sa.Column("instance_id", sa.String(255), nullable=False),
        sa.Column("sharding_item", sa.Integer(), nullable=False),
        sa.Column("parameter", sa.Text(), nullable=True),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("fire_time", sa.Float(precision=53), nullable=False),
        sa.Column("execution_source", sa.String(16), nullable=False),
        sa.Column("start_time", sa.Float(precision=53), nullable=False),
        sa.Column("complete_time", sa.Float(precision=53), nullable=True),
        sa.Column("is_success", sa.Boolean(), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("failure_cause", sa.Text(), nullable=True),
    )
    status_trace.to_metadata(metadata)
    schema_version.to_metadata(metadata)
    metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(sa.insert(metadata.tables["shardjob_schema_version"]).values(version=1, installed=time.time()))
        old = {
            "job_name": "old", "task_id": "t", "hostname": "h", "ip": "10.0.0.1", "instance_id": "i",
            "sharding_item": 0, "parameter": None, "epoch": 1, "fire_time": 1.0, "execution_source": "NORMAL",
            "start_time": 1.0, "complete_time": 2.0, "is_success": False, "outcome": "failure",
            "failure_cause": "ValueError: old",
        }  # fmt: skip
        conn.execute(sa.insert(v1).values(**old))
    engine.dispose()


def test_a_version_1_database_is_upgraded_in_place(history_url: str) -> None:
    """Two writers start on a schema-1 database at once: the attempt column is added once,
    version 2 stamped, the old row reads as a first attempt; a reader reads the schema-1
    database before the upgrade too (it never alters one)."""
    import sqlalchemy as sa

    from scheduler.history.engine import make_engine
    from scheduler.history.schema import SCHEMA_VERSION, ensure_schema

    _version_1_schema(history_url)
    [before] = rows(history_url, "old")
    assert (before.attempt, before.failure_cause) == (1, "ValueError: old")
    engines = [make_engine(history_url) for _ in range(2)]
    barrier, errors = threading.Barrier(2), []

    def upgrade(engine: sa.Engine) -> None:
        try:
            barrier.wait(10)
            ensure_schema(engine)
        except BaseException as exc:  # judged below
            errors.append(exc)

    threads = [threading.Thread(target=upgrade, args=(engine,)) for engine in engines]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    ensure_schema(engines[0])  # idempotent once upgraded
    with engines[0].connect() as conn:
        versions = conn.execute(sa.text("SELECT version FROM shardjob_schema_version ORDER BY version")).scalars()
        assert list(versions) == [1, SCHEMA_VERSION] == [1, 2]
        assert "attempt" in {c["name"] for c in sa.inspect(conn).get_columns("job_execution_log")}
    for engine in engines:
        engine.dispose()
    writer = HistoryWriter(history_url, flush_interval=0.05, max_age=None)  # the rows are from 1970
    writer.start()
    try:
        new = {
            "job_name": "new", "task_id": "t", "hostname": "h", "ip": "10.0.0.1", "instance_id": "i",
            "sharding_item": 0, "parameter": None, "epoch": 1, "fire_time": 3.0, "execution_source": "NORMAL",
            "start_time": 3.0, "complete_time": 4.0, "is_success": True, "outcome": "success",
            "failure_cause": None, "attempt": 2,
        }  # fmt: skip
        writer.put("executions", new)
        assert writer.flush()
    finally:
        writer.close()
    assert [(r.job_name, r.attempt) for r in rows(history_url)] == [("new", 2), ("old", 1)]


def test_retried_attempts_are_rows_of_their_own(
    history_url: str, schedulers: list[Scheduler]
) -> None:
    from tests.harnesses.memory import MemoryHarness

    def job(ctx: ShardingContext) -> None:
        if ctx.attempt < 3:
            raise ValueError(f"attempt {ctx.attempt} fails")

    sched = Scheduler(MemoryHarness().url("/retries"), history=history_url, max_workers=2)
    schedulers.append(sched)
    sched.add_job(JobConfig(name="r", sharding_total_count=2, retries=4, retry_backoff_seconds=0.01), job)
    sched.start()
    wait_for(lambda: sched.runner("r").sharding.registered, 20, message="registered")
    sched.trigger("r")
    wait_for(
        lambda: sched.history.flush() and len(rows(history_url, "r")) == 6,  # type: ignore[union-attr]
        20,
        message=lambda: f"rows: {rows(history_url, 'r')}",
    )
    recorded = sorted((r.sharding_item, r.attempt, r.success) for r in rows(history_url, "r"))
    assert recorded == [(item, n, n == 3) for item in (0, 1) for n in (1, 2, 3)]
    assert rows(history_url, "r", failed=True)[0].failure_cause == "ValueError: attempt 2 fails"


def test_history_cli_lists_json_and_table(
    history_url: str, capsys: pytest.CaptureFixture[str], schedulers: list[Scheduler]
) -> None:
    from tests.harnesses.memory import MemoryHarness

    harness = MemoryHarness()
    sched = Scheduler(harness.url("/cli"), history=history_url)
    schedulers.append(sched)
    sched.add_job(JobConfig(name="c", cron=EVERY_SECOND, sharding_total_count=2), flaky)
    sched.start()
    wait_for(lambda: sched.history.flush() and len(rows(history_url, "c")) >= 4, 20, message="runs recorded")  # type: ignore[union-attr]
    sched.shutdown(wait=True)
    capsys.readouterr()

    assert main(["history", "c", "--failed", "--json", "--history", history_url]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed and all(not r["success"] and r["sharding_item"] == 1 for r in listed)
    for key in ("job_name", "sharding_item", "instance_id", "fire_time", "source", "start_time", "end_time",
                "success", "failure_cause"):  # fmt: skip
        assert key in listed[0]
    assert [r["start_time"] for r in listed] == sorted((r["start_time"] for r in listed), reverse=True)

    assert main(["history", "c", "--item", "0", "--limit", "1", "--json", "--history", history_url]) == 0
    one = json.loads(capsys.readouterr().out)
    assert len(one) == 1 and one[0]["sharding_item"] == 0 and one[0]["success"]

    assert main(["history", "--since", "1h", "--history", history_url]) == 0
    table = capsys.readouterr().out
    assert "ValueError: item 1 fails" in table and sched.instance_id in table

    assert main(["history", "c", "--trace", "--json", "--history", history_url]) == 0
    trace = json.loads(capsys.readouterr().out)
    assert {"RUNNING", "ERROR", "RESHARDED"} <= {t["state"] for t in trace}
    assert main(["history", "c", "--trace", "--history", history_url]) == 0
    assert "items failed: 1" in capsys.readouterr().out
    assert main(["history", "--trace", "--failed", "--history", history_url]) == 2
    capsys.readouterr()

    assert main(["history", "--since", "yesterday", "--history", history_url]) == 2
    assert "--since 'yesterday'" in capsys.readouterr().err


def test_parse_since() -> None:
    assert parse_since("30m", now=10_000.0) == 10_000.0 - 1800
    assert parse_since("2h", now=10_000.0) == 10_000.0 - 7200
    assert parse_since("1970-01-01T01:00") == 3600.0


def test_worker_with_a_bad_history_url_exits_with_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["worker", "--registry", "memory://bad-history", "--job", "tests.scenarios.recording_job:record",
            "--cron", EVERY_SECOND, "--history", "mysql://db/x"]  # fmt: skip
    assert main(argv) == 2
    assert "scheme 'mysql'" in capsys.readouterr().err


def test_bad_history_url_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="scheme 'mysql'"):
        Scheduler("memory://x/bad", history="mysql://db/x")
    with pytest.raises(ValueError, match="database URL"):
        HistoryWriter("runs.db")
    with pytest.raises(ValueError, match="no history database"):
        HistoryReader("sqlite:////nonexistent/runs.db")
