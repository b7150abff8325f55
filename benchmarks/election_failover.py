"""Leader failover after SIGKILL, as a fraction of the session timeout, on ZooKeeper and
etcd — shardjob's sharding service beside the plain recipes measured in the same run.

shardjob: a child process (``tests.participant ... member``) leads job ``orders``; three
in-process ``ShardingService``s follow, each with its own session. SIGKILL the child, then
time (from just before the signal) until a survivor leads, and until every survivor holds
a READY assignment over the survivors only. Then ``stop()`` the new leader (a clean
shutdown) and time the same two things: no timeout may be involved there.

Anchors, same session timeout, same server: kazoo's ``Election`` recipe (leader in a child
process, SIGKILL, time until the contender's function runs) and a pyetcd lease kept alive
every TTL/3 + a watch + create-if-absent (the python-etcd3 idiom); on ZooKeeper also tooz's
leader election (``watch_elected_as_leader`` + ``run_watchers``, polled every 50 ms, as
tooz users must). Runs alternate ours and the anchors, so drift on this shared machine
touches them alike.

Where the kill falls within the dead client's heartbeat period (about timeout/3 for every
client here: kazoo pings, our lease keeper, the anchor's refresh) decides how much of the
timeout is left. Killed at a fixed moment after start-up, every run would land on the same
phase; so run ``i`` of ``n`` first waits ``(i + 0.5) / n`` of a period, and the runs
sample the whole period evenly, ours and the anchor alike.

Usage: ``.venv/bin/python -m benchmarks.election_failover [--quick] [--runs N] [--timeout S]``
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import registry
from benchmarks.charts import Charts
from benchmarks.common import (
    BenchmarkError,
    base_parser,
    first_host,
    poll_until,
    print_table,
    run_script,
    servers,
    spawn_ready,
    stop_child,
    write_results,
)
from registry.protocol import RegistryCenter
from sharding import AssignmentState, InstanceIdentity, ShardingService, ShardingSettings

__all__ = ["NAME", "main", "render", "summary"]

NAME = "election_failover"
JOB = "orders"
TOTAL = 6
FOLLOWERS = 3
SCHEMES = {"zookeeper": "zk", "etcd": "etcd"}
ANCHORS = {
    "zookeeper": "kazoo Election (child leader SIGKILLed)",
    "etcd": "pyetcd lease + watch + create-if-absent",
}
TOOZ_ANCHOR = "tooz leader election on ZooKeeper (child leader SIGKILLed)"
#: the anchors as first measured on this kind of machine: SIGKILL of the holder, 4 s
#: session/lease, 5 runs, median (s); each run measures them again beside ours
REFERENCE_4S = {
    "kazoo Election": 4.07,
    "python-etcd3 lease + watch + create-if-absent": 3.36,
    "tooz on ZooKeeper": 3.45,
    "tooz on etcd (lock)": 3.66,
}


def _phase_offset(index: int, runs: int, timeout: float) -> float:
    """Seconds to wait before run ``index``'s kill (module docstring)."""
    return (index + 0.5) / runs * timeout / 3


# -- shardjob ---------------------------------------------------------------------------------
def _ready_over(service: ShardingService, instances: set[str]) -> bool:
    """This instance's cache holds a READY assignment over exactly ``instances``."""
    current = service.current()
    return (
        current is not None
        and current.state is AssignmentState.READY
        and set(current.items) == instances
        and not service.resharding_pending()
    )


def _wait_both(
    t0: float, services: Iterable[ShardingService], instances: set[str], bound: float
) -> tuple[float | None, float | None]:
    """Seconds from ``t0`` until one of ``services`` leads, and until all are READY over
    ``instances``; None for what did not happen within ``bound``."""
    members = list(services)
    marks: dict[str, float] = {}

    def check() -> bool:
        now = time.monotonic()
        if "leader" not in marks and any(s.is_leader for s in members):
            marks["leader"] = now - t0
        if "ready" not in marks and all(_ready_over(s, instances) for s in members):
            marks["ready"] = now - t0
        return len(marks) == 2

    poll_until(check, bound)
    return marks.get("leader"), marks.get("ready")


