"""Chaos scenarios: real ``shardjob worker`` processes killed, paused, cut off from the
registry, and the registry itself restarted or losing a member — on ZooKeeper and etcd.

Every scenario runs three workers (``session_timeout=2``) of one job firing every second
with 6 items held 0.2 s each, records every execution in the workers themselves, injects
one fault and then holds the workers to the criteria of ``tests/scenarios/chaos.py``:
no item ever runs on two instances at once, no (item, fire) has two regular runs (a
failover re-run is allowed), with failover on every (item, fire) of the window ran, no
worker is left stuck and every survivor exits 0 on SIGTERM. Each scenario's outcome —
recovery time over session timeout, overlaps, missed pairs — is a row of the report
(``SHARDJOB_CHAOS_REPORT``) and of the table printed at the end of the run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import registry
from registry.protocol import Event, EventKind, RegistryCenter
from sharding.assignment import Assignment, AssignmentState, CorruptNodeError
from sharding.failover import RunTrace
from tests.harnesses.common import build_url
from tests.scenarios.chaos import (
    HOLD,
    JOB,
    SESSION_TIMEOUT,
    TOTAL,
    ChaosResult,
    ChaosRun,
    StallingProxy,
    assert_passed,
    deliberate_wait,
    subtree_paths,
)
from tests.scenarios.chaos import worker_logs_name as logs_naming
from tests.scenarios.checks import (
    Record,
    doubled_beyond_failover,
    failover_reruns,
    missed_pairs,
    recovery_point,
)
from tests.scenarios.workers import REPO_ROOT, Fleet
from tests.servers.env import parse_hosts
from tests.servers.proxy import TCPProxy
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

BACKENDS = ("zookeeper", "etcd")
_SCHEMES = {"zookeeper": "zk", "etcd": "etcd"}
_SERVERS = {"zookeeper": "zk_server", "etcd": "etcd_server"}
_CLUSTERS = {"zookeeper": "zk_ensemble", "etcd": "etcd_cluster"}
#: the observer outlives every fault it watches (a restart, a member's death)
OBSERVER_TIMEOUT = 10


def instance_ids(prefix: str, count: int) -> list[str]:
    return [f"127.0.0.1@-@{prefix}-{k + 1}" for k in range(count)]


class Stage:
    """One backend (a single server or a 3-node cluster) and everything a scenario
    started on it: fleets, observers, proxies — all released by ``close``."""

    def __init__(self, backend: str, address: str, workdir: Path, server: Any = None) -> None:
        self.backend = backend
        self.address = address
        self.server = server
        self.workdir = workdir
        self.namespace = "/chaos" + uuid.uuid4().hex[:10]
        self._fleets: list[Fleet] = []
        self._observers: list[RegistryCenter] = []
        self._proxies: list[TCPProxy] = []

    def url(self, address: str | None = None, session_timeout: float = SESSION_TIMEOUT) -> str:
        return build_url(
            _SCHEMES[self.backend], address or self.address, self.namespace, session_timeout=session_timeout
        )

    def run(
        self, scenario: str, fault: str, *, failover: bool, session_timeout: float = SESSION_TIMEOUT
    ) -> ChaosRun:
        fleet = Fleet(
            self.url(session_timeout=session_timeout),
            self.workdir,
            job=JOB,
            total=TOTAL,
            hold=HOLD,
            extra_args=["--failover"] if failover else [],
        )
        self._fleets.append(fleet)
        observer = registry.connect(self.url(session_timeout=OBSERVER_TIMEOUT))
        self._observers.append(observer)
        return ChaosRun(
            scenario, fault, self.backend, fleet, observer, failover=failover, session_timeout=session_timeout
        )

    def proxy(self) -> TCPProxy:
        """A severable path to the (first) server."""
        host, port = parse_hosts(self.address)[0]
        made = TCPProxy(host, port)
        self._proxies.append(made)
        return made

    def stalling_proxy(self) -> StallingProxy:
        """A path to the (first) server that can hold bytes in flight, then drop them."""
        host, port = parse_hosts(self.address)[0]
        made = StallingProxy(host, port)
        self._proxies.append(made)
        return made

    def close(self) -> None:
        for proxy in self._proxies:
            proxy.restore()
        for fleet in self._fleets:
            fleet.close()
        for observer in self._observers:
            try:
                observer.close()
            except Exception:
                pass
        for proxy in self._proxies:
            proxy.close()


@pytest.fixture(params=BACKENDS)
def stage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stage]:
    """A single ZooKeeper or etcd server (the session's, shared with other tests)."""
    server = request.getfixturevalue(_SERVERS[request.param])
    made = Stage(request.param, server.address, tmp_path, server)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(params=BACKENDS)
def cluster_stage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stage]:
    """A 3-node ZooKeeper ensemble or etcd cluster; workers get the comma list."""
    cluster = request.getfixturevalue(_CLUSTERS[request.param])
    made = Stage(request.param, cluster.address, tmp_path, cluster)
    try:
        yield made
    finally:
        made.close()


