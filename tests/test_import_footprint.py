"""A worker loads only what it runs: modules that only a plugin lookup, a retry, a clock
check or ``--version`` need stay out of a process that starts jobs and runs them, on every
backend (each costs MiBs of RSS in every process of a fleet: ``registry.release``).

Each check runs in a child interpreter, so nothing this test session imported counts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.harness import Harness

#: what a worker that meets no failure must not import, and who needs each
NOT_LOADED = {
    "importlib.metadata": "plugin entry points (registry.backends, registry.url, sharding.strategy_loader)",
    "tenacity": "retries after a transient failure (registry.backends.retrying)",
    "urllib.request": "etcd's clock, for max_time_diff_seconds (registry.backends.etcd_conn)",
    "email": "the same clock's Date header",
}

_CHILD = textwrap.dedent(
    """
    import json, sys, threading
    from scheduler import JobConfig, Scheduler

    ran = threading.Event()
    sched = Scheduler(sys.argv[1])
    sched.add_job(JobConfig(name="footprint", cron="* * * * * ?"), lambda ctx: ran.set())
    sched.start()
    try:
        fired = ran.wait(30)
    finally:
        sched.shutdown()
    print(json.dumps({"fired": fired, "loaded": sorted(m for m in sys.argv[2:] if m in sys.modules)}))
    """
)


def test_a_worker_that_meets_no_failure_loads_none_of_the_optional_modules(harness: Harness, namespace: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, harness.url(namespace), *NOT_LOADED],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["fired"], "the job did not fire within 30 s"
    assert {name: NOT_LOADED[name] for name in report["loaded"]} == {}
