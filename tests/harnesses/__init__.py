"""Harnesses: one per backend, each implementing ``tests.harness.Harness``."""