# -- 1. SIGKILL of a worker while it runs items ----------------------------------------
@pytest.mark.parametrize("failover", [True, False], ids=["failover", "no-failover"])
def test_sigkill_of_a_worker_mid_run(stage: Stage, failover: bool) -> None:
    run = stage.run("sigkill", "SIGKILL of a worker mid-run", failover=failover)
    run.fleet.start(*instance_ids("k", 3))
    run.settle()
    leader = run.leader()
    victim = next(w for w in run.fleet.workers if w.instance_id != leader)
    run.wait_running(victim)
    fault_at = time.time()
    victim.kill()
    assert_passed(run.finish(fault_at, fault_at, dead={victim.instance_id}))


# -- 2. SIGKILL of the leader during a resharding --------------------------------------
#: joins tried before the leader-kill scenario gives up on killing mid-resharding
LEADER_KILL_ATTEMPTS = 4


def test_sigkill_of_the_leader_during_a_resharding(stage: Stage) -> None:
    """A worker joins; the leader is SIGKILLed as soon as the observer sees the resharding
    begin (the flag or the fenced assignment). A kill that came after the new epoch was
    written is not this fault: the scenario settles and tries again with another join,
    and fails with "fault did not land" after ``LEADER_KILL_ATTEMPTS``."""
    run = stage.run("leader-kill", "SIGKILL of the leader as a 4th worker joins", failover=True)
    run.fleet.start(*instance_ids("l", 3))
    paths = run.paths
    dead: set[str] = set()
    fault: list[float] = []
    for attempt in range(1, LEADER_KILL_ATTEMPTS + 1):
        run.settle()
        leader_id = run.leader()
        leader = run.fleet.worker(leader_id)
        before = run.assignment()
        assert before is not None
        killed = threading.Event()
        fault.clear()

        def on_change(
            event: Event, before: Assignment = before, leader: Any = leader, killed: Any = killed
        ) -> None:
            # the resharding begins when the leader flags it or fences the assignment: kill
            # the leader from the observer's event thread, as close behind as we can get. On
            # ZooKeeper a fast leader's flag and fence can both be gone before the observer
            # reads them (it reports states, not every write): then the new epoch is the
            # first sign, the kill lands after it, and the attempt does not count
            if killed.is_set():
                return
            flagged = event.path == paths.necessary and event.kind is not EventKind.DELETED
            fenced = advanced = False
            if event.path == paths.assignment and event.value is not None:
                try:
                    seen = Assignment.decode(paths.assignment, event.value)
                except CorruptNodeError:
                    pass
                else:
                    fenced = seen.state is AssignmentState.RESHARDING
                    advanced = seen.epoch > before.epoch
            if flagged or fenced or advanced:
                fault.append(time.time())
                leader.send(signal.SIGKILL)
                killed.set()

        watch = run.observer.watch(paths.root, on_change)
        try:
            newcomer = run.fleet.spawn(f"127.0.0.1@-@l-{3 + attempt}")[0]
            wait_for(
                killed.is_set,
                30.0,
                interval=0.01,
                message=lambda: f"no resharding began:\n{run.fleet.describe()}",
            )
        finally:
            watch.cancel()
        leader.kill()
        dead.add(leader_id)
        flag_left = run.observer.exists(paths.necessary)
        after = run.assignment()
        landed = (
            after is None
            or after.state is AssignmentState.RESHARDING
            or (flag_left and after.epoch == before.epoch)
        )
        newcomer.wait_ready()
        if landed:
            run.notes.append(
                f"the kill landed mid-resharding (epoch {before.epoch} fenced or flagged), attempt {attempt}"
            )
            break
        assert after is not None
        run.notes.append(f"attempt {attempt}: the kill came just after epoch {after.epoch} was written")
    else:
        raise AssertionError(
            f"fault did not land: no kill mid-resharding in {LEADER_KILL_ATTEMPTS} attempts: {run.notes}"
        )
    assert_passed(run.finish(fault[0], fault[0], dead=dead))


