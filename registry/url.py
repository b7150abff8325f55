"""Registry URL grammar: ``zk://``, ``zookeeper://``, ``etcd://``, ``memory://``.

Invariant: a malformed URL, unknown scheme or option, or bad value raises ``ValueError``
naming the part that is wrong; the password never appears in a repr or an error.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote

from registry.paths import validate_path
from registry.text_enum import TextEnum

__all__ = ["DEFAULT_MAX_TXN_OPS", "SCHEMES", "Backend", "RegistryURL", "parse_url"]

class Backend(TextEnum):
    """The registry backend a URL names (a ``str``, so ``url.backend == "etcd"`` holds)."""

    MEMORY = "memory"
    ZOOKEEPER = "zookeeper"
    ETCD = "etcd"


SCHEMES = {"zk": Backend.ZOOKEEPER, "zookeeper": Backend.ZOOKEEPER, "etcd": Backend.ETCD, "memory": Backend.MEMORY}

_COMMON_OPTIONS = {"session_timeout": 10.0, "connect_timeout": 5.0}
#: ``max_txn_ops``: the default is every backend's own (etcd's ``--max-txn-ops``); a larger
#: value is for a server set up to take it, and the cap keeps a typo from meaning "unbounded"
DEFAULT_MAX_TXN_OPS = 128
_MAX_TXN_OPS_CAP = 65_536
_ETCD_TLS_OPTIONS = ("ca_cert", "cert_key", "cert_cert")
_HOST_RE = re.compile(r"^(?:\[(?P<v6>[0-9a-fA-F:.]+)\]|(?P<host>[A-Za-z0-9_.\-]+))(?::(?P<port>[^:]*))?$")
_STORE_RE = re.compile(r"^[A-Za-z0-9_.\-]*$")
_DEFAULT_PORTS = {Backend.ZOOKEEPER: 2181, Backend.ETCD: 2379}


@dataclass(frozen=True)
class RegistryURL:
    """A parsed registry URL. ``password`` is excluded from repr and comparisons."""

    backend: Backend | str  # a str: a third party's backend (registry.backends)
    hosts: tuple[tuple[str, int], ...]
    namespace: str  # "" or an absolute path
    session_timeout: float
    connect_timeout: float
    user: str | None = None
    password: str | None = field(default=None, repr=False, compare=False)
    store: str = ""  # memory only
    link: str = ""  # memory only: a named link that tests can cut (see MemoryStore)
    ca_cert: str | None = None
    cert_key: str | None = None
    cert_cert: str | None = None
    #: the most ops one transaction may hold (``max_txn_ops``; ``registry.backends.base``)
    max_txn_ops: int = DEFAULT_MAX_TXN_OPS

    def masked(self) -> str:
        """The URL as text with the password replaced by ``***``."""
        scheme = "zk" if self.backend == Backend.ZOOKEEPER else str(self.backend)
        if self.backend == "memory":
            memory_opts = [f"link={self.link}"] if self.link else []
            if self.max_txn_ops != DEFAULT_MAX_TXN_OPS:
                memory_opts.append(f"max_txn_ops={self.max_txn_ops}")
            query = f"?{'&'.join(memory_opts)}" if memory_opts else ""
            return f"memory://{self.store}{self.namespace}{query}"
        auth = ""
        if self.user is not None:
            auth = f"{self.user}:***@" if self.password is not None else f"{self.user}@"
        hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.hosts)
        opts = [f"session_timeout={self.session_timeout:g}", f"connect_timeout={self.connect_timeout:g}"]
        if self.max_txn_ops != DEFAULT_MAX_TXN_OPS:
            opts.append(f"max_txn_ops={self.max_txn_ops}")
        for name in _ETCD_TLS_OPTIONS:
            value = getattr(self, name)
            if value is not None:
                opts.append(f"{name}={value}")
        return f"{scheme}://{auth}{hosts}{self.namespace}?{'&'.join(opts)}"

    def __str__(self) -> str:
        return self.masked()


def _positive_seconds(name: str, raw: object) -> float:
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"registry URL option {name!r} must be a number of seconds, got {raw!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"registry URL option {name!r} must be > 0 seconds, got {raw!r}")
    return value


def _txn_ops(raw: object) -> int:
    if isinstance(raw, bool) or not isinstance(raw, (int, str)) or not str(raw).isdigit():
        raise ValueError(f"registry URL option 'max_txn_ops' must be a whole number, got {raw!r}")
    value = int(raw)
    if not DEFAULT_MAX_TXN_OPS <= value <= _MAX_TXN_OPS_CAP:
        raise ValueError(
            f"registry URL option 'max_txn_ops' must be between {DEFAULT_MAX_TXN_OPS} (what every"
            f" backend takes) and {_MAX_TXN_OPS_CAP}, got {raw!r}"
        )
    return value


def _plugin_backends() -> set[str]:
    from importlib.metadata import entry_points  # plugins only: it costs MiBs (registry.release)

    from registry.backends import ENTRY_POINT_GROUP

    return {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _split_hosts(backend: Backend | str, netloc: str) -> tuple[tuple[str, int], ...]:
    if not netloc:
        raise ValueError(f"registry URL for {backend} names no host")
    hosts: list[tuple[str, int]] = []
    for part in netloc.split(","):
        match = _HOST_RE.match(part)
        if not match:
            raise ValueError(f"registry URL has a malformed host {part!r}")
        host = match.group("v6") or match.group("host")
        raw_port = match.group("port")
        if raw_port is None:
            if backend not in _DEFAULT_PORTS:
                raise ValueError(f"registry URL for {backend} needs a port in host {part!r}")
            port = _DEFAULT_PORTS[Backend(backend)]
        else:
            if not raw_port.isdigit() or not 0 < int(raw_port) < 65536:
                raise ValueError(f"registry URL has a bad port {raw_port!r} in host {part!r}")
            port = int(raw_port)
        hosts.append((host, port))
    return tuple(hosts)


def parse_url(url: str, **overrides: object) -> RegistryURL:
    """Parse ``url``; keyword ``overrides`` take precedence over its query options.

    A password holding an unencoded reserved character (``/``, ``?``, ``#``, ``@``) breaks
    the URL apart; whatever the complaint, no piece of the text before the last ``@`` is
    echoed in it."""
    try:
        return _parse(url, overrides)
    except ValueError as exc:
        message = str(exc)
        if isinstance(url, str) and "@" in url:
            secret = url.partition("://")[2].rpartition("@")[0]
            for piece in sorted(re.split(r"[/?#:@&=,]", secret), key=len, reverse=True):
                if len(piece) > 1:
                    message = message.replace(piece, "***")
        raise ValueError(message) from None


def _backend_of(scheme: str) -> Backend | str:
    lowered = scheme.lower()
    if lowered in SCHEMES:
        return SCHEMES[lowered]
    if lowered in _plugin_backends():
        return lowered  # a third party's backend, by its entry point's name
    known = sorted({*SCHEMES, *_plugin_backends()})
    raise ValueError(f"registry URL has an unknown scheme {scheme!r}; known: {', '.join(known)}")


def _namespace(raw: str) -> str:
    if raw in ("", "/"):
        return ""
    try:
        validate_path(unquote(raw))
    except ValueError as exc:
        raise ValueError(f"registry URL has a bad namespace: {exc}") from None
    return unquote(raw)


def _query_options(query: str) -> dict[str, object]:
    options: dict[str, object] = {}
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        if key in options:
            raise ValueError(f"registry URL repeats option {key!r}")
        options[key] = value
    if query and not options:
        raise ValueError(f"registry URL has a malformed query {query.split('&')[0]!r}")
    return options


def _tls_options(options: dict[str, object]) -> dict[str, str | None]:
    tls: dict[str, str | None] = {}
    for name in _ETCD_TLS_OPTIONS:
        raw = options.get(name)
        if raw is not None and (not isinstance(raw, str) or not raw):
            raise ValueError(f"registry URL option {name!r} must be a file path")
        tls[name] = raw
    if (tls["cert_key"] is None) != (tls["cert_cert"] is None):
        raise ValueError("registry URL options 'cert_key' and 'cert_cert' must be given together")
    return tls


def _credentials(netloc: str) -> tuple[str | None, str | None, str]:
    """``(user, password, hosts)`` of ``user:password@hosts``; a user needs a password."""
    if "@" not in netloc:
        return None, None, netloc
    userinfo, _, hosts = netloc.rpartition("@")
    raw_user, colon, raw_password = userinfo.partition(":")
    if not raw_user:
        raise ValueError("registry URL has an empty user name before '@'")
    user = unquote(raw_user)
    password = unquote(raw_password) if colon else None
    if password is None or password == "":
        raise ValueError(f"registry URL gives user {user!r} without a password")
    return user, password, hosts


def _memory_url(
    netloc: str,
    namespace: str,
    options: dict[str, object],
    session_timeout: float,
    connect_timeout: float,
    max_txn_ops: int,
) -> RegistryURL:
    if "@" in netloc:
        raise ValueError("memory:// URLs take no user or password")
    if not _STORE_RE.match(netloc):
        raise ValueError(f"memory:// store name {netloc!r} may hold only letters, digits, '_', '.', '-'")
    link = options.get("link", "")
    if not isinstance(link, str) or not _STORE_RE.match(link):
        raise ValueError(
            f"memory:// option 'link' must be a name of letters, digits, '_', '.', '-', got {link!r}"
        )
    return RegistryURL(
        backend=Backend.MEMORY,
        hosts=(),
        link=link,
        namespace=namespace,
        session_timeout=session_timeout,
        connect_timeout=connect_timeout,
        store=netloc,
        max_txn_ops=max_txn_ops,
    )


def _parse(url: str, overrides: dict[str, object]) -> RegistryURL:
    if not isinstance(url, str):
        raise ValueError(f"registry URL must be a str, got {type(url).__name__}")
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError("registry URL has no scheme (expected zk://, etcd:// or memory://)")
    backend = _backend_of(scheme)
    rest, _, fragment = rest.partition("#")
    if fragment:
        raise ValueError("registry URL must not have a fragment ('#...')")
    rest, _, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    namespace = _namespace("/" + path if slash else "")
    options = {**_query_options(query), **overrides}
    from registry.backends import backend_class  # the backend owns its options

    allowed = backend_class(backend).url_options
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ValueError(
            f"unknown registry option {unknown[0]!r} for {backend}; known: {', '.join(sorted(allowed))}"
        )
    session_timeout = _positive_seconds(
        "session_timeout", options.get("session_timeout", _COMMON_OPTIONS["session_timeout"])
    )
    connect_timeout = _positive_seconds(
        "connect_timeout", options.get("connect_timeout", _COMMON_OPTIONS["connect_timeout"])
    )
    max_txn_ops = _txn_ops(options.get("max_txn_ops", DEFAULT_MAX_TXN_OPS))
    if backend == Backend.MEMORY:
        return _memory_url(netloc, namespace, options, session_timeout, connect_timeout, max_txn_ops)
    tls = _tls_options(options)
    user, password, netloc = _credentials(netloc)
    return RegistryURL(
        backend=backend,
        hosts=_split_hosts(backend, netloc),
        namespace=namespace,
        session_timeout=session_timeout,
        connect_timeout=connect_timeout,
        user=user,
        password=password,
        ca_cert=tls["ca_cert"],
        cert_key=tls["cert_key"],
        cert_cert=tls["cert_cert"],
        max_txn_ops=max_txn_ops,
    )
