"""The SCRIPT job of the config-file tests: ``python -m tests.scheduler.file_jobs_script
CONTEXT_JSON`` appends one event, ``{"kind": "script", "job", "item", "job_parameter"}``,
to the file ``SHARDJOB_RECORD_FILE`` names, beside the worker's own events.

Invariant: one line in one ``write`` to a file opened for appending, so lines of
concurrent processes never interleave. Imports nothing of shardjob: it runs per item.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    ctx = json.loads(sys.argv[-1])
    event = {
        "kind": "script",
        "job": ctx["jobName"],
        "item": ctx["shardingItem"],
        "job_parameter": ctx["jobParameter"],
    }
    with open(os.environ["SHARDJOB_RECORD_FILE"], "a", encoding="utf-8") as out:
        out.write(json.dumps(event, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
