"""The history writer: a bounded buffer of rows drained by one thread in batches, and the
retention sweep (by age and by row count) run by the same thread.

Invariants: ``put`` never blocks and never raises — when the buffer is full (the database
down or slow) the oldest row is dropped and the loss counted and logged; a batch the
database could not take is kept and tried again (bounded by one batch), so rows resume once
it is back; a batch it refused for its rows' sake (a constraint, a value it cannot store)
is written in halves down to the rows at fault, which alone are dropped, counted and
logged, so one bad row never holds back the others nor the rows after it; the schema is
created by this thread, so a database down at start-up delays history, never the
scheduler, and checked again after any failed write, so history survives its tables being
dropped.

Batches are large on purpose: the writer writes every ``flush_interval``, in transactions
of up to ``batch_size`` rows (a backlog goes in full batches at once; a flush or a close
does not wait for the interval). Every item run adds a row to
each table's per-job index at that job's end of it, so a transaction dirties about one
index page per job whatever its size, and SQLite writes each dirty page to its log and
copies it back at the next checkpoint: fewer, larger transactions pay that once for many
rows (BENCHMARKS.md, observability).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from scheduler.history.engine import make_engine

__all__ = ["COLUMNS", "HistoryWriter"]

log = logging.getLogger("scheduler.history")

#: each table's columns (the schema's own order, ``id`` aside): the order of a row's values
#: in ``put_row``, the INSERT's parameters and PostgreSQL's COPY
COLUMNS: dict[str, tuple[str, ...]] = {
    "executions": (
        "job_name", "task_id", "hostname", "ip", "instance_id", "sharding_item", "parameter", "epoch",
        "fire_time", "execution_source", "start_time", "complete_time", "is_success", "outcome",
        "failure_cause", "attempt",
    ),
    "status_trace": (
        "job_name", "original_task_id", "task_id", "instance_id", "execution_type", "sharding_item",
        "fire_time", "state", "message", "creation_time",
    ),
}  # fmt: skip

#: DB-API exceptions (by class name, whichever driver raised them) that blame the rows
#: written, not the database: a constraint they break, a value it cannot store
_ROW_ERRORS = frozenset({"DataError", "IntegrityError"})
#: the range of each integer type a binary COPY may write (PostgreSQL type OID -> bound):
#: binary integers go over the wire in their column's width, so a value outside it would
#: be stored wrapped around, where the text format refused it
_INT_BOUNDS = {21: 2**15, 23: 2**31, 20: 2**63}

#: seconds between two "rows dropped" (or "row refused") warnings while the loss goes on
_LOSS_LOG_INTERVAL = 10.0
#: seconds between two "database unavailable" warnings while it stays down
_DOWN_LOG_INTERVAL = 60.0


#: a table's binary COPY: the statement, its columns' type OIDs, (index, bound) of its integers
_CopyPlan = tuple[str, list[int], list[tuple[int, int]]]


def _table(table: str) -> Any:
    """The ``sqlalchemy.Table`` of ``table`` (a key of ``COLUMNS``)."""
    from scheduler.history.schema import executions, status_trace

    return {"executions": executions, "status_trace": status_trace}[table]


class _OutOfRange(Exception):
    """A value a binary COPY would store wrapped around: the row's fault (``_blames_rows``)."""


def _blames_rows(exc: BaseException) -> bool:
    """Whether the database (or the driver adapting values for it) refused rows for what
    they hold, rather than failing to take them at all (down, locked, unreachable)."""
    orig = getattr(exc, "orig", None)  # SQLAlchemy's wrapper of the driver's exception
    if orig is not None:
        if getattr(exc, "connection_invalidated", False):
            return False
        exc = orig
    if isinstance(exc, (_OutOfRange, TypeError)):  # psycopg's dumpers: a value of the wrong type
        return True
    return any(cls.__name__ in _ROW_ERRORS for cls in type(exc).__mro__)