def _ours_run(
    backend: str,
    address: str,
    timeout: float,
    workdir: Path,
    index: int,
    offset: float,
    pool: ThreadPoolExecutor,
) -> dict[str, float | None]:
    namespace = f"/bench-failover-{uuid.uuid4().hex[:8]}"
    url = f"{SCHEMES[backend]}://{address}{namespace}?session_timeout={timeout:g}"
    child_id = "10.0.0.1@-@leader"
    child = spawn_ready(
        [sys.executable, "-m", "tests.participant", url, "member", f"/{JOB}", child_id, str(TOTAL)],
        workdir / f"ours-{backend}-{index}.log",
    )
    regs: list[RegistryCenter] = []
    services: dict[str, ShardingService] = {}
    bound = 3 * timeout + 20
    try:
        for n in range(FOLLOWERS):
            reg = registry.connect(url)
            regs.append(reg)
            instance = f"10.0.0.{n + 2}@-@follower{n + 1}"
            service = ShardingService(
                reg, JOB, InstanceIdentity.create(instance), ShardingSettings(total=TOTAL),
                executor=pool, wait_timeout=30,
            )  # fmt: skip
            service.start()
            services[instance] = service
        everyone = {child_id, *services}
        settled = poll_until(
            lambda: all(s.leader() == child_id and _ready_over(s, everyone) for s in services.values()), 30
        )
        if settled is None:
            raise BenchmarkError(f"{backend}: the child never led a READY assignment over {sorted(everyone)}")

        time.sleep(offset)  # the phase of this run's kill, not a wait for a condition
        t0 = time.monotonic()
        child.kill()  # SIGKILL: nothing released, the session must time out
        kill_leader, kill_ready = _wait_both(t0, services.values(), set(services), bound)
        if kill_leader is None or kill_ready is None:
            raise BenchmarkError(f"{backend}: no failover within {bound:g}s of SIGKILL")

        leader = next(i for i, s in services.items() if s.is_leader)
        rest = {i: s for i, s in services.items() if i != leader}
        t1 = time.monotonic()
        services[leader].stop()
        stop_leader, stop_ready = _wait_both(t1, rest.values(), set(rest), bound)
        if stop_leader is None or stop_ready is None:
            raise BenchmarkError(f"{backend}: no hand-over within {bound:g}s of a clean stop")
        return {
            "kill_leader_s": round(kill_leader, 3),
            "kill_ready_s": round(kill_ready, 3),
            "stop_leader_s": round(stop_leader, 4),
            "stop_ready_s": round(stop_ready, 4),
        }
    finally:
        for service in services.values():
            service.stop()
        for client in regs:
            client.close()
        stop_child(child)


# -- anchors ----------------------------------------------------------------------------------
def _kazoo_run(address: str, timeout: float, workdir: Path, index: int, offset: float) -> float:
    from kazoo.client import KazooClient

    path = f"/bench-kazoo-election-{uuid.uuid4().hex[:8]}"
    child = spawn_ready(
        [
            sys.executable,
            "-m",
            "benchmarks.election_failover",
            "_kazoo_leader",
            address,
            path,
            f"{timeout:g}",
        ],
        workdir / f"kazoo-{index}.log",
    )
    client = KazooClient(hosts=address, timeout=timeout)
    client.start(timeout=10)
    election = client.Election(path, "contender")
    elected_at: list[float] = []
    release = threading.Event()

    def lead() -> None:
        elected_at.append(time.monotonic())
        release.wait()

    runner = threading.Thread(target=election.run, args=(lead,), name="bench-kazoo-contender", daemon=True)
    runner.start()
    try:
        if poll_until(lambda: len(election.contenders()) >= 2, 10, interval=0.02) is None:
            raise BenchmarkError("kazoo: the contender never queued behind the child")
        time.sleep(offset)  # the phase of this run's kill, not a wait for a condition
        t0 = time.monotonic()
        child.kill()
        if poll_until(lambda: bool(elected_at), 3 * timeout + 20) is None:
            raise BenchmarkError("kazoo: the contender was never elected")
        return elected_at[0] - t0
    finally:
        release.set()
        election.cancel()
        runner.join(10)
        client.delete(path, recursive=True)
        client.stop()
        client.close()
        stop_child(child)


