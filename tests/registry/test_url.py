"""Unit tests of ``registry.url.parse_url``: the pinned URL grammar, a clear ``ValueError``
naming the wrong part of a bad URL, and a password that shows nowhere."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import registry
from registry.url import RegistryURL, parse_url

SECRET = "Zx9-secret-Q"


# -- good URLs -----------------------------------------------------------------------------
def test_zookeeper_url_with_everything() -> None:
    parsed = parse_url("zk://h1:2181,h2:2182/ns/sub?session_timeout=3&connect_timeout=1.5")
    assert parsed.backend == "zookeeper"
    assert parsed.hosts == (("h1", 2181), ("h2", 2182))
    assert parsed.namespace == "/ns/sub"
    assert parsed.session_timeout == 3.0
    assert parsed.connect_timeout == 1.5
    assert parsed.user is None and parsed.password is None


@pytest.mark.parametrize(
    ("url", "backend", "port"),
    [
        ("zk://host", "zookeeper", 2181),
        ("zookeeper://host", "zookeeper", 2181),
        ("ZK://host", "zookeeper", 2181),
        ("etcd://host", "etcd", 2379),
        ("Etcd://host", "etcd", 2379),
    ],
)
def test_schemes_and_default_ports(url: str, backend: str, port: int) -> None:
    parsed = parse_url(url)
    assert parsed.backend == backend
    assert parsed.hosts == (("host", port),)
    assert parsed.namespace == ""


def test_defaults() -> None:
    parsed = parse_url("etcd://127.0.0.1:2379")
    assert parsed.session_timeout == 10.0
    assert parsed.connect_timeout == 5.0
    assert parsed.ca_cert is None and parsed.cert_key is None and parsed.cert_cert is None


def test_ipv6_hosts() -> None:
    parsed = parse_url("zk://[::1]:2181,[fe80::1]/ns")
    assert parsed.hosts == (("::1", 2181), ("fe80::1", 2181))
    assert parse_url(parsed.masked()).hosts == parsed.hosts


@pytest.mark.parametrize("url", ["zk://h/", "zk://h", "etcd://h:1/?session_timeout=2"])
def test_root_namespace_is_none(url: str) -> None:
    assert parse_url(url).namespace == ""


def test_percent_encoded_namespace_and_credentials() -> None:
    parsed = parse_url("zk://us%40er:p%40ss%2Fw%3Ard@h/name%20space")
    assert parsed.user == "us@er"
    assert parsed.password == "p@ss/w:rd"
    assert parsed.namespace == "/name space"


def test_credentials() -> None:
    parsed = parse_url(f"etcd://root:{SECRET}@h:2379/ns")
    assert parsed.user == "root"
    assert parsed.password == SECRET
    assert parsed.hosts == (("h", 2379),)


def test_password_with_at_sign_unencoded() -> None:
    parsed = parse_url("zk://u:p@ss@h:1")
    assert parsed.password == "p@ss"
    assert parsed.hosts == (("h", 1),)


def test_etcd_tls_options() -> None:
    parsed = parse_url("etcd://h?ca_cert=/ca.pem&cert_key=/c.key&cert_cert=/c.pem")
    assert (parsed.ca_cert, parsed.cert_key, parsed.cert_cert) == ("/ca.pem", "/c.key", "/c.pem")
    assert parse_url("etcd://h?ca_cert=/ca.pem").ca_cert == "/ca.pem"


def test_overrides_beat_the_query() -> None:
    parsed = parse_url("zk://h?session_timeout=3", session_timeout=4, connect_timeout="2.5")
    assert parsed.session_timeout == 4.0
    assert parsed.connect_timeout == 2.5


def test_memory_urls() -> None:
    assert parse_url("memory://").backend == "memory"
    assert parse_url("memory://").store == ""
    parsed = parse_url("memory://demo/ns/sub?session_timeout=2&link=l1")
    assert (parsed.store, parsed.namespace, parsed.session_timeout, parsed.link) == (
        "demo",
        "/ns/sub",
        2.0,
        "l1",
    )
    assert parse_url("memory:///ns").namespace == "/ns"
    assert parse_url("memory:///ns").store == ""
    assert parsed.hosts == ()


def test_max_txn_ops_defaults_to_what_every_backend_takes() -> None:
    assert parse_url("etcd://h/ns").max_txn_ops == 128
    assert parse_url("zk://h/ns?max_txn_ops=1024").max_txn_ops == 1024
    assert parse_url("memory://s/ns?max_txn_ops=256").max_txn_ops == 256
    assert parse_url("etcd://h", max_txn_ops=512).max_txn_ops == 512
    raised = parse_url("etcd://h/ns?max_txn_ops=1024")
    assert "max_txn_ops=1024" in raised.masked() and parse_url(raised.masked()) == raised
    assert parse_url(parse_url("memory://s/ns?max_txn_ops=256").masked()).max_txn_ops == 256
    assert "max_txn_ops" not in parse_url("etcd://h").masked()  # the default is not spelt out


@pytest.mark.parametrize("value", ["127", "0", "-1", "abc", "1.5", "65537", "1e3"])
def test_a_bad_max_txn_ops_is_named(value: str) -> None:
    with pytest.raises(ValueError, match="max_txn_ops") as info:
        parse_url(f"etcd://h/ns?max_txn_ops={value}")
    assert repr(value) in str(info.value)


def test_masked_round_trips() -> None:
    parsed = parse_url(f"zk://u:{SECRET}@h1:1,h2:2/ns?session_timeout=3&connect_timeout=4")
    again = parse_url(parsed.masked())
    assert again == parsed  # the password takes no part in comparisons
    assert again.password == "***"
    memory = parse_url("memory://s/ns?link=x")
    assert parse_url(memory.masked()) == memory


def test_urls_equal_regardless_of_password() -> None:
    assert parse_url("zk://u:a@h") == parse_url("zk://u:b@h")


# -- bad URLs: each a ValueError naming the part that is wrong ----------------------------
@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("localhost:2181", "scheme"),
        ("", "scheme"),
        ("redis://h", "redis"),
        ("http://h", "http"),
        ("zk://h#frag", "fragment"),
        ("zk://", "host"),
        ("zk:///ns", "host"),
        ("etcd://h:abc", "abc"),
        ("etcd://h:0", "port"),
        ("etcd://h:70000", "70000"),
        ("etcd://h:", "port"),
        ("zk://h1:1,,h2:2", "host"),
        ("zk://h h:1", "h h"),
        ("zk://h:1:2", "h:1:2"),
        ("zk://[::1:2181", "host"),
        ("zk://h/a//b", "namespace"),
        ("zk://h/a/", "namespace"),
        ("zk://h/a/../b", "namespace"),
        ("zk://h?foo=1", "foo"),
        ("zk://h?ca_cert=/x", "ca_cert"),
        ("memory://?session_timeout=1&host=x", "host"),
        ("zk://h?session_timeout=abc", "session_timeout"),
        ("zk://h?session_timeout=0", "session_timeout"),
        ("zk://h?session_timeout=-1", "session_timeout"),
        ("zk://h?session_timeout=inf", "session_timeout"),
        ("zk://h?session_timeout=nan", "session_timeout"),
        ("zk://h?connect_timeout=", "connect_timeout"),
        ("zk://h?session_timeout=1&session_timeout=2", "session_timeout"),
        ("etcd://h?cert_key=/k", "cert_cert"),
        ("etcd://h?cert_cert=/c", "cert_key"),
        ("etcd://h?ca_cert=", "ca_cert"),
        ("zk://user@h", "password"),
        ("zk://user:@h", "password"),
        ("zk://:pw@h", "user"),
        ("memory://bad store", "store"),
        ("memory://s?link=a/b", "link"),
        ("memory://u:pw@s", "password"),
    ],
)
def test_bad_url_names_the_part(url: str, named: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_url(url)
    assert named.lower() in str(info.value).lower(), str(info.value)


@pytest.mark.parametrize("value", [None, 1, b"zk://h"], ids=["none", "int", "bytes"])
def test_url_must_be_a_str(value: object) -> None:
    with pytest.raises(ValueError, match="str"):
        parse_url(value)  # type: ignore[arg-type]


def test_bad_override_is_named() -> None:
    with pytest.raises(ValueError, match="session_timeout"):
        parse_url("zk://h", session_timeout="soon")
    with pytest.raises(ValueError, match="retries"):
        parse_url("zk://h", retries=3)


def test_connect_rejects_a_bad_url_before_touching_the_network() -> None:
    with pytest.raises(ValueError, match="unknown scheme"):
        registry.connect("mysql://h")
    with pytest.raises(ValueError, match="frobnicate"):
        registry.connect("memory://", frobnicate=True)


# -- the password shows nowhere ---------------------------------------------------------
def _assert_hidden(parsed: RegistryURL, secret: str) -> None:
    for text in (repr(parsed), str(parsed), parsed.masked()):
        assert secret not in text, text


def test_password_not_in_repr_or_str() -> None:
    parsed = parse_url(f"zk://alice:{SECRET}@h:2181/ns")
    _assert_hidden(parsed, SECRET)
    assert "alice:***@" in str(parsed)


@pytest.mark.parametrize(
    "url",
    [
        "zk://u:{pw}@h:abc",
        "zk://u:{pw}@h:0",
        "zk://u:{pw}@h/a//b",
        "zk://u:{pw}@h?foo=1",
        "zk://u:{pw}@h?session_timeout=x",
        "zk://u:{pw}@h#frag",
        "zk://u:{pw}@",
        "zk://u:{pw}@h h",
        "memory://u:{pw}@store",
        "redis://u:{pw}@h",
        "etcd://u:{pw}@h?cert_key=/k",
    ],
)
def test_password_not_in_errors(url: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_url(url.format(pw=SECRET))
    assert SECRET not in str(info.value)
    assert SECRET not in repr(info.value)


@pytest.mark.parametrize("separator", ["/", "?", "#"])
def test_password_with_unencoded_reserved_character_not_in_errors(separator: str) -> None:
    # a password that breaks the URL apart must not be echoed piecewise in the complaint
    head, tail = "Hunter2secret", "Tail7secret"
    try:
        parse_url(f"zk://user:{head}{separator}{tail}@h:2181/ns")
    except ValueError as exc:
        assert head not in str(exc), str(exc)
        assert tail not in str(exc), str(exc)


# -- properties ----------------------------------------------------------------------------
_LABEL = st.from_regex(r"[a-z0-9]([a-z0-9\-]{0,10}[a-z0-9])?", fullmatch=True)
_HOSTNAME = st.lists(_LABEL, min_size=1, max_size=3).map(".".join)
_IPV6 = st.ip_addresses(v=6).map(str)
_HOST = st.one_of(_HOSTNAME, _IPV6)
_PORT = st.integers(min_value=1, max_value=65535)
_SEGMENT = st.text(st.characters(codec="utf-8", blacklist_characters="/\x00"), min_size=1, max_size=8).filter(
    lambda s: s not in {".", ".."}
)
_NAMESPACE = st.lists(_SEGMENT, max_size=3).map(lambda segs: "".join("/" + s for s in segs))
_SECONDS = st.floats(min_value=0.001, max_value=1e6, allow_nan=False, allow_infinity=False)
_CREDENTIAL = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)


def _host_text(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@given(
    scheme=st.sampled_from(["zk", "zookeeper", "etcd"]),
    hosts=st.lists(st.tuples(_HOST, _PORT), min_size=1, max_size=4),
    namespace=_NAMESPACE,
    session_timeout=_SECONDS,
    connect_timeout=_SECONDS,
    credentials=st.none() | st.tuples(_CREDENTIAL, _CREDENTIAL),
)
# the password's text inside a namespace that repr escapes
@example("zk", [("::", 1)], "/\U0002fa1e/1111", 1.0, 1.0, ("0", "1111"))
# a password that is also text every repr holds ("None", an unset field's value)
@example("zk", [("::", 1)], "", 1.0, 1.0, ("0", "None"))
def test_valid_urls_round_trip(
    scheme: str,
    hosts: list[tuple[str, int]],
    namespace: str,
    session_timeout: float,
    connect_timeout: float,
    credentials: tuple[str, str] | None,
) -> None:
    def url_with(credentials: tuple[str, str] | None) -> str:
        auth = (
            "" if credentials is None else f"{quote(credentials[0], safe='')}:{quote(credentials[1], safe='')}@"
        )
        return (
            f"{scheme}://{auth}{','.join(_host_text(h, p) for h, p in hosts)}"
            f"{quote(namespace, safe='/')}?session_timeout={session_timeout!r}&connect_timeout={connect_timeout!r}"
        )

    parsed = parse_url(url_with(credentials))
    assert parsed.hosts == tuple(hosts)
    assert parsed.namespace == namespace
    assert parsed.session_timeout == session_timeout
    assert parsed.connect_timeout == connect_timeout
    if credentials is None:
        assert parsed.user is None and parsed.password is None
    else:
        assert (parsed.user, parsed.password) == credentials
        # the password shows nowhere: the same URL with another password reads the same.
        # (Looking for the password's text would fail by chance: a password "None" is in
        # every repr, as the value of an unset field.)
        other = parse_url(url_with((credentials[0], credentials[1] + "#other")))
        assert other.password != parsed.password
        assert (repr(other), str(other)) == (repr(parsed), str(parsed))


@given(store=st.from_regex(r"[A-Za-z0-9_.\-]{0,12}", fullmatch=True), namespace=_NAMESPACE)
def test_memory_urls_round_trip(store: str, namespace: str) -> None:
    parsed = parse_url(f"memory://{store}{quote(namespace, safe='/')}")
    assert (parsed.backend, parsed.store, parsed.namespace) == ("memory", store, namespace)
