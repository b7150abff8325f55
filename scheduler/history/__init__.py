"""Run history: every item run and every state change of a run, in a database chosen by
URL (``sqlite:///path`` embedded, ``postgresql://...`` for a fleet), written in the
background, never in a fire's way; and the typed API to read it back.

``Scheduler(url, history="sqlite:///runs.db")`` turns it on; ``HistoryReader(db_url)``
reads it. Needs the ``history`` extra (and ``postgresql`` for PostgreSQL).
"""

from scheduler.history.engine import HistoryUnavailable
from scheduler.history.query import Execution, HistoryReader, StatusTrace
from scheduler.history.recorder import HistoryRecorder
from scheduler.history.writer import HistoryWriter

__all__ = ["Execution", "HistoryReader", "HistoryRecorder", "HistoryUnavailable", "HistoryWriter", "StatusTrace"]