def _keep_alive(lease: Any, ttl: int, stop: threading.Event) -> None:
    """What every pyetcd user must write: nothing refreshes a lease by itself."""
    while not stop.wait(ttl / 3):
        try:
            lease.refresh()
        except Exception:  # a refresh that fails is retried at the next interval
            continue


def _etcd_run(address: str, timeout: float, workdir: Path, index: int, offset: float) -> float:
    import pyetcd
    from pyetcd.events import DeleteEvent

    key = f"/bench-etcd-election-{uuid.uuid4().hex[:8]}"
    ttl = max(2, math.ceil(timeout))
    child = spawn_ready(
        [sys.executable, "-m", "benchmarks.election_failover", "_etcd_leader", address, key, str(ttl)],
        workdir / f"etcd-{index}.log",
    )
    host, port = first_host(address)
    client = pyetcd.client(host=host, port=port, timeout=10)
    lease = client.lease(ttl)
    stop = threading.Event()
    keeper = threading.Thread(target=_keep_alive, args=(lease, ttl, stop), name="bench-etcd-keepalive")
    keeper.start()
    deleted = threading.Event()

    def on_watch(response: Any) -> None:
        # a callback only signals: pyetcd forbids watch calls from its own thread
        if any(isinstance(event, DeleteEvent) for event in getattr(response, "events", None) or []):
            deleted.set()

    watch_id = client.add_watch_callback(key, on_watch)
    try:
        if client.put_if_not_exists(key, b"contender", lease=lease):
            raise BenchmarkError("etcd: the child did not hold the key")
        time.sleep(offset)  # the phase of this run's kill, not a wait for a condition
        t0 = time.monotonic()
        child.kill()
        deadline = t0 + 3 * ttl + 20
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BenchmarkError("etcd: the contender never got the key")
            deleted.wait(remaining)
            deleted.clear()
            if client.put_if_not_exists(key, b"contender", lease=lease):
                return time.monotonic() - t0
    finally:
        stop.set()
        keeper.join(10)
        client.cancel_watch(watch_id)
        lease.revoke()
        client.close()
        stop_child(child)


_TOOZ_POLL = 0.05


def _tooz_coordinator(address: str, member: str, timeout: float) -> Any:
    """A started tooz coordinator; ``member`` must not be 'leader', which tooz's ZooKeeper
    driver uses as a node name beside the members'."""
    from tooz import coordination

    # tooz passes 'timeout' to KazooClient as the session timeout
    url = f"kazoo://{address}?timeout={timeout:g}"
    coordinator = coordination.get_coordinator(url, member.encode())
    coordinator.start(start_heart=True)
    return coordinator


def _tooz_run(address: str, timeout: float, workdir: Path, index: int, offset: float) -> float:
    group = f"bench-tooz-{uuid.uuid4().hex[:8]}"
    child = spawn_ready(
        [
            sys.executable,
            "-m",
            "benchmarks.election_failover",
            "_tooz_leader",
            address,
            group,
            f"{timeout:g}",
        ],
        workdir / f"tooz-{index}.log",
    )
    coordinator = _tooz_coordinator(address, "tooz-contender", timeout)
    elected_at: list[float] = []
    try:
        coordinator.join_group(group.encode()).get()
        coordinator.watch_elected_as_leader(group.encode(), lambda event: elected_at.append(time.monotonic()))
        coordinator.run_watchers()
        if elected_at:
            raise BenchmarkError("tooz: the contender led before the child was killed")
        time.sleep(offset)  # the phase of this run's kill, not a wait for a condition
        t0 = time.monotonic()
        child.kill()
        deadline = t0 + 3 * timeout + 20
        while not elected_at:
            if time.monotonic() > deadline:
                raise BenchmarkError("tooz: the contender was never elected")
            coordinator.run_watchers()
            time.sleep(_TOOZ_POLL)  # tooz elects only inside run_watchers: its users poll
        return elected_at[0] - t0
    finally:
        coordinator.stop()
        stop_child(child)


