"""``release_free_heap`` and the start-up that calls it: the heap's free pages leave the
process's resident set (glibc's ``malloc_trim``), measured in a child process of its own,
whose RSS nothing else in the test session moves."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from scheduler.heap_release import release_free_heap

RSS = textwrap.dedent(
    """
    def rss_mib():
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    """
)


def _child(body: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", RSS + textwrap.dedent(body)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


@pytest.fixture(autouse=True)
def _glibc() -> None:
    if not release_free_heap():
        pytest.skip("no glibc malloc_trim in this process")


def test_freed_blocks_between_live_ones_leave_the_resident_set() -> None:
    # 8 KiB blocks come from malloc's heap (not Python's small-object arenas, not mmap);
    # a small block kept after each one pins the heap's top, so nothing shrinks it there
    found = _child(
        """
        import json
        from scheduler.heap_release import release_free_heap
        big = [bytes(8192) for _ in range(20_000)]
        pins = []
        for index in range(len(big)):
            big[index] = None
            pins.append(bytes(600))
        before = rss_mib()
        release_free_heap()
        print(json.dumps({"before": before, "after": rss_mib()}))
        """
    )
    # the 20,000 blocks were 156 MiB
    assert found["before"] - found["after"] > 100, found


def test_a_start_of_thousands_of_jobs_leaves_no_free_heap_resident() -> None:
    found = _child(
        """
        import json
        from scheduler import JobConfig, Scheduler
        from scheduler.heap_release import release_free_heap
        scheduler = Scheduler("memory://heap-release")
        for index in range(3000):
            scheduler.add_job(JobConfig(name=f"job-{index}", cron="0 0 0 1 1 ? 2099"), lambda ctx: None)
        scheduler.start()
        try:
            before = rss_mib()
            release_free_heap()
            print(json.dumps({"before": before, "after": rss_mib()}))
        finally:
            scheduler.shutdown(wait=False)
        """
    )
    # without the start's own release, 3,000 jobs left megabytes of freed tables resident
    assert found["before"] - found["after"] < 1.0, found