# -- 3. SIGSTOP past the session timeout, then SIGCONT ---------------------------------
def test_sigstop_of_the_leader_past_the_session_timeout(stage: Stage) -> None:
    run = stage.run("sigstop", "SIGSTOP of the leader for 2 x timeout", failover=True)
    run.fleet.start(*instance_ids("p", 3))
    run.settle()
    paused = run.fleet.worker(run.leader())
    before = run.assignment()
    assert before is not None
    # between its runs: paused mid-item it would finish that item after the pause, which
    # no registry can prevent (the epoch in its context is that case's fencing token)
    run.wait_between_runs(paused)
    fault_at = time.time()
    paused.pause()
    try:
        # the server must drop the paused worker's registration before it resumes: then
        # the pause lasts out the scenario's 2 x timeout
        run.wait_session_expired(paused, 3 * SESSION_TIMEOUT + 5)
        deliberate_wait(max(0.0, fault_at + 2 * SESSION_TIMEOUT - time.time()))
    finally:
        paused.resume()
    fault_end = time.time()

    def never_stale(result: ChaosResult, records: list[Record]) -> None:
        mine = [r for r in records if r.instance == paused.instance_id and r.start > fault_at]
        stale = [r for r in mine if r.epoch <= before.epoch]
        result.problems.extend(
            f"{paused.instance_id} ran item {r.item} fire {r.fire_time:.0f} with its stale epoch {r.epoch}"
            for r in stale
        )
        if not mine:
            result.problems.append(f"{paused.instance_id} never ran again after SIGCONT")

    assert_passed(run.finish(fault_at, fault_end, extra_checks=never_stale))


def test_sigstop_of_a_worker_within_the_session_timeout(stage: Stage) -> None:
    """A pause the session survives (a long GC, a stalled VM): nobody takes the worker's
    items over, so after SIGCONT it must run the fires it slept through itself. Its timer
    then comes more than a period late; the fires it passed are owed, not dropped."""
    timeout = 3 * SESSION_TIMEOUT
    pause = 2.5  # more than two fire periods, well inside the session timeout
    run = stage.run(
        "sigstop-short",
        f"SIGSTOP of a worker for {pause:g} s, its session alive",
        failover=True,
        session_timeout=timeout,
    )
    run.fleet.start(*instance_ids("q", 3))
    run.settle()
    paused = run.fleet.workers[0]
    run.wait_between_runs(paused)
    fault_at = time.time()
    paused.pause()
    try:
        deliberate_wait(pause)
    finally:
        paused.resume()
    assert_passed(run.finish(fault_at, time.time()))


# -- 4. the registry: a single server restarted, a cluster member lost -----------------
def test_registry_server_restart(stage: Stage) -> None:
    run = stage.run("server-restart", "registry restart, 1 s down", failover=True)
    run.fleet.start(*instance_ids("r", 3))
    run.settle()
    # mid-run, as every fault here: the runs end while the server is down
    run.wait_running(run.fleet.workers[0])
    fault_at = time.time()
    stage.server.restart(downtime=1.0)  # an external server skips the test here
    fault_end = time.time()
    run.notes.append(f"server back after {fault_end - fault_at:.1f}s")
    assert_passed(run.finish(fault_at, fault_end))


