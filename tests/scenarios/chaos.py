"""Fault injection, pass criteria and the report of the chaos scenarios (``test_chaos.py``).

A :class:`ChaosRun` drives one scenario: a fleet of real ``shardjob worker`` processes on one
job, an *observer* client of the test's own in the job's namespace (to find the leader, a
running mark, the assignment — never to steer the workers), and the fault the test
injects. ``finish`` then applies the criteria every scenario shares, over the executions
the workers recorded themselves:

- no two instances ran the same item at the same moment (``overlapping_runs``);
- no (item, fire) had more than one regular run — a failover re-run of a pair that already
  ran is allowed, at least once (``doubled_beyond_failover``);
- with failover on, every (item, fire) from the settled fire before the fault to the fire
  at which the cluster is whole again ran at least once (``missed_pairs``);
- no worker is stuck: every live worker runs items again at the end, and exits 0 on SIGTERM;
- the recovery time: from the fault to the moment the first later fire had all its items
  started on surviving instances, divided by the session timeout.

Each outcome becomes one :class:`ChaosResult`, appended to ``RESULTS`` (carried by the
test's report to the process that prints the table at the end of the run, see
``tests/scenarios/chaos_report.py``) and, when the environment
variable ``SHARDJOB_CHAOS_REPORT`` names a file, written to it as one JSON line (the input
of ``docs/guarantees.md``). The result is recorded *before* the test asserts on it, so a
failing scenario is in the report too.

Faults beyond the fleet's own signals: :class:`StallingProxy`, a ``TCPProxy`` that can also
hold bytes in flight, then drop them with a reset (a request lost with its outcome unknown).

Invariants: every wait is bounded (``tests.waiting.wait_for``); a wait that runs out
becomes a named problem in the result, not a hang; the only deliberate waits are the
faults' own durations (a pause, a cut), each an ``Event.wait`` saying so.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from registry.errors import RegistryError
from registry.protocol import RegistryCenter
from sharding.assignment import Assignment, CorruptNodeError
from sharding.layout import JobPaths
from tests.scenarios.checks import (
    Record,
    by_fire,
    doubled_beyond_failover,
    failover_reruns,
    missed_pairs,
    overlapping_runs,
    recovery_point,
)
from tests.scenarios.workers import Fleet, Worker
from tests.servers.proxy import TCPProxy, _reset
from tests.waiting import wait_for

__all__ = [
    "HOLD",
    "JOB",
    "REPORT_ENV",
    "RESULTS",
    "SESSION_TIMEOUT",
    "TOTAL",
    "ChaosResult",
    "ChaosRun",
    "StallingProxy",
    "assert_passed",
    "deliberate_wait",
    "format_table",
    "record_result",
    "subtree_paths",
]

REPORT_ENV = "SHARDJOB_CHAOS_REPORT"
SESSION_TIMEOUT = 2.0
TOTAL = 6
#: each item stays busy this long: a fault lands mid-run often, and runs stay short
HOLD = 0.2
JOB = "job"
#: the cron period of ``"* * * * * ?"``
PERIOD = 1.0
#: fires past the first whole one after a fault that still belong to the checked window
SETTLE_FIRES = 2

#: every scenario's result in this test session, in the order they ran
RESULTS: list[ChaosResult] = []


def deliberate_wait(seconds: float) -> None:
    """The fault's own duration (a SIGSTOP, a network cut): the scenario is *defined* by
    how long it lasts, so this is the one wait that is not on a condition."""
    threading.Event().wait(seconds)


@dataclass
class ChaosResult:
    """One scenario's outcome: a row of the report."""

    scenario: str
    fault: str
    backend: str
    failover: bool
    session_timeout: float
    #: fault -> the first later fire with every item started on surviving instances
    recovery_s: float | None = None
    #: the same, counting regular runs only (the cluster back to normal, not catching up)
    regular_recovery_s: float | None = None
    overlaps: list[str] = field(default_factory=list)
    doubled: list[str] = field(default_factory=list)
    reruns: list[str] = field(default_factory=list)
    missed: list[tuple[int, float]] = field(default_factory=list)
    window: tuple[float, float] | None = None
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    #: problem -> its kind ("missed", "stalled", "doubled", or the check that found it)
    kinds: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    runs: int = 0

    def problem(self, kind: str, text: str) -> None:
        self.problems.append(text)
        self.kinds[text] = kind

    @property
    def recovery_per_timeout(self) -> float | None:
        return None if self.recovery_s is None else self.recovery_s / self.session_timeout

    @property
    def passed(self) -> bool:
        return not self.problems

    def to_json(self) -> str:
        doc: dict[str, Any] = asdict(self)
        doc["recovery_per_timeout"] = self.recovery_per_timeout
        doc["regular_recovery_per_timeout"] = (
            None if self.regular_recovery_s is None else self.regular_recovery_s / self.session_timeout
        )
        doc["overlap_count"] = len(self.overlaps)
        doc["doubled_count"] = len(self.doubled)
        doc["rerun_count"] = len(self.reruns)
        doc["missed_count"] = len(self.missed)
        doc["passed"] = self.passed
        return json.dumps(doc, sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> ChaosResult:
        """The result ``to_json`` wrote (its derived figures recomputed, not read)."""
        doc = json.loads(line)
        kept = {name: doc[name] for name in cls.__dataclass_fields__ if name in doc}
        kept["missed"] = [tuple(pair) for pair in kept.get("missed", [])]
        if kept.get("window") is not None:
            kept["window"] = tuple(kept["window"])
        return cls(**kept)

    def describe(self) -> str:
        lines = [f"{self.scenario} on {self.backend} (failover {'on' if self.failover else 'off'}):"]
        lines += [f"  problem: {p}" for p in self.problems]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def assert_passed(result: ChaosResult) -> None:
    """Pass, or fail naming every problem of the run."""
    if not result.passed:
        raise AssertionError(result.describe())


def record_result(result: ChaosResult) -> None:
    RESULTS.append(result)
    target = os.environ.get(REPORT_ENV)
    if target:
        with open(target, "a", encoding="utf-8") as out:
            out.write(result.to_json() + "\n")


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def format_table(results: Sequence[ChaosResult]) -> str:
    header = ("scenario", "fault", "backend", "failover", "recovery/timeout", "overlaps", "missed", "result")
    rows = [
        (
            r.scenario,
            r.fault,
            r.backend,
            "on" if r.failover else "off",
            _ratio(r.recovery_per_timeout),
            str(len(r.overlaps)),
            str(len(r.missed)),
            "ok" if r.passed else "FAIL",
        )
        for r in results
    ]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    out = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in (header, *rows)]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def subtree_paths(reg: RegistryCenter, root: str) -> set[str]:
    """Every node below ``root`` (``root`` itself included when it exists)."""
    found: set[str] = set()
    pending = [root]
    while pending:
        path = pending.pop()
        if not reg.exists(path):
            continue
        found.add(path)
        pending.extend(f"{path.rstrip('/')}/{child}" for child in reg.children(path))
    return found


