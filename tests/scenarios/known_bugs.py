"""Product bugs the chaos scenarios found, and how to recognise each in a failed run.

A scenario that fails is checked against these signatures (the workers' own log lines and
records). When every problem of the run is accounted for by one of them, the scenario
raises :class:`KnownBugFailure` instead of a plain ``AssertionError``; the tests mark the
affected scenarios ``xfail(raises=KnownBugFailure)``, so a run that fails for any *other*
reason — an overlap above all, which nothing here ever excuses — still fails.

Invariant: a signature is specific: it names the log lines the buggy code path writes and
ties them to the very (item, fire) pairs or workers that went wrong, never "some error".
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Protocol

from tests.scenarios.checks import Record


class Worker(Protocol):
    """What a diagnosis needs of a worker (``tests.scenarios.workers.Worker`` has it)."""

    @property
    def instance_id(self) -> str: ...

    @property
    def stderr_file(self) -> Path: ...


__all__ = [
    "BUG_OWED_REPLAY",
    "BUG_REFUSED_DROPPED",
    "BUG_STALE_MARK",
    "KNOWN_BUGS",
    "SUMMARIES",
    "Diagnosis",
    "KnownBugFailure",
    "diagnose",
    "stuck_on_own_mark",
]

BUG_STALE_MARK = "stale-running-mark"
BUG_REFUSED_DROPPED = "refused-fire-dropped"
BUG_OWED_REPLAY = "owed-replay-after-lost-session"

KNOWN_BUGS = {
    BUG_STALE_MARK: (
        "sharding/service.py ShardingService.mark_running/clear_running: a running-mark write "
        "whose outcome is unknown is never reconciled. Either the mark's removal fails (the "
        "connection lost with it in flight; clear_running only logs 'it goes with the "
        "session') or the fenced transaction creating it fails 'outcome unknown' although "
        "the server applied it. The session survives (and with failover the mark is "
        "persistent anyway), so the mark stays: every later mark_running fails 'already "
        "running' and the worker never runs again (a resharding would wait on that mark "
        "forever too). The instance should remove its own mark, at its version, when it "
        "runs nothing and the session is back"
    ),
    BUG_REFUSED_DROPPED: (
        "scheduler/runner.py JobRunner.fire: a fire whose fenced mark fails with 'registry "
        "unavailable' (outcome unknown, e.g. a transaction stuck on a dead cluster member "
        "until its deadline) is logged 'resynchronising' and dropped, not owed: with "
        "failover on and the session alive, invariant 2 breaks"
    ),
    BUG_OWED_REPLAY: (
        "scheduler/runner.py JobRunner._owe/resume: fires owed while the session was down "
        "are replayed after the session was LOST and the instance registered again, as "
        "regular runs of the NEW assignment's items; their owners at those fires (and the "
        "failover queue) already ran them: the same (item, fire) gets a second regular run "
        "on another instance. Owed fires should be dropped on LOST (failover covers them) "
        "and replayed on RECONNECTED with the assignment they were due under"
    ),
}

#: one line each, for xfail reasons and tables
SUMMARIES = {
    BUG_STALE_MARK: "a running mark written or removed with an unknown outcome stays for good: "
    "the worker refuses every run 'already running'",
    BUG_REFUSED_DROPPED: "runner.fire drops a fire whose fenced mark failed with 'registry unavailable'",
    BUG_OWED_REPLAY: "fires owed across a LOST session are replayed under the new assignment: "
    "a second regular run of the same (item, fire)",
}

#: what each bug may account for: kinds of problem (see ``ChaosRun.finish``)
_EXCUSES = {
    BUG_STALE_MARK: {"missed", "stalled"},
    BUG_REFUSED_DROPPED: {"missed"},
    BUG_OWED_REPLAY: {"doubled"},
}

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ", re.MULTILINE)


class KnownBugFailure(AssertionError):
    """A scenario failed only in ways ``KNOWN_BUGS`` account for (module docstring)."""


@dataclass
class Diagnosis:
    #: bug key -> what showed it
    found: dict[str, list[str]] = field(default_factory=dict)

    def add(self, bug: str, evidence: str) -> None:
        self.found.setdefault(bug, []).append(evidence)

    def excuses(self, kind: str) -> str | None:
        """The bug found that accounts for a problem of ``kind``, if any."""
        for bug in self.found:
            if kind in _EXCUSES[bug]:
                return bug
        return None


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def _stamped_lines(text: str, needle: str) -> list[float]:
    """The log times of the lines of ``text`` containing ``needle``."""
    times = []
    for line in text.splitlines():
        if needle in line:
            match = _STAMP.match(line)
            if match:
                times.append(datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return times


#: the log lines of a running-mark write whose outcome the worker could not know
_UNKNOWN_MARK_WRITES = ("clearing the running mark failed", "run refused, registry unavailable")


def stuck_on_own_mark(workers: Iterable[Worker]) -> list[str]:
    """Workers showing ``BUG_STALE_MARK``: a write of their running mark ended with an
    unknown outcome, and since then at least two runs were refused 'already running'."""
    stuck = []
    for worker in workers:
        text = _read(worker.stderr_file)
        unknown = [at for at in (text.find(line) for line in _UNKNOWN_MARK_WRITES) if at >= 0]
        if unknown and text.count("run refused, already running", min(unknown)) >= 2:
            stuck.append(worker.instance_id)
    return stuck


def diagnose(
    workers: Sequence[Worker],
    records: Sequence[Record],
    missed: Sequence[tuple[int, float]],
    doubled: Sequence[tuple[int, float]],
    *,
    connect_timeout: float = 5.0,
) -> Diagnosis:
    """Which known bugs account for what went wrong: ``missed`` pairs, ``doubled`` pairs
    (more than one regular run), a worker stuck behind its own mark."""
    found = Diagnosis()
    logs = {w.instance_id: _read(w.stderr_file) for w in workers}
    for iid in stuck_on_own_mark(workers):
        found.add(BUG_STALE_MARK, f"{iid} refuses every run behind its own running mark")

    ran = {(r.instance, r.fire_time) for r in records}
    # fires a worker dropped: refused as 'registry unavailable' (the log line names no
    # fire: the fire is the one it was marking, at most connect_timeout before) and never
    # run by that worker
    dropped: dict[float, tuple[str, str]] = {}
    for iid, text in logs.items():
        for refused_at in _stamped_lines(text, "run refused, registry unavailable"):
            for fire in {f for _, f in missed}:
                if fire <= refused_at <= fire + connect_timeout + 1 and (iid, fire) not in ran:
                    dropped.setdefault(fire, (BUG_REFUSED_DROPPED, iid))
    if missed and all(fire in dropped for _, fire in missed):
        for fire in sorted({f for _, f in missed}):
            bug, iid = dropped[fire]
            found.add(bug, f"{iid} dropped fire {fire:.0f}")

    # a regular re-run of a pair by a worker replaying an owed fire after a lost session
    by_pair: dict[tuple[int, float], list[Record]] = defaultdict(list)
    for rec in records:
        if not rec.failover:
            by_pair[(rec.item, rec.fire_time)].append(rec)
    replayed = []
    for item, fire in doubled:
        later = sorted(by_pair[(item, fire)], key=lambda r: r.start)[1:]
        for rec in later:
            text = logs.get(rec.instance, "")
            replay = text.find(f"running owed fire {fire:.3f} now")
            if replay >= 0 and "session lost" in text[:replay]:
                replayed.append((item, fire))
                break
    if doubled and len(replayed) == len(doubled):
        found.add(BUG_OWED_REPLAY, f"pairs {sorted(replayed)} replayed as owed fires after a lost session")
    return found