@pytest.mark.cluster
def test_loss_of_the_leader_member_of_a_cluster(cluster_stage: Stage) -> None:
    run = cluster_stage.run("member-loss", "registry leader member killed (3 nodes)", failover=True)
    cluster = cluster_stage.server
    run.fleet.start(*instance_ids("m", 3))
    run.settle()
    index = cluster.leader_index()
    fault_at = time.time()
    cluster.kill_member(index)
    try:
        result = run.finish(fault_at, fault_at)
    finally:
        cluster.start_member(index)  # the next test gets the whole cluster back
    assert_passed(result)


# -- 5. a network cut between one worker and the registry ------------------------------
def test_network_cut_of_a_worker_past_the_session_timeout(stage: Stage) -> None:
    run = stage.run("network-cut", "one worker cut off for 2 x timeout + 1 s", failover=True)
    proxy = stage.proxy()
    ids = instance_ids("n", 3)
    cut_id = ids[-1]
    run.fleet.start(*ids, urls={cut_id: stage.url(address=proxy.address)})
    run.settle()
    cut = run.fleet.worker(cut_id)
    if run.leader() == cut_id:
        run.notes.append("the cut worker was the leader")
    # mid-run: its running mark cannot be cleared through the cut
    run.wait_running(cut)
    fault_at = time.time()
    proxy.cut()
    try:
        # the server must drop the cut worker's registration before the link is back
        run.wait_session_expired(cut, 3 * SESSION_TIMEOUT + 5)
        deliberate_wait(max(0.0, fault_at + 2 * SESSION_TIMEOUT + 1 - time.time()))
    finally:
        proxy.restore()
    fault_end = time.time()
    assert_passed(run.finish(fault_at, fault_end))


@pytest.mark.parametrize("failover", [True, False], ids=["failover", "no-failover"])
def test_run_end_lost_in_flight(stage: Stage, failover: bool) -> None:
    """A link flap far shorter than the session timeout that swallows the request ending a
    run (its running mark's removal): the session survives, the client cannot know whether
    the removal happened — and the worker must not be left behind by its own mark."""
    run = stage.run(
        "run-end-lost", "one worker's run-end request lost in a 0.35 s link flap", failover=failover
    )
    proxy = stage.stalling_proxy()
    ids = instance_ids("f", 3)
    flapped_id = ids[-1]
    run.fleet.start(*ids, urls={flapped_id: stage.url(address=proxy.address)})
    run.settle()
    flapped = run.fleet.worker(flapped_id)
    mark = run.paths.running_of(flapped_id)

    def catch_a_run() -> tuple[float, int]:
        """A run of the flapped worker caught before any of its items ended (its mark read
        by the observer, none of its fire's records written yet), so its run end comes
        after a stall begun now; a run seen too late is let go and the next one tried."""
        for _ in range(10):
            run.wait_running(flapped)
            raw = run.observer.get(mark)
            if raw is None:
                continue
            trace = RunTrace.decode(mark, raw)
            if trace.state != "running" or trace.fire_time is None:
                continue
            if not any(r.fire_time == trace.fire_time for r in flapped.records()):
                return trace.fire_time, len(trace.items)
            run.wait_between_runs(flapped)
        raise AssertionError(f"fault did not land: no run of {flapped_id} caught in progress")

    def ends_of(fire: float) -> list[float]:
        return [r.end for r in flapped.records() if r.fire_time == fire]

    # The mark is seen at the server a moment before its answer reaches the worker: a
    # stall begun in between holds the answer, the worker never starts the items, and
    # there is no run end to lose. Such a catch (or one whose items ended before the
    # stall) is released within the session timeout, and once that run is over the next
    # one is tried.
    fault_at: float | None = None
    for _ in range(5):
        fire, share = catch_a_run()
        stalled_at = time.time()
        fault_at = stalled_at if fault_at is None else fault_at
        proxy.stall()
        landed = False
        try:
            # the items end HOLD s after they started; the mark's removal follows at
            # once and is held in the stalled link: seen held (request bytes the proxy
            # held after the run's last item ended) before the cut drops it. Bounded well
            # inside the session timeout, which the flap must not reach.
            def run_end_held(fire: float = fire, share: int = share) -> bool:
                ended = ends_of(fire)
                return len(ended) >= share and proxy.held_since(max(ended)) > 0

            try:
                wait_for(run_end_held, SESSION_TIMEOUT / 2, interval=0.005)
            except AssertionError:
                ended = ends_of(fire)
                if len(ended) >= share:  # the items ran and no run end left the worker
                    raise AssertionError(
                        f"fault did not land: no request of {flapped_id} held after its run "
                        f"ended (fire {fire:.3f}, stalled at {stalled_at:.3f}, items ended at "
                        f"{[round(end, 3) for end in ended]}, held {proxy.held_requests}):\n"
                        f"{run.fleet.describe()}"
                    ) from None
                run.notes.append(f"fire {fire:.0f}: its mark's answer was held, the items never started")
                continue
            if max(ends_of(fire)) < stalled_at:
                run.notes.append(f"fire {fire:.0f}: its items ended before the stall")
                continue
            proxy.cut()
            landed = True
        finally:
            proxy.restore()
        if landed:
            break
        run.wait_between_runs(flapped)  # the held answer delivered and its run over
    else:
        raise AssertionError(f"fault did not land: no run end of {flapped_id} held in 5 tries")
    assert fault_at is not None
    fault_end = time.time()
    # the proxy's pump threads see the cut within a poll: then they count what they dropped
    wait_for(
        lambda: proxy.dropped_request_bytes > 0,
        2.0,
        message="fault did not land: the cut dropped no held request",
    )
    run.notes.append(f"{proxy.dropped_request_bytes} request bytes held and dropped")
    assert_passed(run.finish(fault_at, fault_end))


