"""Test suite of shardjob: a package so that ``tests.harness``, ``tests.servers`` and
``python -m tests.participant`` import the same way from pytest and from child processes."""