def _tooz_leader(address: str, group: str, timeout: str) -> int:
    from tooz import coordination

    coordinator = _tooz_coordinator(address, "tooz-leader", float(timeout))
    try:
        coordinator.create_group(group.encode()).get()
    except coordination.GroupAlreadyExist:
        pass
    coordinator.join_group(group.encode()).get()
    elected: list[bool] = []
    coordinator.watch_elected_as_leader(group.encode(), lambda event: elected.append(True))
    deadline = time.monotonic() + 20
    while not elected and time.monotonic() < deadline:
        coordinator.run_watchers()
        time.sleep(_TOOZ_POLL)
    if not elected:
        print("never elected", file=sys.stderr)
        return 1
    print("ready", flush=True)
    sys.stdin.read()
    coordinator.stop()
    return 0


def _kazoo_leader(address: str, path: str, timeout: str) -> int:
    from kazoo.client import KazooClient

    client = KazooClient(hosts=address, timeout=float(timeout))
    client.start(timeout=10)

    def lead() -> None:
        print("ready", flush=True)
        sys.stdin.read()  # lead until the parent closes our stdin (or kills us)

    client.Election(path, "leader").run(lead)
    client.stop()
    client.close()
    return 0


def _etcd_leader(address: str, key: str, ttl_text: str) -> int:
    import pyetcd

    host, port = first_host(address)
    ttl = int(ttl_text)
    client = pyetcd.client(host=host, port=port, timeout=10)
    lease = client.lease(ttl)
    if not client.put_if_not_exists(key, b"leader", lease=lease):
        print("key already held", file=sys.stderr)
        return 1
    stop = threading.Event()
    keeper = threading.Thread(target=_keep_alive, args=(lease, ttl, stop), daemon=True)
    keeper.start()
    print("ready", flush=True)
    sys.stdin.read()
    stop.set()
    lease.revoke()
    client.close()
    return 0


# -- the figure -------------------------------------------------------------------------------
def _stats(values: list[float], timeout: float | None) -> dict[str, Any]:
    median, worst = statistics.median(values), max(values)
    stats: dict[str, Any] = {"runs_s": [round(v, 4) for v in values], "median_s": round(median, 4)}
    stats["max_s"] = round(worst, 4)
    if timeout:
        stats["median_ratio"] = round(median / timeout, 3)
        stats["max_ratio"] = round(worst / timeout, 3)
    return stats