# -- 6. a corrupt node written into the job's subtree by someone else ------------------
def _volatile(path: str, root: str) -> bool:
    """Nodes that come and go in normal operation: running marks, the resharding flag,
    the failover queue, triggers."""
    return any(
        path == f"{root}/{sub}" or path.startswith(f"{root}/{sub}/")
        for sub in ("running", "leader/sharding", "leader/failover", "trigger")
    )


def test_corrupt_nodes_in_the_job_subtree(stage: Stage) -> None:
    run = stage.run("corrupt-node", "garbage in sharding/assignment, then in config", failover=True)
    run.fleet.start(*instance_ids("c", 3))
    run.settle()
    paths = run.paths
    kept = {p for p in subtree_paths(run.observer, paths.root) if not _volatile(p, paths.root)}
    before = run.assignment()
    config_before = run.observer.get(paths.config)
    assert before is not None and config_before is not None

    fault_at = time.time()
    run.observer.put(paths.assignment, b"\x00{not an assignment")
    rewritten = wait_for(
        lambda: (a := run.assignment()) is not None and a.epoch > before.epoch and a,
        30.0,
        interval=0.05,
        message=lambda: f"the corrupt assignment was never rewritten:\n{run.fleet.describe()}",
    )
    assert rewritten
    run.notes.append(f"assignment rewritten: epoch {before.epoch} -> {rewritten.epoch}")
    # the cluster runs every item again under the new epoch before the second corruption
    wait_for(
        lambda: {r.item for r in run.fleet.records() if r.epoch >= rewritten.epoch} == set(range(TOTAL)),
        30.0,
        interval=0.1,
        message=lambda: f"no runs under the rewritten assignment:\n{run.fleet.describe()}",
    )
    config_at = time.time()
    garbage_config = b"{garbage config"
    run.observer.put(paths.config, garbage_config)

    def corruption_handled(result: ChaosResult, records: list[Record]) -> None:
        live = run.fleet.alive()
        named = logs_naming(live, paths.assignment)
        if not named:
            result.problems.append(f"no worker's stderr names the corrupt {paths.assignment}")
        silent = sorted(set(w.instance_id for w in live) - set(logs_naming(live, paths.config)))
        if silent:
            result.problems.append(f"stderr of {silent} does not name the corrupt {paths.config}")
        after_config = [r for r in records if r.start > config_at + 1]
        if {r.total for r in after_config} != {TOTAL}:
            result.problems.append(
                f"the in-force config was not kept: totals {sorted({r.total for r in after_config})}"
            )
        now = subtree_paths(run.observer, paths.root)
        lost = sorted(kept - now)
        if lost:
            result.problems.append(f"registry nodes lost: {lost}")
        if run.observer.get(paths.config) != garbage_config:
            result.notes.append("the corrupt config was replaced")
        else:
            result.notes.append("the corrupt config was left in place (reported, not used)")

    assert_passed(run.finish(fault_at, config_at, extra_checks=corruption_handled))


