"""etcd user authentication and TLS: the right credentials work, wrong ones are refused
with a clear ``RegistryError`` that never shows the password."""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import registry
from registry.errors import RegistryConnectionError, RegistryError
from tests.servers.tls import make_tls_files

#: connect_timeout of the refused connections, and how far past it a refusal may come
CONNECT_TIMEOUT = 3.0
SLACK = 2.5


def _namespace() -> str:
    return "/auth" + uuid.uuid4().hex[:10]


def _texts(exc: BaseException) -> list[str]:
    """Everything a traceback of ``exc`` would print about it and its causes."""
    texts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        texts += [str(current), repr(current)]
        current = current.__cause__ or current.__context__
    return texts


# -- user authentication -------------------------------------------------------------------
def test_right_password_works(etcd_auth_server: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    server = etcd_auth_server
    url = f"etcd://{server.user}:{server.password}@{server.address}{_namespace()}"
    with registry.connect(url) as reg:
        reg.put("/x", b"v")
        assert reg.get("/x") == b"v"
        reg.create("/e", b"e", ephemeral=True)
        assert reg.children("/") == ["e", "x"]
        for text in (repr(reg), reg.url):
            assert server.password not in text
        assert f"{server.user}:***@" in reg.url
    assert server.password not in caplog.text


def test_wrong_password_is_refused_clearly(etcd_auth_server: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    server = etcd_auth_server
    wrong = "Wrong-" + uuid.uuid4().hex[:12]
    start = time.monotonic()
    with pytest.raises(RegistryError) as info:
        registry.connect(
            f"etcd://{server.user}:{wrong}@{server.address}{_namespace()}?connect_timeout={CONNECT_TIMEOUT}"
        )
    assert time.monotonic() - start < CONNECT_TIMEOUT + SLACK
    error = info.value
    assert type(error).__module__.startswith("registry"), type(error)
    assert "auth" in str(error).lower(), str(error)
    assert server.user in str(error)
    for text in _texts(error):
        assert wrong not in text, text
        assert server.password not in text, text
    assert wrong not in caplog.text


def test_unknown_user_is_refused(etcd_auth_server: Any) -> None:
    server = etcd_auth_server
    with pytest.raises(RegistryError) as info:
        registry.connect(
            f"etcd://nobody:{server.password}@{server.address}{_namespace()}?connect_timeout={CONNECT_TIMEOUT}"
        )
    assert "auth" in str(info.value).lower(), str(info.value)
    assert all(server.password not in text for text in _texts(info.value))


def test_no_credentials_on_an_auth_server_fail_clearly(etcd_auth_server: Any) -> None:
    server = etcd_auth_server
    try:
        reg = registry.connect(f"etcd://{server.address}{_namespace()}?connect_timeout={CONNECT_TIMEOUT}")
    except RegistryError as exc:
        assert str(exc), "an empty error message"
        return
    try:
        with pytest.raises(RegistryError) as info:
            reg.put("/x", b"v")
        assert str(info.value)
    finally:
        reg.close()


# -- TLS -----------------------------------------------------------------------------------
def _tls_url(address: str, ca: Path | None, cert: Path | None, key: Path | None) -> str:
    options = [f"connect_timeout={CONNECT_TIMEOUT}"]
    if ca is not None:
        options.append(f"ca_cert={ca}")
    if cert is not None and key is not None:
        options += [f"cert_key={key}", f"cert_cert={cert}"]
    return f"etcd://{address}{_namespace()}?{'&'.join(options)}"


def test_tls_with_client_certificate_works(etcd_tls_server: Any) -> None:
    tls = etcd_tls_server.tls
    with registry.connect(_tls_url(etcd_tls_server.address, tls.ca, tls.cert, tls.key)) as reg:
        reg.put("/x", b"v")
        assert reg.get("/x") == b"v"
        events: list[object] = []
        reg.watch("/x", events.append)
        reg.put("/x", b"w")
        assert reg.flush_events(5)
        assert reg.get("/x") == b"w"


def _assert_tls_failure(error: BaseException) -> None:
    assert isinstance(error, RegistryConnectionError), repr(error)
    text = str(error)
    assert text, "an empty error message"
    assert any(word in text.lower() for word in ("tls", "ssl", "certificate", "handshake")), text


def test_wrong_ca_fails_clearly(etcd_tls_server: Any, tmp_path: Path) -> None:
    other = make_tls_files(tmp_path / "other-ca")
    tls = etcd_tls_server.tls
    start = time.monotonic()
    with pytest.raises(RegistryError) as info:
        registry.connect(_tls_url(etcd_tls_server.address, other.ca, tls.cert, tls.key))
    assert time.monotonic() - start < CONNECT_TIMEOUT + SLACK
    _assert_tls_failure(info.value)


def test_client_certificate_from_another_ca_fails_clearly(etcd_tls_server: Any, tmp_path: Path) -> None:
    other = make_tls_files(tmp_path / "other-client")
    with pytest.raises(RegistryError) as info:
        registry.connect(_tls_url(etcd_tls_server.address, etcd_tls_server.tls.ca, other.cert, other.key))
    assert str(info.value)


def test_plaintext_client_on_a_tls_server_fails_within_connect_timeout(etcd_tls_server: Any) -> None:
    start = time.monotonic()
    with pytest.raises(RegistryConnectionError):
        registry.connect(_tls_url(etcd_tls_server.address, None, None, None))
    assert time.monotonic() - start < CONNECT_TIMEOUT + SLACK


def test_missing_certificate_file_is_named(etcd_tls_server: Any, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.pem"
    with pytest.raises((ValueError, RegistryError)) as info:
        registry.connect(_tls_url(etcd_tls_server.address, missing, None, None))
    assert "nowhere.pem" in str(info.value) or "ca_cert" in str(info.value), str(info.value)