def _bench_backend(backend: str, address: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    timeout: float = args.timeout
    ours: list[dict[str, float | None]] = []
    anchor: list[float] = []
    tooz: list[float] = []
    anchor_run: Callable[[str, float, Path, int, float], float] = (
        _kazoo_run if backend == "zookeeper" else _etcd_run
    )
    with ThreadPoolExecutor(4, thread_name_prefix="bench-sharding") as pool:
        for index in range(args.runs):
            offset = _phase_offset(index, args.runs, timeout)
            ours.append(_ours_run(backend, address, timeout, workdir, index, offset, pool))
            if not args.no_anchors:
                anchor.append(anchor_run(address, timeout, workdir, index, offset))
                if backend == "zookeeper":
                    tooz.append(_tooz_run(address, timeout, workdir, index, offset))

    def column(key: str) -> list[float]:
        return [value for run in ours if (value := run[key]) is not None]

    result: dict[str, Any] = {
        "session_timeout_s": timeout,
        "runs": args.runs,
        "kill_phase_offsets_s": [round(_phase_offset(i, args.runs, timeout), 3) for i in range(args.runs)],
        "shardjob_kill_leader": _stats(column("kill_leader_s"), timeout),
        "shardjob_kill_ready": _stats(column("kill_ready_s"), timeout),
        "shardjob_stop_leader": _stats(column("stop_leader_s"), timeout),
        "shardjob_stop_ready": _stats(column("stop_ready_s"), timeout),
        "anchor_name": ANCHORS[backend],
        "anchor": _stats(anchor, timeout) if anchor else None,
        "anchor_tooz_name": TOOZ_ANCHOR if tooz else None,
        "anchor_tooz": _stats(tooz, timeout) if tooz else None,
    }
    if anchor:
        result["ratio_kill_leader_to_anchor"] = round(
            result["shardjob_kill_leader"]["median_s"] / result["anchor"]["median_s"], 3
        )
    return result


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0] if __doc__ else NAME)
    parser.add_argument("--runs", type=int, default=None, help="runs per backend (default 5, quick 1)")
    parser.add_argument("--timeout", type=float, default=None, help="session timeout s (default 4, quick 2)")
    parser.add_argument(
        "--backends", default="zookeeper,etcd", help="comma-separated subset of zookeeper,etcd"
    )
    parser.add_argument("--no-anchors", action="store_true", help="measure shardjob only")
    args = parser.parse_args(argv)
    args.runs = args.runs or (1 if args.quick else 5)
    args.timeout = args.timeout or (2.0 if args.quick else 4.0)
    return args


LABELS = (
    ("shardjob_kill_leader", "shardjob SIGKILL -> new leader"),
    ("shardjob_kill_ready", "shardjob SIGKILL -> READY without it"),
    ("anchor", None),
    ("anchor_tooz", None),
    ("shardjob_stop_leader", "shardjob stop() -> new leader"),
    ("shardjob_stop_ready", "shardjob stop() -> READY without it"),
)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    if argv and argv[0] == "_kazoo_leader":
        raise SystemExit(_kazoo_leader(*argv[1:4]))
    if argv and argv[0] == "_tooz_leader":
        raise SystemExit(_tooz_leader(*argv[1:4]))
    if argv and argv[0] == "_etcd_leader":
        raise SystemExit(_etcd_leader(*argv[1:4]))
    args = parse_args(list(argv or []))
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(backends) - set(SCHEMES)
    if unknown:
        raise ValueError(f"unknown backends {sorted(unknown)}; known: zookeeper, etcd")
    results: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(prefix="shardjob-bench-failover-") as tmp,
        servers(args, zookeeper="zookeeper" in backends, etcd="etcd" in backends) as live,
    ):
        for backend in backends:
            address = live.zookeeper if backend == "zookeeper" else live.etcd
            assert address is not None
            results[backend] = _bench_backend(backend, address, args, Path(tmp))
    rows = []
    for backend, figures in results.items():
        for key, label in LABELS:
            stats = figures.get(key)
            if stats is None:
                continue
            rows.append(
                [
                    backend,
                    label or f"anchor: {figures[key + '_name']}",
                    stats["median_s"],
                    stats["max_s"],
                    stats.get("median_ratio"),
                    stats.get("max_ratio"),
                ]
            )
    print_table(
        f"Failover, session timeout {args.timeout:g} s, {args.runs} runs",
        ["backend", "measure", "median s", "max s", "median/timeout", "max/timeout"],
        rows,
    )
    payload = {
        "session_timeout_s": args.timeout,
        "runs": args.runs,
        "results": results,
        "reference_4s_median_s": REFERENCE_4S,
    }
    write_results(NAME, args, payload)
    return payload


# -- BENCHMARKS.md ----------------------------------------------------------------------------
#: the project's target: failover within this many session timeouts
TARGET_RATIO = 1.1
_BACKEND_NAMES = {"zookeeper": "ZooKeeper", "etcd": "etcd"}