# -- the checkers themselves (no server) -----------------------------------------------
def _run(item: int, fire: float, who: str, start: float, *, failover: bool = False) -> Record:
    return Record(JOB, item, fire, 1, who, start, start + HOLD, TOTAL, failover)


def test_the_chaos_checkers_catch_what_they_are_for() -> None:
    base = [_run(0, 10.0, "a", 10.0), _run(1, 10.0, "b", 10.0)]
    # a failover re-run of a pair that already ran is allowed; a second regular run is not
    rerun = [*base, _run(0, 10.0, "b", 12.0, failover=True)]
    assert doubled_beyond_failover(rerun) == [] and len(failover_reruns(rerun)) == 1
    assert len(doubled_beyond_failover([*base, _run(0, 10.0, "b", 12.0)])) == 1
    assert missed_pairs(base, [10.0, 11.0], 2) == [(0, 11.0), (1, 11.0)]
    # recovery: the first later fire whose every item started, on survivors only
    later = [*base, _run(0, 11.0, "a", 11.0), _run(1, 11.0, "b", 13.5), _run(0, 12.0, "a", 12.0)]
    later.append(_run(1, 12.0, "b", 12.1))
    assert recovery_point(later, 10.5, 2) == (12.0, 12.1)
    assert recovery_point(later, 10.5, 2, exclude={"b"}) is None
    assert recovery_point([*later, _run(1, 11.0, "a", 11.2, failover=True)], 10.5, 2) == (11.0, 11.2)
    assert recovery_point([*later, _run(1, 11.0, "a", 11.2, failover=True)], 10.5, 2, regular_only=True) == (
        12.0,
        12.1,
    )

    # a result with a problem fails, naming it
    result = ChaosResult("s", "f", "zookeeper", True, SESSION_TIMEOUT)
    result.problem("missed", "1 pair never ran")
    with pytest.raises(AssertionError, match="1 pair never ran"):
        assert_passed(result)


def test_a_result_read_back_from_its_json_line_is_the_same_result() -> None:
    """What a worker process sends for the table (``chaos_report``) reads back whole."""
    result = ChaosResult("sigkill", "SIGKILL of a worker", "etcd", False, SESSION_TIMEOUT, recovery_s=1.5)
    result.missed = [(0, 11.0), (2, 12.0)]
    result.window = (10.0, 14.0)
    result.exit_codes = {"w1": 0, "w2": None}
    result.overlaps = ["item 1 at 12.0"]
    result.problem("missed", "2 pairs never ran")
    result.notes.append("a note")
    result.runs = 17
    assert ChaosResult.from_json(result.to_json()) == result


@pytest.mark.parametrize("workers", ["0", "2"])
def test_the_chaos_table_lists_each_result_once_with_or_without_workers(tmp_path: Path, workers: str) -> None:
    """Under pytest-xdist the controller prints the summary: the results recorded in a
    worker reach it with the test reports (``chaos_report``), once each."""
    (tmp_path / "test_two_scenarios.py").write_text(
        textwrap.dedent(
            """
            from tests.scenarios.chaos import ChaosResult, record_result

            def test_one():
                record_result(ChaosResult("scenario-one", "a fault", "zookeeper", True, 2.0, recovery_s=1.0))

            def test_two():
                record_result(ChaosResult("scenario-two", "a fault", "etcd", False, 2.0))
            """
        )
    )
    plugin = ["-p", "tests.scenarios.chaos_report", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *plugin, "-n", workers, "test_two_scenarios.py"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "chaos scenarios" in done.stdout, done.stdout
    assert done.stdout.count("scenario-one") == 1 and done.stdout.count("scenario-two") == 1, done.stdout
