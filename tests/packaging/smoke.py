"""The smoke run of an installed shardjob, run by a fresh virtual environment's Python (by
path, with ``-I``) and judged by tests/packaging/test_installs.py from the JSON report it
prints as its last line of output.

Invariants: it imports nothing from tests/ nor from the checkout (``-I`` keeps the script's
folder, the working directory and PYTHONPATH off ``sys.path``), so what it exercises is the
installed wheel; it records facts and leaves judging them to the test, raising only when it
cannot go on; every wait is bounded.

    python -I smoke.py [--registry URL ...] [--unavailable URL ...] [--missing-extras]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any

#: a cron job's first fire comes within a second of the election, which on a real server
#: takes a few round trips: far below this
RUN_TIMEOUT = 30.0
#: a CLI call here does at most one short demo; the bound only keeps a hang from lasting
CLI_TIMEOUT = 60.0
#: the smoke job's items: each must be seen once for the run to count
ITEMS = 2
#: a ``worker --config`` file that ``shardjob check`` must accept: its TOML parser is
#: tomllib, or on 3.10 tomli, which only a marked requirement installs
CHECK_FILE = """registry = "memory://smoke-check"
[jobs.nightly]
job_type = "script"
script_command_line = "${SHARDJOB_SMOKE_COMMAND:-true}"
cron = "0 30 2 * * ?"
"""


def _cli(*args: str) -> dict[str, Any]:
    """Run the installed console script (next to this Python) and keep what it said."""
    script = Path(sys.executable).parent / "shardjob"
    done = subprocess.run([str(script), *args], capture_output=True, text=True, timeout=CLI_TIMEOUT)
    return {"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr}


def _where() -> dict[str, Any]:
    import registry
    import scheduler
    import sharding

    return {
        "python": ".".join(map(str, sys.version_info[:3])),
        "prefix": sys.prefix,
        "modules": {m.__name__: str(Path(m.__file__ or "").resolve()) for m in (registry, sharding, scheduler)},
        "distributions": sorted({str(d.metadata["Name"]).lower() for d in metadata.distributions()}),
        "version": metadata.version("shardjob"),
    }


def _one_job(url: str) -> dict[str, Any]:
    """A job with an every-second cron on a fresh namespace of ``url``, run until each of
    its items was seen once (or ``RUN_TIMEOUT``); the contexts its function received."""
    from scheduler import JobConfig, Scheduler, ShardingContext

    base, _, query = url.partition("?")
    url = f"{base.rstrip('/')}/smoke-{uuid.uuid4().hex[:8]}" + (f"?{query}" if query else "")
    seen: list[ShardingContext] = []
    lock = threading.Lock()
    all_items = threading.Event()

    def job(ctx: ShardingContext) -> None:
        with lock:
            seen.append(ctx)
            if {c.sharding_item for c in seen} >= set(range(ITEMS)):
                all_items.set()

    started = time.monotonic()
    sched = Scheduler(url)
    sched.add_job(
        JobConfig(
            name="smoke",
            cron="* * * * * ?",
            sharding_total_count=ITEMS,
            sharding_item_parameters="0=zero,1=one",
        ),
        job,
    )
    sched.start()
    try:
        fired = all_items.wait(RUN_TIMEOUT)
    finally:
        sched.shutdown(wait=True)
    with lock:
        contexts = [dataclasses.asdict(ctx) for ctx in seen]
    return {
        "url": url,
        "fired": fired,
        "seconds": round(time.monotonic() - started, 2),
        "contexts": contexts,
    }


def _unavailable(url: str) -> dict[str, Any]:
    """What asking for a backend whose extra is missing gives, in Python and at the CLI."""
    import registry
    from registry.backends import BackendUnavailable

    found: dict[str, Any] = {"error": None, "message": None, "is_shardjob_error": None}
    try:
        registry.connect(url).close()
    except BackendUnavailable as exc:
        found.update(error=type(exc).__name__, message=str(exc), is_shardjob_error=isinstance(exc, registry.ShardJobError))
    found["cli"] = _cli("jobs", "--registry", url)
    return found


def _missing_extras(workdir: Path) -> dict[str, Any]:
    """The optional extras other than the backends, asked for without them installed."""
    from scheduler import Scheduler
    from scheduler.metrics import MetricsUnavailable

    sched = Scheduler(f"memory://smoke-metrics-{uuid.uuid4().hex[:8]}")
    try:
        sched.serve_http("127.0.0.1:0").close()
        metrics: str | None = None
    except MetricsUnavailable as exc:
        metrics = str(exc)
    return {
        "metrics": metrics,
        "history": _cli("history", "--history", f"sqlite:///{workdir / 'history.db'}"),
        "console": _cli("console", "--registry", "memory://smoke-console", "--listen", "127.0.0.1:0"),
    }


def _check(workdir: Path) -> dict[str, Any]:
    """``shardjob check --config`` on ``CHECK_FILE``."""
    path = workdir / "jobs.toml"
    path.write_text(CHECK_FILE, encoding="utf-8")
    return _cli("check", "--config", str(path))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--registry", action="append", default=[], metavar="URL", help="run the one-job smoke on it")
    parser.add_argument("--unavailable", action="append", default=[], metavar="URL", help="a backend not installed")
    parser.add_argument("--missing-extras", action="store_true", help="check console, history, metrics are missing")
    args = parser.parse_args()
    report: dict[str, Any] = _where()
    report["cli_version"] = _cli("--version")
    report["demo"] = _cli("demo", "--fires", "1")
    with tempfile.TemporaryDirectory() as workdir:
        report["check"] = _check(Path(workdir))
    report["runs"] = [_one_job(url) for url in args.registry]
    report["unavailable"] = {url: _unavailable(url) for url in args.unavailable}
    if args.missing_extras:
        with tempfile.TemporaryDirectory() as workdir:
            report["missing_extras"] = _missing_extras(Path(workdir))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
