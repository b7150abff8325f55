"""Where the benchmarks' measured processes run: ``benchmarks.placement``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from benchmarks import placement
from benchmarks.common import REPO_ROOT

CPUS = sorted(os.sched_getaffinity(0))


def _in_child(code: str) -> object:
    """What ``code`` (run in a fresh interpreter, from the repository) prints as JSON."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return json.loads(out)


def test_shared_pins_nothing() -> None:
    assert placement.measured_cpus(placement.SHARED) == []


def test_an_unknown_placement_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'beside'"):
        placement.measured_cpus("beside")


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to leave one to the servers")
def test_apart_keeps_the_last_cpu_free_and_the_pin_holds_for_threads_started_after() -> None:
    two = CPUS[:2]
    seen = _in_child(
        f"""
        import json, os, threading
        from benchmarks import placement
        os.sched_setaffinity(0, {set(two)!r})  # a process allowed two CPUs
        cpus = placement.measured_cpus(placement.APART)
        placement.pin(cpus)
        found = {{}}
        thread = threading.Thread(target=lambda: found.update(thread=sorted(os.sched_getaffinity(0))))
        thread.start()
        thread.join()
        print(json.dumps({{"cpus": cpus, "main": sorted(os.sched_getaffinity(0)), **found}}))
        """
    )
    assert seen == {"cpus": two[:1], "main": two[:1], "thread": two[:1]}


def test_apart_pins_nothing_on_one_cpu() -> None:
    seen = _in_child(
        f"""
        import json, os
        from benchmarks import placement
        os.sched_setaffinity(0, {{{CPUS[0]}}})
        cpus = placement.measured_cpus(placement.APART)
        placement.pin(cpus)
        print(json.dumps({{"cpus": cpus, "main": sorted(os.sched_getaffinity(0))}}))
        """
    )
    assert seen == {"cpus": [], "main": [CPUS[0]]}


def test_the_report_says_where_the_processes_ran() -> None:
    assert "pinned to CPU 0 of the machine's 2" in placement.describe(placement.APART, [0], 2)
    assert "pinned to CPUs 0, 1, 2 of the machine's 4" in placement.describe(placement.APART, [0, 1, 2], 4)
    assert "share all 2 CPUs" in placement.describe(placement.SHARED, [], 2)


def test_a_document_says_its_placement_and_an_older_one_says_nothing() -> None:
    document = placement.placement_fields(placement.APART, [1, 0])
    assert document["measured_cpus"] == [0, 1] and document["machine_cpus"] == len(CPUS)
    assert placement.placement_sentence(document).startswith(" Each measured process is pinned to CPUs 0, 1")
    assert placement.placement_sentence({"results": []}) == ""  # a run from before the option
