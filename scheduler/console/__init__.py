"""The web console (``shardjob console``): jobs, servers and run history in a browser, and
the operator's actions behind a login.

Needs the ``console`` extra (Starlette, uvicorn, Jinja2); importing this package without it
raises ``ConsoleUnavailable`` naming the command that installs it, so the library itself
stays lean. ``LiveView`` (``scheduler.console.live_view``) needs nothing extra.
"""

from __future__ import annotations

from registry.errors import ShardJobError

__all__ = ["INSTALL_HINT", "ConsoleUnavailable", "require_console_extra"]

INSTALL_HINT = "pip install 'shardjob[console]'"


class ConsoleUnavailable(ShardJobError):
    """The console was asked for but its optional dependencies are not installed."""


def require_console_extra() -> None:
    """``ConsoleUnavailable`` unless Starlette, uvicorn and Jinja2 import."""
    import importlib.util

    # python-multipart installs the module python_multipart (and, deprecated, multipart)
    wanted = {"starlette": "starlette", "uvicorn": "uvicorn", "jinja2": "jinja2", "python_multipart": "python-multipart"}
    missing = [package for module, package in wanted.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise ConsoleUnavailable(f"the console needs {', '.join(missing)}: {INSTALL_HINT}")
