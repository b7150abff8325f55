"""Who may act on the console: one admin, a password kept only as a salted hash, sessions
in signed cookies, and a CSRF token per session.

Invariants:
- the admin password is never stored, logged or rendered: ``AdminPassword`` keeps a
  scrypt hash with a random salt and compares with ``hmac.compare_digest``;
- a session cookie is ``base64(json).base64(hmac-sha256)`` under a secret drawn at random
  per process (a restart logs everyone out; nothing to leak or rotate), and carries its
  own expiry; a cookie whose signature or expiry does not check is no session at all;
- every session, a guest's too, has a random CSRF token; every form POST must echo it
  (checked with ``compare_digest``); HTTP basic auth (the API's scripts) needs none,
  since a browser never sends it unasked to a page of another site.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ADMIN",
    "PASSWORD_ENV",
    "AdminPassword",
    "Session",
    "SessionCodec",
    "basic_credentials",
    "load_password",
]

#: the one user who may act
ADMIN = "admin"
#: where the admin password comes from unless ``--password-file`` is given (pinned)
PASSWORD_ENV = "SHARDJOB_CONSOLE_PASSWORD"
#: how long a session lasts without a new login
SESSION_SECONDS = 12 * 3600

# scrypt's cost: ~16 MiB and a few tens of milliseconds per check
_SCRYPT = {"n": 2**14, "r": 8, "p": 1}


class AdminPassword:
    """A salted scrypt hash of the admin password (the password itself is dropped)."""

    def __init__(self, password: str) -> None:
        if not password:
            raise ValueError("the console's admin password is empty")
        self._salt = secrets.token_bytes(16)
        self._hash = self._derive(password)

    def _derive(self, password: str) -> bytes:
        return hashlib.scrypt(password.encode("utf-8"), salt=self._salt, dklen=32, **_SCRYPT)

    def check(self, user: str, password: str) -> bool:
        good_user = hmac.compare_digest(user.encode("utf-8"), ADMIN.encode())
        good_password = hmac.compare_digest(self._derive(password), self._hash)
        return good_user and good_password

    def __repr__(self) -> str:
        return "AdminPassword(<hidden>)"


def load_password(password_file: str | None) -> AdminPassword | None:
    """The admin password from ``password_file`` (first line) or ``$SHARDJOB_CONSOLE_PASSWORD``;
    None when neither is set (the console is then read-only)."""
    if password_file:
        try:
            text = Path(password_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"--password-file {password_file}: {exc.strerror or exc}") from None
        lines = text.splitlines()
        password = lines[0] if lines else ""
        if not password:
            raise ValueError(f"--password-file {password_file}: the first line (the password) is empty")
        return AdminPassword(password)
    password = os.environ.get(PASSWORD_ENV, "")
    return AdminPassword(password) if password else None


@dataclass
class Session:
    """What the signed cookie carries."""

    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    user: str | None = None
    #: one message for the next page (an action's outcome), with its kind (ok / error)
    flash: tuple[str, str] | None = None
    expires: float = field(default_factory=lambda: time.time() + SESSION_SECONDS)

    @property
    def admin(self) -> bool:
        return self.user == ADMIN

    def csrf_ok(self, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(token.encode("utf-8"), self.csrf.encode("utf-8"))


class SessionCodec:
    """Signs and checks session cookies with a per-process random secret."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret if secret is not None else secrets.token_bytes(32)

    def encode(self, session: Session) -> str:
        body: dict[str, Any] = {"c": session.csrf, "u": session.user, "f": session.flash, "e": session.expires}
        payload = base64.urlsafe_b64encode(json.dumps(body, separators=(",", ":")).encode()).decode()
        return f"{payload}.{self._sign(payload)}"

    def decode(self, cookie: str | None) -> Session | None:
        """The session of a cookie; None for a missing, forged or expired one."""
        if not cookie or "." not in cookie:
            return None
        payload, signature = cookie.rsplit(".", 1)
        if not hmac.compare_digest(signature.encode(), self._sign(payload).encode()):
            return None
        try:
            body = json.loads(base64.urlsafe_b64decode(payload.encode()))
            csrf, user, flash, expires = body["c"], body["u"], body["f"], float(body["e"])
        except (ValueError, KeyError, TypeError, binascii.Error):
            return None
        if expires < time.time() or not isinstance(csrf, str):
            return None
        return Session(
            csrf=csrf,
            user=user if isinstance(user, str) else None,
            flash=(str(flash[0]), str(flash[1])) if isinstance(flash, list) and len(flash) == 2 else None,
            expires=expires,
        )

    def _sign(self, payload: str) -> str:
        digest = hmac.new(self._secret, payload.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def basic_credentials(header: str | None) -> tuple[str, str] | None:
    """``(user, password)`` of an ``Authorization: Basic ...`` header; None otherwise."""
    if not header:
        return None
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else None