class StallingProxy(TCPProxy):
    """A :class:`TCPProxy` that can also *stall*: connections stay open but no byte moves
    either way, so whatever a client sent meanwhile is in flight with no answer. ``cut()``
    then resets every connection and drops the held bytes: requests lost in flight, whose
    outcome the client cannot know. ``restore()`` lets bytes flow again."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.flowing = threading.Event()
        self.flowing.set()
        self.generation = 0
        self._counts = threading.Lock()
        #: (time.time() when held, bytes) of each request chunk a stall held
        self.held_requests: list[tuple[float, int]] = []
        #: request bytes a cut dropped while they were held
        self.dropped_request_bytes = 0
        super().__init__(target_host, target_port)

    def note_held(self, size: int) -> None:
        with self._counts:
            self.held_requests.append((time.time(), size))

    def note_dropped(self, size: int) -> None:
        with self._counts:
            self.dropped_request_bytes += size

    def held_since(self, moment: float) -> int:
        """Request bytes held by a stall from ``moment`` on."""
        with self._counts:
            return sum(size for at, size in self.held_requests if at >= moment)

    def stall(self) -> None:
        self.flowing.clear()

    def cut(self) -> None:
        self.generation += 1
        super().cut()

    def restore(self) -> None:
        super().restore()
        self.flowing.set()

    def _pump(self, pair: Any, src: socket.socket, dst: socket.socket) -> None:
        """Forward ``src`` to ``dst``; while stalled, keep reading and hold what arrives
        (each request chunk noted with its time), send it on ``restore()``, drop it on
        ``cut()``. Reading on while stalled is what lets a test see *which* request is
        held, not only the first one."""
        request = dst is pair.upstream
        generation = self.generation
        held: list[bytes] = []
        try:
            while True:
                if self.generation != generation:
                    raise ConnectionResetError("link cut while stalled")
                if held and self.flowing.is_set():
                    dst.sendall(b"".join(held))
                    held.clear()
                # a short poll, so a stall's end or a cut is noticed without new bytes
                ready, _, _ = select.select(
                    [src], [], [], 0.005 if held or not self.flowing.is_set() else 0.05
                )
                if not ready:
                    continue
                data = src.recv(65536)
                if not data:
                    break
                if self.flowing.is_set() and not held:
                    dst.sendall(data)
                else:
                    held.append(data)
                    if request:
                        self.note_held(len(data))
        except (OSError, ValueError):  # ValueError: select on a socket the cut closed
            if request and held:
                self.note_dropped(sum(len(chunk) for chunk in held))
            with self._lock:
                self._pairs.discard(pair)
            _reset(pair.client)
            _reset(pair.upstream)
            return
        if held:  # an end while stalled: what was held goes first once flowing
            # a cut shows up here as an end of input too (it shuts our sockets): the
            # generation, not the flow, says whether the held bytes were dropped
            while self.generation == generation and not self.flowing.wait(0.005):
                pass
            if self.generation != generation:
                if request:
                    self.note_dropped(sum(len(chunk) for chunk in held))
                return
            with contextlib.suppress(OSError):
                dst.sendall(b"".join(held))
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
        with self._lock:
            pair.finished += 1
            done = pair.finished == 2
            if done:
                self._pairs.discard(pair)
        if done:
            for sock in (pair.client, pair.upstream):
                with contextlib.suppress(OSError):
                    sock.close()


def _count(pattern: str, text: str) -> int:
    return len(re.findall(pattern, text, flags=re.MULTILINE))


class ChaosRun:
    """One scenario: its fleet, its observer, its timeline and its verdict."""

    def __init__(
        self,
        scenario: str,
        fault: str,
        backend: str,
        fleet: Fleet,
        observer: RegistryCenter,
        *,
        failover: bool,
        total: int = TOTAL,
        session_timeout: float = SESSION_TIMEOUT,
    ) -> None:
        self.scenario = scenario
        self.fault = fault
        self.backend = backend
        self.fleet = fleet
        self.observer = observer
        self.failover = failover
        self.total = total
        self.session_timeout = session_timeout
        self.paths = JobPaths(fleet.job)
        self.window_start: float | None = None
        self.notes: list[str] = []

    # -- the registry, as the observer sees it -----------------------------------------
    def leader(self, timeout: float = 20.0) -> str:
        """The instance id in ``leader/election/instance``."""

        def read() -> str | None:
            try:
                raw = self.observer.get(self.paths.leader)
            except RegistryError:
                return None
            return None if raw is None else raw.decode()

        found = wait_for(read, timeout, interval=0.05, message=lambda: f"no leader:\n{self.fleet.describe()}")
        assert found is not None
        return found

    def assignment(self) -> Assignment | None:
        """The assignment node decoded; None when absent or corrupt."""
        raw = self.observer.get(self.paths.assignment)
        if raw is None:
            return None
        try:
            return Assignment.decode(self.paths.assignment, raw)
        except CorruptNodeError:
            return None

    def wait_running(self, worker: Worker, timeout: float = 15.0) -> None:
        """Until ``worker``'s running mark is in the registry: its items are running now
        (the mark is written just before they start and removed when the last ends)."""
        path = self.paths.running_of(worker.instance_id)
        wait_for(
            lambda: self.observer.exists(path),
            timeout,
            interval=0.005,
            message=lambda: f"{worker.instance_id} never ran:\n{worker.describe()}",
        )

    def wait_between_runs(self, worker: Worker, timeout: float = 15.0) -> None:
        """Until ``worker`` has just finished a run (its mark came and went): it holds no
        item for most of a second."""
        self.wait_running(worker, timeout)
        path = self.paths.running_of(worker.instance_id)
        wait_for(
            lambda: not self.observer.exists(path),
            timeout,
            interval=0.005,
            message=lambda: f"{worker.instance_id} never finished its run:\n{worker.describe()}",
        )

    def wait_session_expired(self, worker: Worker, timeout: float) -> float:
        """Until the server has dropped ``worker``'s registration (its ephemeral instance
        node, ZooKeeper's session or etcd's lease gone), while the worker is paused or cut
        off; returns when. Fails with "fault did not land" otherwise: a scenario about an
        expired session must not judge recovery from one that never expired."""
        path = self.paths.instance(worker.instance_id)

        def gone() -> bool:
            try:
                return not self.observer.exists(path)
            except RegistryError:
                return False

        try:
            wait_for(gone, timeout, interval=0.02)
        except AssertionError:
            raise AssertionError(
                f"fault did not land: {worker.instance_id}'s registration {path} still there "
                f"{timeout:g}s into the fault (session not expired)"
            ) from None
        return time.time()

    # -- phases -----------------------------------------------------------------------
    def live_ids(self) -> set[str]:
        return {w.instance_id for w in self.fleet.alive()}

    def _whole_fire(self, records: Iterable[Record], after: float, instances: set[str]) -> float | None:
        """The first fire later than ``after`` at which each item had exactly one regular
        run and ``instances`` (no fewer, no more) ran them."""
        table: dict[float, list[Record]] = {}
        for rec in records:
            if rec.fire_time > after and not rec.failover:
                table.setdefault(rec.fire_time, []).append(rec)
        for fire in sorted(table):
            runs = table[fire]
            items = sorted(r.item for r in runs)
            if items == list(range(self.total)) and {r.instance for r in runs} == instances:
                return fire
        return None

    def settle(self, timeout: float = 30.0, extra_fires: int = 2) -> float:
        """The first fire at which every live worker ran its share and each item ran once;
        returns it (the window's start) once ``extra_fires`` more fires ran too."""
        live = self.live_ids()
        first = wait_for(
            lambda: self._whole_fire(self.fleet.records(), 0.0, live),
            timeout,
            interval=0.1,
            message=lambda: f"the cluster never settled on {sorted(live)}:\n{self.fleet.describe()}",
        )
        assert first is not None
        last = first + extra_fires * PERIOD
        wait_for(
            lambda: any(r.fire_time >= last for r in self.fleet.records()),
            timeout,
            interval=0.05,
            message=lambda: f"fire {last:.0f} never ran:\n{self.fleet.describe()}",
        )
        self.window_start = first
        return first

    def finish(
        self,
        fault_at: float,
        fault_end: float,
        *,
        dead: Iterable[str] = (),
        recovery_timeout: float = 20.0,
        extra_checks: Callable[[ChaosResult, list[Record]], None] | None = None,
    ) -> ChaosResult:
        """Apply the shared criteria (module docstring), stop the fleet, record the result."""
        dead_ids = set(dead)
        result = ChaosResult(self.scenario, self.fault, self.backend, self.failover, self.session_timeout)
        result.notes.extend(self.notes)
        live = self.live_ids() - dead_ids
        problems = result.problems

        def attempt(what: str, wait: Callable[[], object], kind: str = "stalled") -> bool:
            try:
                wait()
                return True
            except AssertionError as exc:
                result.problem(kind, f"{what}: {str(exc).splitlines()[0]}")
                return False

        # the cluster whole again: a fire after the fault ended, every item once, on every
        # live worker (a paused or cut-off worker must be back in the spread)
        whole: list[float] = []

        def cluster_whole() -> bool:
            found = self._whole_fire(self.fleet.records(), fault_end, live)
            if found is not None:
                whole.append(found)
            return found is not None

        whole_again = attempt(
            f"no fire ran every item on every live worker {sorted(live)} within {recovery_timeout:g}s",
            lambda: wait_for(cluster_whole, recovery_timeout, 0.1),
        ) and bool(whole)
        start = self.window_start if self.window_start is not None else fault_at - 3 * PERIOD
        # the settle point: a few fires past the cluster's first whole fire, so that fires
        # delayed or coalesced by the recovery itself fall inside the window
        end = (
            whole[0] + SETTLE_FIRES * PERIOD
            if whole
            else max((r.fire_time for r in self.fleet.records()), default=start)
        )
        window = [start + k * PERIOD for k in range(round((end - start) / PERIOD) + 1)]
        result.window = (start, end)
        # the window's regular runs are over once a later fire ran
        attempt(
            "no fire after the window",
            lambda: wait_for(
                lambda: any(r.fire_time > end for r in self.fleet.records()), 15.0, interval=0.1
            ),
        )

        if self.failover and whole_again:
            # failover work drains after the new assignment: wait (bounded) for it
            attempt(
                "failover never covered the window",
                lambda: wait_for(
                    lambda: not missed_pairs(self.fleet.records(), window, self.total), 10.0, interval=0.1
                ),
                kind="missed",
            )

        # nobody stuck: every live worker starts items again from here on
        alive_workers = [w for w in self.fleet.alive() if w.instance_id not in dead_ids]
        checked_at = time.time()
        for worker in alive_workers:
            attempt(
                f"{worker.instance_id} stuck (no run started after the window)",
                _runs_again(worker, checked_at, 5.0),
            )

        records = self.fleet.records()
        result.runs = len(records)
        result.overlaps = overlapping_runs(records)
        result.doubled = doubled_beyond_failover(records)
        result.reruns = failover_reruns(records)
        result.missed = missed_pairs(records, window, self.total)
        recovered = recovery_point(records, fault_at, self.total, exclude=dead_ids)
        if recovered is not None:
            result.recovery_s = recovered[1] - fault_at
        regular = recovery_point(records, fault_at, self.total, exclude=dead_ids, regular_only=True)
        if regular is not None:
            result.regular_recovery_s = regular[1] - fault_at
        problems.extend(f"overlap: {o}" for o in result.overlaps)
        for text in result.doubled:
            result.problem("doubled", f"doubled: {text}")
        if self.failover and result.missed:
            result.problem(
                "missed", f"{len(result.missed)} (item, fire) pair(s) never ran: {result.missed[:12]}"
            )
        if recovered is None:
            result.problem("stalled", "full coverage never came back after the fault")
        if extra_checks is not None:
            extra_checks(result, records)

        for worker in self.fleet.workers:
            if worker.instance_id in dead_ids:
                continue
            if not worker.alive:
                problems.append(f"{worker.instance_id} exited on its own (code {worker.proc.poll()})")
        # SIGTERM to all at once, then each exit awaited (bounded; a hung one dumps its stacks)
        stopping = self.fleet.alive()
        for worker in stopping:
            worker.send(signal.SIGTERM)
        for worker in stopping:
            try:
                result.exit_codes[worker.instance_id] = worker.terminate(timeout=20.0)
            except AssertionError as exc:
                result.exit_codes[worker.instance_id] = None
                problems.append(f"shutdown: {str(exc).splitlines()[0]} (stacks in its stderr)")
        problems.extend(
            f"{iid} exited {code} on SIGTERM"
            for iid, code in result.exit_codes.items()
            if code not in (0, None)
        )
        for worker in self.fleet.workers:
            if worker.instance_id in dead_ids:
                continue
            text = worker.stderr_file.read_text(encoding="utf-8", errors="replace")
            tracebacks, errors = _count(r"^Traceback", text), _count(r" ERROR ", text)
            if tracebacks or errors:
                result.notes.append(
                    f"{worker.instance_id}: {errors} ERROR line(s), {tracebacks} traceback(s)"
                )
        if result.reruns:
            result.notes.append(f"{len(result.reruns)} pair(s) re-run by failover (allowed)")
        if problems:
            result.notes.append(f"worker files: {self.fleet.workdir}")
            result.notes.append(f"timeline:\n{timeline(records, start - 1, end + 1)}")
        record_result(result)
        return result


def _runs_again(worker: Worker, since: float, timeout: float) -> Callable[[], object]:
    return lambda: wait_for(lambda: any(r.start > since for r in worker.records()), timeout, interval=0.1)


def timeline(records: Iterable[Record], first: float, last: float) -> str:
    """fire -> item -> who ran it (f: failover) — for a failure message."""
    table = by_fire(records)
    kinds = {(r.fire_time, r.item, r.instance): r.failover for r in records}
    lines = []
    for fire in sorted(f for f in table if first <= f <= last):
        cells = []
        for item in sorted(table[fire]):
            who = ",".join(
                iid.rsplit("@-@", 1)[-1] + ("(f)" if kinds.get((fire, item, iid)) else "")
                for iid in table[fire][item]
            )
            cells.append(f"{item}:{who}")
        lines.append(f"    {fire:.0f}  " + " ".join(cells))
    return "\n".join(lines)


def worker_logs_name(workers: Iterable[Worker], text: str) -> list[str]:
    """The instance ids of ``workers`` whose stderr mentions ``text``."""
    named = []
    for worker in workers:
        try:
            content = Path(worker.stderr_file).read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            continue
        if text in content:
            named.append(worker.instance_id)
    return named
