"""A module that fails on import with something other than ImportError, for the config-file
tests: a target in it must be reported as such, not crash the loader."""

raise RuntimeError("broken on purpose")
