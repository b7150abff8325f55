"""shardjob's version as installed: defined once, as pyproject's ``version``, and read from
the installed metadata rather than kept in a ``__version__`` a release could bump in one
place and not the other. Hazard: an editable install reports the version it was installed
with until it is installed again."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["installed_version"]


def installed_version() -> str:
    try:
        return version("shardjob")
    except PackageNotFoundError:  # imported from a source tree that was never installed
        return "unknown (not installed)"
