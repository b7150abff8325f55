"""The run history's tables (ElasticJob's JOB_EXECUTION_LOG and JOB_STATUS_TRACE_LOG in
snake_case, plus what shardjob knows of a run) and the one place the schema is created.

Invariants: the schema is versioned in ``shardjob_schema_version`` (one row per version
installed); it is created when missing, an older one is upgraded step by step (``_UPGRADES``:
each step idempotent, safe against another process upgrading at the same moment, and
adding only columns with defaults, so rows written before keep their meaning), and a
database whose version is newer than this code's is refused, never altered. Times are
seconds since the epoch (UTC) as double precision, so the same queries run on SQLite and
PostgreSQL.

Versions: 1 (0.1.0) the two tables; 2 ``job_execution_log.attempt``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import sqlalchemy as sa

__all__ = ["SCHEMA_VERSION", "SchemaError", "ensure_schema", "executions", "metadata", "status_trace"]

SCHEMA_VERSION = 2

metadata = sa.MetaData()

#: one row per item run: written when the item ends
executions = sa.Table(
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
    #: 1 for an item's first run in its fire, 2 for its first retry (version 2)
    sa.Column("attempt", sa.Integer(), nullable=False, server_default="1"),
    sa.Index("ix_job_execution_log_job_start", "job_name", "start_time"),
    sa.Index("ix_job_execution_log_start", "start_time"),
)

#: one row per state change of a run (RUNNING, FINISHED, ERROR) or of a fire that did not
#: run (OWED, MISFIRE, SKIPPED, FENCED_OUT)
status_trace = sa.Table(
    "job_status_trace_log",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("job_name", sa.String(255), nullable=False),
    sa.Column("original_task_id", sa.String(1024), nullable=False),
    sa.Column("task_id", sa.String(1024), nullable=False),
    sa.Column("instance_id", sa.String(255), nullable=False),
    sa.Column("execution_type", sa.String(16), nullable=False),
    sa.Column("sharding_item", sa.Text(), nullable=False),
    sa.Column("fire_time", sa.Float(precision=53), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("message", sa.Text(), nullable=True),
    sa.Column("creation_time", sa.Float(precision=53), nullable=False),
    sa.Index("ix_job_status_trace_log_job_time", "job_name", "creation_time"),
    sa.Index("ix_job_status_trace_log_time", "creation_time"),
)

schema_version = sa.Table(
    "shardjob_schema_version",
    metadata,
    sa.Column("version", sa.Integer(), primary_key=True),
    sa.Column("installed", sa.Float(precision=53), nullable=False),
)


class SchemaError(RuntimeError):
    """The database holds a history schema this code does not know."""


def ensure_schema(engine: sa.Engine) -> None:
    """Create the tables when missing, upgrade an older schema (idempotent, safe against a
    concurrent creator or upgrader); refuse a newer one."""
    metadata.create_all(engine, checkfirst=True)  # a new database gets this version at once
    with engine.connect() as conn:
        found = conn.execute(sa.select(sa.func.max(schema_version.c.version))).scalar()
    if found is None:
        _stamp(engine, SCHEMA_VERSION)
        return
    if found > SCHEMA_VERSION:
        raise SchemaError(
            f"history schema version {found} is newer than this shardjob's ({SCHEMA_VERSION}); upgrade shardjob"
        )
    for version in range(found + 1, SCHEMA_VERSION + 1):
        _UPGRADES[version](engine)
        _stamp(engine, version)


def _stamp(engine: sa.Engine, version: int) -> None:
    try:
        with engine.begin() as conn:
            conn.execute(schema_version.insert().values(version=version, installed=time.time()))
    except sa.exc.IntegrityError:  # another process stamped it first
        pass


def _has_column(engine: sa.Engine, table: str, column: str) -> bool:
    with engine.connect() as conn:
        return column in {c["name"] for c in sa.inspect(conn).get_columns(table)}


def _add_column(engine: sa.Engine, table: str, column: str, ddl: str) -> None:
    """``ALTER TABLE table ADD COLUMN column ddl`` unless the column is there; a racing
    upgrader's addition counts as done (the statement's error is then not ours)."""
    if _has_column(engine, table, column):
        return
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN {column} {ddl}")
    except sa.exc.DBAPIError:
        if not _has_column(engine, table, column):
            raise


def _upgrade_to_2(engine: sa.Engine) -> None:
    """``job_execution_log.attempt``: every row written before was a first attempt."""
    _add_column(engine, "job_execution_log", "attempt", "INTEGER NOT NULL DEFAULT 1")


#: version -> the step from the version before it
_UPGRADES: dict[int, Callable[[sa.Engine], None]] = {2: _upgrade_to_2}
