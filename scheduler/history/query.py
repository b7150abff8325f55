"""Reading the run history back: typed rows, newest first, filtered as ``shardjob
history`` filters them.

Invariant: read-only; it never creates or alters the schema (an empty database reads as
no rows, a version-1 one as first attempts: it has no ``attempt`` column until a writer
upgrades it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from scheduler.history.engine import make_engine

__all__ = ["Execution", "HistoryReader", "StatusTrace"]


@dataclass(frozen=True)
class Execution:
    """One item run."""

    id: int
    job_name: str
    sharding_item: int
    instance_id: str
    hostname: str
    ip: str
    task_id: str
    parameter: str | None
    epoch: int
    fire_time: float
    source: str
    start_time: float
    end_time: float | None
    success: bool
    outcome: str
    failure_cause: str | None
    #: 1 for the item's first run in its fire, 2 for its first retry, ...
    attempt: int = 1

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class StatusTrace:
    """One state change of a run, or a fire that did not run."""

    id: int
    job_name: str
    task_id: str
    instance_id: str
    source: str
    sharding_items: str
    fire_time: float
    state: str
    message: str | None
    creation_time: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class HistoryReader:
    def __init__(self, url: str) -> None:
        if isinstance(url, str) and url.startswith("sqlite:///") and url != "sqlite:///:memory:":
            from pathlib import Path

            path = Path(url.removeprefix("sqlite:///").split("?", 1)[0])
            if not path.exists():  # connecting would create an empty file in its place
                raise ValueError(f"no history database at {path} (from {url!r})")
        self._engine = make_engine(url)

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> HistoryReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _has_tables(self) -> bool:
        import sqlalchemy as sa

        return sa.inspect(self._engine).has_table("job_execution_log")

    def _execution_columns(self) -> set[str] | None:
        """The columns ``job_execution_log`` has (an older schema lacks some); None when
        there is no such table."""
        import sqlalchemy as sa

        inspector = sa.inspect(self._engine)
        if not inspector.has_table("job_execution_log"):
            return None
        return {c["name"] for c in inspector.get_columns("job_execution_log")}

    def executions(
        self,
        job: str | None = None,
        *,
        item: int | None = None,
        since: float | None = None,
        failed: bool = False,
        source: str | None = None,
        limit: int | None = 100,
        instance: str | None = None,
        outcome: str | None = None,
        until: float | None = None,
        offset: int = 0,
    ) -> list[Execution]:
        """Item runs, newest first (by start time); ``since``/``until`` bound the start time
        (``until`` excluded), ``offset`` skips that many rows (pages)."""
        import sqlalchemy as sa

        from scheduler.history.schema import executions as t

        present = self._execution_columns()
        if present is None:
            return []
        query = sa.select(*(c for c in t.c if c.name in present))
        if job is not None:
            query = query.where(t.c.job_name == job)
        if item is not None:
            query = query.where(t.c.sharding_item == item)
        if since is not None:
            query = query.where(t.c.start_time >= since)
        if failed:
            query = query.where(t.c.is_success.is_(False))
        if source is not None:
            query = query.where(t.c.execution_source == source)
        if instance is not None:
            query = query.where(t.c.instance_id == instance)
        if outcome is not None:
            query = query.where(t.c.outcome == outcome)
        if until is not None:
            query = query.where(t.c.start_time < until)
        query = query.order_by(t.c.start_time.desc(), t.c.id.desc())
        if limit is not None:
            query = query.limit(limit)
        if offset:
            query = query.offset(offset)
        with self._engine.connect() as conn:
            rows = conn.execute(query).mappings().all()
        return [
            Execution(
                id=r["id"],
                job_name=r["job_name"],
                sharding_item=r["sharding_item"],
                instance_id=r["instance_id"],
                hostname=r["hostname"],
                ip=r["ip"],
                task_id=r["task_id"],
                parameter=r["parameter"],
                epoch=r["epoch"],
                fire_time=r["fire_time"],
                source=r["execution_source"],
                start_time=r["start_time"],
                end_time=r["complete_time"],
                success=bool(r["is_success"]),
                outcome=r["outcome"],
                failure_cause=r["failure_cause"],
                attempt=r.get("attempt", 1),
            )
            for r in rows
        ]

    def status_trace(
        self, job: str | None = None, *, since: float | None = None, limit: int | None = 100
    ) -> list[StatusTrace]:
        """State changes, newest first."""
        import sqlalchemy as sa

        from scheduler.history.schema import status_trace as t

        if not self._has_tables():
            return []
        query = sa.select(t)
        if job is not None:
            query = query.where(t.c.job_name == job)
        if since is not None:
            query = query.where(t.c.creation_time >= since)
        query = query.order_by(t.c.creation_time.desc(), t.c.id.desc())
        if limit is not None:
            query = query.limit(limit)
        with self._engine.connect() as conn:
            rows = conn.execute(query).mappings().all()
        return [
            StatusTrace(
                id=r["id"],
                job_name=r["job_name"],
                task_id=r["task_id"],
                instance_id=r["instance_id"],
                source=r["execution_type"],
                sharding_items=r["sharding_item"],
                fire_time=r["fire_time"],
                state=r["state"],
                message=r["message"],
                creation_time=r["creation_time"],
            )
            for r in rows
        ]

    def count(self, table: str = "executions") -> int:
        import sqlalchemy as sa

        from scheduler.history.schema import executions, status_trace

        if not self._has_tables():
            return 0
        t = executions if table == "executions" else status_trace
        with self._engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(t)).scalar() or 0)
