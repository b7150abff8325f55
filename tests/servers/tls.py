"""Throw-away certificates for the TLS tests, made with the ``openssl`` command line.

Invariant: everything lives in the directory the caller gives (a pytest temp dir): a CA,
a server certificate valid for ``127.0.0.1`` and ``localhost`` (subjectAltName), and a
client certificate for mutual TLS, all signed by that CA and valid for two days.
"""

from __future__ import annotations

import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

from tests.servers.process import run_tool

__all__ = ["TLSFiles", "make_tls_files"]

_KEY_ARGS = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@dataclass(frozen=True)
class TLSFiles:
    """PEM paths: ``ca`` trusts both sides; ``cert``/``key`` are the client's."""

    ca: Path
    cert: Path
    key: Path
    server_cert: Path
    server_key: Path


def _openssl(*args: str) -> None:
    result = run_tool(["openssl", *args], timeout=30.0)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {result.stderr.strip()}")


def _signed(
    directory: Path, name: str, subject: str, extensions: str, ca: Path, ca_key: Path
) -> tuple[Path, Path]:
    key, csr, cert, ext = (directory / f"{name}{suffix}" for suffix in (".key", ".csr", ".pem", ".ext"))
    ext.write_text(extensions)
    _openssl("req", "-new", *_KEY_ARGS, "-keyout", str(key), "-out", str(csr), "-subj", subject)
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-set_serial",
        str(secrets.randbelow(2**62) + 1), "-days", "2", "-sha256",
        "-extfile", str(ext), "-out", str(cert),
    )  # fmt: skip
    return cert, key


def make_tls_files(directory: Path) -> TLSFiles:
    """Create a CA, a server and a client certificate in ``directory``."""
    if shutil.which("openssl") is None:
        raise RuntimeError("no 'openssl' on PATH (apt-get install openssl)")
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = directory / "ca.pem", directory / "ca.key"
    _openssl(
        "req", "-x509", *_KEY_ARGS, "-keyout", str(ca_key), "-out", str(ca), "-days", "2", "-sha256",
        "-subj", "/CN=shardjob test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    server_cert, server_key = _signed(
        directory,
        "server",
        "/CN=127.0.0.1",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth,clientAuth\n",
        ca,
        ca_key,
    )
    cert, key = _signed(
        directory,
        "client",
        "/CN=shardjob-test-client",
        "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n",
        ca,
        ca_key,
    )
    return TLSFiles(ca=ca, cert=cert, key=key, server_cert=server_cert, server_key=server_key)
