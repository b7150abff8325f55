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
    missing = []
    for module in ("starlette", "uvicorn", "jinja2", "multipart"):
        try:
            __import__(module)
        except ImportError:
            missing.append("python-multipart" if module == "multipart" else module)
    if missing:
        raise ConsoleUnavailable(f"the console needs {', '.join(missing)}: {INSTALL_HINT}")
