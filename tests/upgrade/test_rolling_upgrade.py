"""A rolling upgrade on ZooKeeper and etcd: a fleet of release 0.1.0 (layout 1) workers is
replaced one instance at a time by this release's, the two releases sharing the job
meanwhile, with every invariant of ``docs/guarantees.md`` checked over the whole timeline.

The old release is the real one: its source tree taken from this repository's history
(commit ``PREVIOUS_RELEASE``, tag v0.1.0), run as ``shardjob worker`` processes beside
this checkout's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path

import pytest

import registry
from sharding.layout_version import LAYOUT, LAYOUT_NODE
from tests.harness import Harness
from tests.scenarios.checks import doubled_runs, fires_after, overlapping_runs, stale_epoch_runs
from tests.scenarios.phases import await_fires, check_phase, expected_spread, fires_between, settle
from tests.scenarios.workers import REPO_ROOT, Fleet
from tests.waiting import wait_for

#: release 0.1.0, the last to write layout 1 (no layout node)
PREVIOUS_RELEASE = "25fe7ee"
HOLD = 0.3
TOTAL = 6


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's packages, extracted from git (skipped, by name, in a checkout
    without that history: a shallow clone or a source archive)."""
    git = shutil.which("git")
    if git is None:
        pytest.skip("git not found: release 0.1.0's source comes from this repository's history")
    found = subprocess.run(
        [git, "-C", str(REPO_ROOT), "archive", "--format=tar", PREVIOUS_RELEASE, "registry", "sharding", "scheduler"],
        capture_output=True,
        check=False,
    )
    if found.returncode != 0:
        pytest.skip(f"commit {PREVIOUS_RELEASE} (release 0.1.0) not in this checkout: {found.stderr.decode()[:200]}")
    root = tmp_path_factory.mktemp("shardjob-0.1.0")
    with tarfile.open(fileobj=BytesIO(found.stdout)) as tar:
        tar.extractall(root, filter="data")
    return root


@pytest.fixture
def fleet(server: Harness, tmp_path: Path) -> Iterator[Fleet]:
    made = Fleet(server.url(server.fresh_namespace(), session_timeout=2), tmp_path, total=TOTAL, hold=HOLD)
    try:
        yield made
    finally:
        made.close()


def layout_of(url: str) -> int | None:
    with registry.connect(url) as reg:
        node = reg.get_node(LAYOUT_NODE)
    return None if node is None else int(json.loads(node.value)["layout"])


@pytest.mark.slow
def test_old_instances_are_replaced_one_by_one(fleet: Fleet, previous_release: Path) -> None:
    old_ids = ["127.0.0.1@-@old-a", "127.0.0.1@-@old-b", "127.0.0.1@-@old-c"]
    new_ids = ["127.0.0.1@-@new-a", "127.0.0.1@-@new-b", "127.0.0.1@-@new-c"]
    fleet.start(*old_ids, code_root=previous_release)
    members = list(old_ids)
    first = settle(fleet, expected_spread(members, TOTAL), TOTAL)
    later = fires_after(first, 2)
    check_phase(await_fires(fleet, later, TOTAL), later, expected_spread(members, TOTAL), TOTAL)
    assert layout_of(fleet.url) is None, "release 0.1.0 writes no layout node"

    phases: list[tuple[float, float, list[str]]] = []  # (first settled fire, end of the phase, members)
    settled = first
    for old, new in zip(old_ids, new_ids, strict=True):
        changing = time.time()
        phases.append((settled, changing, list(members)))
        code = fleet.worker(old).terminate()
        assert code == 0, fleet.worker(old).describe()
        joined = fleet.start(new)[0]
        assert joined.ready_at is not None
        members = [m for m in members if m != old] + [new]
        spread = expected_spread(members, TOTAL)
        settled = settle(fleet, spread, TOTAL)
        later = fires_after(settled, 2)
        check_phase(await_fires(fleet, later, TOTAL), later, spread, TOTAL)
    phases.append((settled, time.time(), list(members)))

    # every fire between the hand-overs ran each item once, where the strategy says, under
    # old, mixed and new fleets alike; nothing ever doubled, overlapped or ran a stale epoch
    records = fleet.records()
    for begin, end, phase_members in phases:
        fires = fires_between(begin, end - 1)
        if fires:
            check_phase(records, fires, expected_spread(phase_members, TOTAL), TOTAL)
        print(  # the timeline, for `pytest -s`
            f"{', '.join(m.rsplit('@', 1)[-1] for m in phase_members)}: {len(fires)} fires checked, "
            f"{sum(r.fire_time in fires for r in records)} item runs, epochs "
            f"{sorted({r.epoch for r in records if r.fire_time in fires})}"
        )
    assert doubled_runs(records) == []
    assert overlapping_runs(records) == []
    assert stale_epoch_runs(records) == []
    assert {r.instance for r in records} >= {*old_ids, *new_ids}

    # the new fleet's leader recorded the layout
    wait_for(lambda: layout_of(fleet.url) == LAYOUT, 10, message=lambda: f"layout {layout_of(fleet.url)}")
    assert fleet.terminate_all() == dict.fromkeys(new_ids, 0)
