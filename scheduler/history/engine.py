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

#: pages of write-ahead log that start a checkpoint (``_sqlite_journal``)
_WAL_PAGES = 10_000
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
    the database file) waits for ``_WAL_PAGES`` pages of log instead of SQLite's 1,000,
    which one batch of a busy process fills alone, so an index page written by several
    batches is copied back once; and the page cache holds ``_CACHE_KIB`` KiB instead of
    2 MiB, so the per-job indexes' last pages stay in memory from one batch to the next.
    The cost: the log file grows to ~40 MiB and keeps that size, and a connection may
    cache 16 MiB."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA wal_autocheckpoint={_WAL_PAGES}")
        cursor.execute(f"PRAGMA cache_size=-{_CACHE_KIB}")
    finally:
        cursor.close()