class HistoryWriter:
    """Write execution and status-trace rows to the database at ``url``.

    ``max_age`` (seconds) and ``max_rows`` (per table) bound what is kept; ``None`` keeps
    everything. ``buffer_size`` rows wait at most; every ``flush_interval`` seconds they are
    written in transactions of up to ``batch_size`` rows.
    """

    def __init__(
        self,
        url: str,
        *,
        buffer_size: int = 100_000,
        batch_size: int = 10_000,
        flush_interval: float = 2.0,
        max_age: float | None = 30 * 86400.0,
        max_rows: int | None = None,
        retention_interval: float = 300.0,
        retry_interval: float = 2.0,
    ) -> None:
        if buffer_size < 1 or batch_size < 1:
            raise ValueError("history buffer_size and batch_size must be >= 1")
        if max_age is not None and max_age <= 0:
            raise ValueError(f"history max_age must be > 0 seconds or None, got {max_age!r}")
        if max_rows is not None and max_rows < 1:
            raise ValueError(f"history max_rows must be >= 1 or None, got {max_rows!r}")
        for name, seconds in (
            ("flush_interval", flush_interval),
            ("retention_interval", retention_interval),
            ("retry_interval", retry_interval),
        ):
            if not seconds > 0:  # NaN too
                raise ValueError(f"history {name} must be > 0 seconds, got {seconds!r}")
        self.url = url
        self._engine = make_engine(url)  # a bad URL or a missing driver fails here
        self._buffer: collections.deque[tuple[str, tuple[Any, ...]]] = collections.deque()
        self._buffer_size = buffer_size
        self._batch_size = batch_size
        self._flush_interval = flush_interval
        self.max_age = max_age
        self.max_rows = max_rows
        self._retention_interval = retention_interval
        self._retry_interval = retry_interval
        self._lock = threading.Lock()
        self._wake = threading.Event()
        #: set by ``flush``: write what waits now, without waiting for a full batch
        self._hurry = threading.Event()
        #: when the rows waiting are due, unless a backlog or a flush comes first
        self._next_batch = 0.0
        self._stop = threading.Event()
        self._pending: list[tuple[str, tuple[Any, ...]]] = []
        self._schema_ready = False
        #: table -> (its INSERT, whether its parameters are named), compiled once
        self._inserts: dict[str, tuple[str, bool]] = {}
        #: table -> its binary COPY (``_CopyPlan``), the types read once from the server
        self._copies: dict[str, _CopyPlan] = {}
        self._next_retention = 0.0
        self._last_loss_log = 0.0
        self._last_reject_log = -_LOSS_LOG_INTERVAL
        self._down_since: float | None = None
        self._last_down_log = 0.0
        #: rows dropped because the buffer was full
        self.dropped = 0
        #: rows written
        self.written = 0
        #: batches the database could not take (and were kept to try again)
        self.errors = 0
        #: rows the database refused (a constraint, a value it cannot store): dropped alone
        self.rejected = 0
        #: called with the number of rows dropped (metrics subscribe here)
        self.on_drop: Callable[[int], None] | None = None
        #: called with the number of rows rejected
        self.on_reject: Callable[[int], None] | None = None
        self._thread = threading.Thread(target=self._loop, name="shardjob-history", daemon=True)
        self._started = False

    # -- producers (any thread, never blocks) ------------------------------------------------
    def put(self, table: str, row: dict[str, Any]) -> None:
        """Queue ``row`` (column name -> value) for ``table``."""
        self.put_row(table, tuple(row[name] for name in COLUMNS[table]))

    def put_row(self, table: str, values: tuple[Any, ...]) -> None:
        """Queue a row of ``table`` given as its values in ``COLUMNS[table]`` order: what the
        recorder does for every run, with no dict to build and take apart again."""
        # No lock on the way in: a deque's append is atomic, and only the writer (taking a
        # batch) and a full buffer's trim (below) remove rows, both under the lock. The
        # length check and the append are two steps, so producers racing at a full buffer
        # overshoot it by at most one row each until the next put trims it.
        buffer = self._buffer
        if len(buffer) >= self._buffer_size:
            self._drop_oldest()
        buffer.append((table, values))

    def _drop_oldest(self) -> None:
        """Make room for one row: drop the oldest, count and report the loss."""
        with self._lock:
            dropped = 0
            while len(self._buffer) >= self._buffer_size:
                self._buffer.popleft()
                dropped += 1
            self.dropped += dropped
        if dropped:
            self._report_loss(dropped)

    def _report_loss(self, count: int) -> None:
        callback = self.on_drop
        if callback is not None:
            callback(count)
        now = time.monotonic()
        if now - self._last_loss_log >= _LOSS_LOG_INTERVAL:
            self._last_loss_log = now
            log.warning(
                "history buffer full (%d rows): oldest rows dropped, %d lost so far", self._buffer_size, self.dropped
            )

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Write what is buffered (for at most ``timeout`` seconds), then stop."""
        self._stop.set()
        self._wake.set()
        if self._started:
            self._thread.join(timeout)
        self._engine.dispose()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every row put so far is written; False if that took too long."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                empty = not self._buffer and not self._pending
            if empty:
                return True
            self._hurry.set()
            self._wake.set()
            time.sleep(0.02)  # the polling interval of a bounded wait
        return False

    @property
    def buffered(self) -> int:
        with self._lock:
            return len(self._buffer) + len(self._pending)

    # -- the writer thread --------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            stopping = self._stop.is_set()
            try:
                progressed = self._write_once()
                if time.monotonic() >= self._next_retention and self._schema_ready:
                    self._next_retention = time.monotonic() + self._retention_interval
                    self.enforce_retention()
            except Exception as exc:
                self.errors += 1
                # the schema is checked again before the next try: a table dropped or a
                # database replaced meanwhile is created anew, and the rows go on
                self._schema_ready = False
                now = time.monotonic()
                if self._down_since is None or now - self._last_down_log >= _DOWN_LOG_INTERVAL:
                    self._last_down_log = now
                    log.warning("history database unavailable (%s); %d rows waiting", exc, self.buffered)
                if self._down_since is None:
                    self._down_since = now
                progressed = False
                if stopping:
                    return
                self._stop.wait(self._retry_interval)
                continue
            if self._down_since is not None:
                log.warning(
                    "history database back after %.1fs; %d rows dropped so far",
                    time.monotonic() - self._down_since,
                    self.dropped,
                )
                self._down_since = None
            if stopping and not progressed:
                return
            if not progressed:
                due_in = self._next_batch - time.monotonic() if self._buffer else self._flush_interval
                self._wake.wait(max(0.001, due_in))
                self._wake.clear()

    def _write_once(self) -> bool:
        """Write one batch; True when rows were written."""
        if not self._schema_ready:
            from scheduler.history.schema import ensure_schema

            ensure_schema(self._engine)
            self._schema_ready = True
        if not self._pending:
            if not self._batch_due():
                return False
            with self._lock:
                take = min(self._batch_size, len(self._buffer))
                self._pending = [self._buffer.popleft() for _ in range(take)]
            self._next_batch = time.monotonic() + self._flush_interval
        if not self._pending:
            self._hurry.clear()  # nothing waits: a flush in progress has what it waited for
            return False
        try:
            self._write(self._pending)
        except Exception as exc:
            if not _blames_rows(exc):
                raise
            self._write_apart(exc)
            return True
        with self._lock:
            self.written += len(self._pending)
            self._pending = []
        return True

    def _batch_due(self) -> bool:
        """Whether the rows waiting go now: a full batch of them (a backlog), a flush or a
        close asked for, or ``flush_interval`` passed since the previous batch."""
        return (
            len(self._buffer) >= self._batch_size
            or self._hurry.is_set()
            or self._stop.is_set()
            or time.monotonic() >= self._next_batch
        )

    def _write(self, pending: list[tuple[str, tuple[Any, ...]]]) -> None:
        """``pending`` rows in one transaction."""
        by_table: dict[str, list[tuple[Any, ...]]] = {}
        for table, row in pending:
            by_table.setdefault(table, []).append(row)
        # Straight to the driver: the rows hold plain str, int, float, bool and None, which
        # every driver adapts itself, so SQLAlchemy's per-row parameter processing is not
        # needed. PostgreSQL takes them by binary COPY (under 1 us of client CPU per row
        # against 15 for an executemany); the others by the driver's executemany.
        copy = self._engine.dialect.name == "postgresql"
        with self._engine.begin() as conn:
            for table, rows in by_table.items():
                if copy:
                    self._copy(conn, table, rows)
                    continue
                sql, named = self._insert_sql(table)
                columns = COLUMNS[table]
                conn.exec_driver_sql(sql, [dict(zip(columns, row, strict=True)) for row in rows] if named else rows)

    def _write_apart(self, refused: Exception) -> None:
        """The pending batch was refused for its rows' sake: write it in halves, and those
        in halves again, down to single rows the database refuses, which are dropped.
        Rows keep their order. Any other error ends it, with ``_pending`` holding exactly
        the rows not yet written nor dropped (the loop tries them again)."""
        parts = [self._pending]  # a stack: the next part to write is the last
        error: Exception | None = refused  # the refusal of the part on top, when known
        while parts:
            part = parts.pop()
            if error is None:
                try:
                    self._write(part)
                except Exception as exc:
                    if not _blames_rows(exc):
                        raise
                    error = exc
            if error is not None and len(part) > 1:
                half = len(part) // 2
                parts += (part[half:], part[:half])
                error = None
                continue
            rejected = 0 if error is None else 1
            with self._lock:
                self.written += len(part) - rejected
                self.rejected += rejected
                self._pending = [row for rest in reversed(parts) for row in rest]
            if error is not None:
                self._report_rejected(error, part[0])
            error = None

    def _report_rejected(self, error: Exception, row: tuple[str, tuple[Any, ...]]) -> None:
        callback = self.on_reject
        if callback is not None:
            callback(1)
        now = time.monotonic()
        if now - self._last_reject_log >= _LOSS_LOG_INTERVAL:
            self._last_reject_log = now
            log.warning(
                "history row refused by the database and dropped (%d so far): %s: %s; the row: %r",
                self.rejected, type(error).__name__, error, row,
            )  # fmt: skip

    def _copy(self, conn: Any, table: str, rows: list[tuple[Any, ...]]) -> None:
        """``rows`` into ``table`` by PostgreSQL's binary COPY, inside ``conn``'s transaction.

        Binary, with every column's type given, spares psycopg a dumper lookup per value
        and the text encoding (0.7 against 1.8 us of client CPU per row). The hazard: the
        server takes a binary value only in its column's exact type (an int8 is not an
        int4, and SQLAlchemy's names are not PostgreSQL's), so the types are the ones the
        server reports for the table, read once."""
        statement, types, ranges = self._copy_statement(conn, table)
        with conn.connection.driver_connection.cursor() as cursor, cursor.copy(statement) as copy:
            copy.set_types(types)
            for row in rows:
                for index, bound in ranges:
                    value = row[index]
                    if value is not None and not -bound <= value < bound:
                        raise _OutOfRange(f"{COLUMNS[table][index]} = {value!r} is out of its column's range")
                copy.write_row(row)

    def _copy_statement(self, conn: Any, table: str) -> _CopyPlan:
        """``table``'s COPY statement, its columns' type OIDs, and (index, bound) of its
        integer columns."""
        found = self._copies.get(table)
        if found is None:
            name = _table(table).name
            columns = COLUMNS[table]
            oids = dict(
                conn.exec_driver_sql(
                    "SELECT attname, atttypid FROM pg_attribute"
                    " WHERE attrelid = %(table)s::regclass AND attnum > 0 AND NOT attisdropped",
                    {"table": name},
                ).all()
            )
            statement = f"COPY {name} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)"
            types = [int(oids[column]) for column in columns]
            ranges = [(index, _INT_BOUNDS[oid]) for index, oid in enumerate(types) if oid in _INT_BOUNDS]
            found = self._copies[table] = (statement, types, ranges)
        return found

    def _insert_sql(self, table: str) -> tuple[str, bool]:
        """The INSERT of ``table`` in the engine's dialect, and whether its parameters are
        named (then each row goes as a dict); positional ones follow ``COLUMNS[table]``."""
        found = self._inserts.get(table)
        if found is None:
            columns = COLUMNS[table]
            compiled = _table(table).insert().compile(dialect=self._engine.dialect, column_keys=list(columns))
            positions = compiled.positiontup
            if positions is not None and tuple(positions) != columns:
                raise AssertionError(f"the INSERT of {table} orders its parameters {positions}, not {columns}")
            found = self._inserts[table] = (compiled.string, positions is None)
        return found

    def enforce_retention(self) -> int:
        """Delete rows older than ``max_age`` and beyond ``max_rows`` per table; the number
        deleted."""
        import sqlalchemy as sa

        from scheduler.history.schema import ensure_schema, executions, status_trace

        if not self._schema_ready:
            ensure_schema(self._engine)
            self._schema_ready = True
        deleted = 0
        with self._engine.begin() as conn:
            for table, stamp in ((executions, executions.c.start_time), (status_trace, status_trace.c.creation_time)):
                if self.max_age is not None:
                    cutoff = time.time() - self.max_age
                    deleted += conn.execute(table.delete().where(stamp < cutoff)).rowcount or 0
                if self.max_rows is not None:
                    keep_from = conn.execute(
                        sa.select(table.c.id).order_by(table.c.id.desc()).offset(self.max_rows - 1).limit(1)
                    ).scalar()
                    if keep_from is not None:
                        deleted += conn.execute(table.delete().where(table.c.id < keep_from)).rowcount or 0
        if deleted:
            log.info("history retention removed %d rows", deleted)
        return deleted
