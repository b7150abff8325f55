"""The run history's tables (ElasticJob's JOB_EXECUTION_LOG and JOB_STATUS_TRACE_LOG in
snake_case, plus what shardjob knows of a run) and the one place the schema is created.

Invariant: the schema is versioned in ``shardjob_schema_version``; it is created when
missing and a database whose version is newer than this code's is refused, never altered.
Times are seconds since the epoch (UTC) as double precision, so the same queries run on
SQLite and PostgreSQL.
"""

from __future__ import annotations

import sqlalchemy as sa

__all__ = ["SCHEMA_VERSION", "SchemaError", "ensure_schema", "executions", "metadata", "status_trace"]

SCHEMA_VERSION = 1

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
    """Create the tables when missing (idempotent, safe against a concurrent creator);
    refuse a newer schema."""
    import time

    metadata.create_all(engine, checkfirst=True)
    with engine.begin() as conn:
        found = conn.execute(sa.select(sa.func.max(schema_version.c.version))).scalar()
        if found is None:
            try:
                conn.execute(schema_version.insert().values(version=SCHEMA_VERSION, installed=time.time()))
            except sa.exc.IntegrityError:  # another process stamped it first
                pass
        elif found > SCHEMA_VERSION:
            raise SchemaError(
                f"history schema version {found} is newer than this shardjob's ({SCHEMA_VERSION}); upgrade shardjob"
            )