def _series(document: dict[str, Any]) -> dict[str, list[float]]:
    """Label -> failover times over the session timeout, for the chart."""
    out: dict[str, list[float]] = {}
    for backend, figures in document["results"].items():
        timeout = figures["session_timeout_s"]
        name = _BACKEND_NAMES.get(backend, backend)
        out[f"shardjob\n{name}"] = [v / timeout for v in figures["shardjob_kill_leader"]["runs_s"]]
        for key, short in (
            ("anchor", "kazoo" if backend == "zookeeper" else "pyetcd"),
            ("anchor_tooz", "tooz"),
        ):
            if figures.get(key):
                out[f"{short}\n{name}"] = [v / timeout for v in figures[key]["runs_s"]]
    return out


def render(document: dict[str, Any], charts: Charts) -> str:
    """This benchmark's section of BENCHMARKS.md."""
    rows = []
    for backend, figures in document["results"].items():
        for key, label in LABELS:
            stats = figures.get(key)
            if not stats:
                continue
            rows.append(
                f"| {_BACKEND_NAMES.get(backend, backend)} | {label or 'anchor: ' + figures[key + '_name']} | "
                f"{stats['median_s']} | {stats['max_s']} | {stats.get('median_ratio')} | {stats.get('max_ratio')} |"
            )
    chart = charts.distribution(
        "failover",
        f"SIGKILL of the leader -> a survivor leads, / session timeout ({document['runs']} runs each)",
        _series(document),
        "x session timeout",
        reference=(TARGET_RATIO, f"target {TARGET_RATIO}"),
    )
    return "\n".join(
        [
            "### Failover",
            "",
            f"Session timeout {document['session_timeout_s']:g} s, {document['runs']} runs per measure; each run kills "
            "at a different phase of the dead client's heartbeat period, ours and the anchors alike "
            "(module docstring of `benchmarks/election_failover.py`). The anchors run in the same run on the "
            "same server: kazoo's `Election` recipe, a pyetcd lease + watch + create-if-absent hand-over, and "
            "tooz's ZooKeeper leader election.",
            "",
            "| backend | measure | median s | max s | median / timeout | max / timeout |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
            f"![failover over the session timeout]({chart})",
            "",
            "A SIGKILLed leader is replaced when the server expires its session, so every contender, ours "
            "and the anchors, lands near 1 x the timeout; the spread is where the kill falls in the "
            "heartbeat period and the server's expiry tick. A clean `stop()` hands over at once.",
        ]
    )


def summary(document: dict[str, Any]) -> list[dict[str, str]]:
    rows = []
    for backend, figures in document["results"].items():
        ours = figures["shardjob_kill_leader"]
        anchors = [
            f"{'tooz' if key == 'anchor_tooz' else ('kazoo' if backend == 'zookeeper' else 'pyetcd')} "
            f"{figures[key]['median_ratio']}"
            for key in ("anchor", "anchor_tooz")
            if figures.get(key)
        ]
        rows.append(
            {
                "figure": f"failover after SIGKILL, {_BACKEND_NAMES.get(backend, backend)} (x session timeout)",
                "target": f"median <= {TARGET_RATIO}",
                "result": f"median {ours['median_ratio']}, max {ours['max_ratio']}"
                + (f" (anchors, median: {', '.join(anchors)})" if anchors else ""),
                "met": "yes" if ours["median_ratio"] <= TARGET_RATIO else "no",
            }
        )
        stop = figures["shardjob_stop_ready"]
        rows.append(
            {
                "figure": f"clean shutdown hand-over, {_BACKEND_NAMES.get(backend, backend)}",
                "target": "no timeout waited",
                "result": f"median {stop['median_s']} s (max {stop['max_s']} s) to READY without it",
                "met": "yes" if stop["max_ratio"] < 0.5 else "no",
            }
        )
    return rows


if __name__ == "__main__":
    run_script(main)
