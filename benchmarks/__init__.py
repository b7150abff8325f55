"""Side-by-side benchmarks of shardjob and the anchors it is measured against.

Each script measures shardjob and its anchor (the raw client, kazoo's recipe, APScheduler)
in the same run on the same machine, so that ratios, not absolute figures, carry the
result. Run from the repository root: ``.venv/bin/python -m benchmarks.NAME [--quick]``;
``--quick`` finishes in seconds and is what the smoke test runs. Results go to
``benchmarks/results/NAME.json`` (git-ignored).
"""
