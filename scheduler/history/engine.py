"""The history database chosen by URL: ``sqlite:///path`` (embedded, the default kind) or
``postgresql://...`` (through psycopg 3).

Invariant: a missing optional dependency is a clear error naming the pip install, raised
when history is asked for, not at import of shardjob.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import sqlalchemy as sa

__all__ = ["HistoryUnavailable", "driver_url", "make_engine"]

#: bytes per page of a new SQLite database (``_sqlite_journal``)
_PAGE_SIZE = 16_384
#: bytes of write-ahead log that start a checkpoint (``_sqlite_journal``)
_WAL_BYTES = 40 * 1024 * 1024
#: KiB of page cache per SQLite connection (``_sqlite_journal``)
_CACHE_KIB = 16_384


class HistoryUnavailable(RuntimeError):
    """History was asked for but its optional dependency is not installed."""


def driver_url(url: str) -> str:
    """``postgresql://`` and ``postgres://`` go through psycopg 3; other URLs are kept."""
    if not isinstance(url, str) or "://" not in url:
        raise ValueError(f"history needs a database URL such as sqlite:///runs.db, got {url!r}")
    scheme, rest = url.split("://", 1)
    if scheme in ("postgresql", "postgres"):
        return "postgresql+psycopg://" + rest
    if scheme == "sqlite" or scheme.startswith(("sqlite+", "postgresql+")):
        return url
    raise ValueError(f"history URL {url!r}: scheme {scheme!r} is not sqlite:// or postgresql://")


def make_engine(url: str) -> sa.Engine:
    full = driver_url(url)
    try:
        import sqlalchemy as sa
    except ImportError:
        raise HistoryUnavailable(
            "run history needs SQLAlchemy: pip install 'shardjob[history]'"
        ) from None
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if full.startswith("postgresql+psycopg"):
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise HistoryUnavailable(
                "history in PostgreSQL needs psycopg 3: pip install 'shardjob[postgresql]'"
            ) from None
        kwargs["connect_args"] = {"connect_timeout": 5}
    else:
        # the writer thread and readers share the file; wait for its lock, do not fail
        kwargs["connect_args"] = {"timeout": 10, "check_same_thread": False}
    engine = sa.create_engine(full, **kwargs)
    if engine.dialect.name == "sqlite":
        sa.event.listen(engine, "connect", _sqlite_journal)
    return engine


def _sqlite_journal(dbapi_connection: Any, _record: Any) -> None:
    """Write-ahead log: readers (``shardjob history``) never wait for the writer nor it for
    them, and a commit appends to the log instead of rewriting pages through a rollback
    journal. ``synchronous=NORMAL`` syncs at checkpoints, not at every commit: a commit
    survives the process crashing; a power cut may lose the last ones (the writer's buffer
    would be lost with the process anyway).

    For the writer's large batches (``HistoryWriter``): a checkpoint (the log copied into
    the database file) waits for ``_WAL_BYTES`` of log instead of SQLite's 1,000 pages,
    which one batch of a busy process fills alone, so an index page written by several
    batches is copied back once; the page cache holds ``_CACHE_KIB`` KiB instead of 2 MiB,
    so the per-job indexes' last pages stay in memory from one batch to the next; and a new
    file gets pages of ``_PAGE_SIZE`` bytes, not 4 KiB: every item run inserts into each
    table's per-job index at its job's own place, and a larger page splits a quarter as
    often (the writer's CPU per row after minutes of rows: a quarter less; BENCHMARKS.md).
    A file created before keeps its page size (SQLite cannot change it in WAL mode); the
    checkpoint's threshold is counted in its pages. The cost: the log file grows to ~40 MiB
    and keeps that size, and a connection may cache 16 MiB."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA page_size={_PAGE_SIZE}")  # before WAL: it sizes a new file only
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        page_size = cursor.execute("PRAGMA page_size").fetchone()[0]  # an older file keeps its own
        cursor.execute(f"PRAGMA wal_autocheckpoint={_WAL_BYTES // page_size}")
        cursor.execute(f"PRAGMA cache_size=-{_CACHE_KIB}")
    finally:
        cursor.close()
