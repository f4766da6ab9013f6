"""AMQP URL parsing (pure: no broker, no event loop)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from harness.tls import TLSMaterial

from ojs_anyio import amqp
from ojs_anyio.amqp import AMQPURL, InvalidURL, parse_url

#: Pure test module: runs under ``pytest -m "not broker"`` (see tests/conftest.py).

# ---------------------------------------------------------------------- schemes, ports, hosts


@pytest.mark.parametrize(
    ("url", "scheme", "port"),
    [
        ("amqp://broker", "amqp", 5672),
        ("amqps://broker", "amqps", 5671),
        ("AMQP://broker", "amqp", 5672),
        ("amqp://broker:5673", "amqp", 5673),
        ("amqps://broker:15671/", "amqps", 15671),
        ("amqp://broker:/", "amqp", 5672),
    ],
)
def test_scheme_and_default_port(url: str, scheme: str, port: int) -> None:
    parsed = parse_url(url)
    assert parsed.scheme == scheme
    assert parsed.tls is (scheme == "amqps")
    assert parsed.hosts == (("broker", port),)
    assert (parsed.host, parsed.port) == ("broker", port)


def test_defaults_when_everything_is_absent() -> None:
    parsed = parse_url("amqp://")
    assert parsed.hosts == (("localhost", 5672),)
    assert (parsed.username, parsed.password, parsed.virtual_host) == ("guest", "guest", "/")
    assert parsed.heartbeat is None
    assert parsed.connection_timeout is None
    assert parsed.auth_mechanism == "PLAIN"
    assert parsed.verify is True
    assert parsed.ssl_context() is None  # plain amqp: no TLS


def test_multi_host() -> None:
    parsed = parse_url("amqp://u:p@h1,h2:5673,[::1]:5674/vh")
    assert parsed.hosts == (("h1", 5672), ("h2", 5673), ("::1", 5674))
    assert parsed.virtual_host == "vh"
    assert parsed.with_host(1).hosts == (("h2", 5673), ("::1", 5674), ("h1", 5672))
    assert parsed.with_host(3).hosts == parsed.hosts


def test_multi_host_amqps_default_port() -> None:
    assert parse_url("amqps://a,b:1/").hosts == (("a", 5671), ("b", 1))


# ---------------------------------------------------------------------- user, password, vhost


@pytest.mark.parametrize(
    ("url", "vhost"),
    [
        ("amqp://h", "/"),
        ("amqp://h/", "/"),
        ("amqp://h/%2f", "/"),
        ("amqp://h/%2F", "/"),
        ("amqp://h/prod", "prod"),
        ("amqp://h/%2Fprod%20eu", "/prod eu"),
        ("amqp://h/a%2fb?heartbeat=5", "a/b"),
    ],
)
def test_vhost(url: str, vhost: str) -> None:
    assert parse_url(url).virtual_host == vhost


def test_user_and_password_are_percent_decoded() -> None:
    parsed = parse_url("amqp://us%40er%3A1:p%40ss%2Fw%3Ard%25@h/")
    assert parsed.username == "us@er:1"
    assert parsed.password == "p@ss/w:rd%"


def test_user_without_password_and_empty_credentials() -> None:
    assert (parse_url("amqp://alice@h").username, parse_url("amqp://alice@h").password) == ("alice", "")
    empty = parse_url("amqp://:@h")
    assert (empty.username, empty.password) == ("", "")


def test_password_may_contain_unencoded_at_sign() -> None:
    parsed = parse_url("amqp://u:p@ss@h:1234/v")
    assert parsed.password == "p@ss"
    assert parsed.hosts == (("h", 1234),)


# ---------------------------------------------------------------------- query parameters


def test_every_query_parameter() -> None:
    parsed = parse_url(
        "amqps://u:p@h/v?heartbeat=15&connection_timeout=2500&channel_max=64&frame_max=65536"
        "&auth_mechanism=amqplain&cacertfile=%2Ftmp%2Fca.pem&certfile=%2Ftmp%2Fc.pem&keyfile=%2Ftmp%2Fc.key"
        "&verify=verify_none&server_name_indication=broker.example"
    )
    assert parsed.heartbeat == 15
    assert parsed.connection_timeout == 2.5  # milliseconds in the URL, seconds here
    assert parsed.channel_max == 64
    assert parsed.frame_max == 65536
    assert parsed.auth_mechanism == "AMQPLAIN"
    assert parsed.cacertfile == "/tmp/ca.pem"
    assert parsed.certfile == "/tmp/c.pem"
    assert parsed.keyfile == "/tmp/c.key"
    assert parsed.verify is False
    assert parsed.server_name_indication == "broker.example"


@pytest.mark.parametrize(("value", "expected"), [("verify_peer", True), ("verify_none", False)])
def test_verify_values(value: str, expected: bool) -> None:
    assert parse_url(f"amqps://h?verify={value}").verify is expected


@pytest.mark.parametrize("mechanism", ["PLAIN", "AMQPLAIN", "EXTERNAL"])
def test_auth_mechanisms(mechanism: str) -> None:
    assert parse_url(f"amqp://h?auth_mechanism={mechanism.lower()}").auth_mechanism == mechanism


def test_heartbeat_zero_is_kept() -> None:
    assert parse_url("amqp://h?heartbeat=0").heartbeat == 0


@pytest.mark.parametrize(
    ("url", "names"),
    [
        ("amqp://h?bogus=1", ["bogus"]),
        ("amqp://h?heartbeat=soon", ["heartbeat", "soon"]),
        ("amqp://h?heartbeat=70000", ["heartbeat", "70000"]),
        ("amqp://h?channel_max=-1", ["channel_max"]),
        ("amqp://h?frame_max=big", ["frame_max"]),
        ("amqp://h?connection_timeout=1.5", ["connection_timeout"]),
        ("amqp://h?auth_mechanism=CRAM-MD5", ["auth_mechanism", "CRAM-MD5"]),
        ("amqp://h?verify=maybe", ["verify", "maybe"]),
    ],
)
def test_bad_query_parameter_is_named(url: str, names: list[str]) -> None:
    with pytest.raises(InvalidURL) as info:
        parse_url(url)
    for name in names:
        assert name in str(info.value)


# ---------------------------------------------------------------------- malformed URLs


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("broker:5672", "://"),
        ("http://broker/", "scheme"),
        ("amqp://h:port/", "port"),
        ("amqp://h:0/", "port"),
        ("amqp://h:65536/", "port"),
        ("amqp://h1,,h2/", "empty host"),
        ("amqp://[::1/", "IPv6"),
        ("amqp://h/a/b", "vhost"),
        ("amqp://h/#frag", "fragment"),
    ],
)
def test_malformed(url: str, fragment: str) -> None:
    with pytest.raises(InvalidURL, match="invalid AMQP URL") as info:
        parse_url(url)
    assert fragment.lower() in str(info.value).lower()


def test_not_a_string() -> None:
    with pytest.raises(InvalidURL):
        parse_url(b"amqp://h")  # type: ignore[arg-type]


def test_invalid_url_is_a_usage_error() -> None:
    assert issubclass(InvalidURL, amqp.UsageError)
    assert issubclass(InvalidURL, amqp.AMQPError)


# ---------------------------------------------------------------------- secrecy of the password

SECRET = "s3cretPw"


def test_password_not_in_repr_str_or_redacted() -> None:
    parsed = parse_url(f"amqp://alice:{SECRET}@h:5673/prod?heartbeat=5")
    assert parsed.password == SECRET
    for text in (repr(parsed), str(parsed), parsed.redacted(), repr(parsed.with_host(0))):
        assert SECRET not in text
    assert parsed.redacted() == "amqp://alice:***@h:5673/prod"
    assert "%2F" in parse_url(f"amqp://alice:{SECRET}@h/").redacted()


@pytest.mark.parametrize(
    "url",
    [
        f"amqp://alice:{SECRET}@h:notaport/",
        f"amqp://alice:{SECRET}@h/?bogus=1",
        f"amqp://alice:{SECRET}@h/?heartbeat=x",
        f"amqp://alice:{SECRET}@h/a/b",
        f"amqp://alice:{SECRET}@h,,x/",
        f"amqp://alice:{SECRET}@h/#x",
        f"ftp://alice:{SECRET}@h/",
        # Reserved characters the user forgot to percent-encode make the parser see the
        # password as a port or a query: the error must still not show it.
        "amqp://alice:s3cr/etPw@h/",
        "amqp://alice:s3cr?etPw@h/",
        "amqp://alice:1234?etPw@h/",
        # A '/' after digits: the start looks like a port, the rest like a vhost.
        "amqp://alice:2024/s3cretPw@h",
        "amqp://alice:2024/s3cretPw@h/",
        "amqp://alice:2024/s3cretPw@h:5672/prod",
        "amqp://alice:2024?s3cretPw=1@h",
        "amqp://alice:s3cr?heartbeat=5@h",
    ],
)
def test_password_not_in_errors(url: str) -> None:
    with pytest.raises(InvalidURL) as info:
        parse_url(url)
    text = str(info.value) + repr(info.value)
    for piece in ("s3cr", "etPw", SECRET):
        assert piece not in text


@pytest.mark.parametrize(
    "url", ["amqp://u:2024/rest@h", "amqp://u:pa?ss@h/", "amqp://h/team@eu", "amqp://h/?x=a@b"]
)
def test_an_at_sign_after_the_host_is_refused_with_the_encoding_hint(url: str) -> None:
    """The one unencoded '@' ends the user name and password; one after the host means the
    password held an unencoded '/' or '?' (or a vhost or query value an unencoded '@')."""
    with pytest.raises(InvalidURL, match="'@' after the host") as info:
        parse_url(url)
    assert "%2F" in str(info.value) and "%40" in str(info.value)
    assert "rest" not in str(info.value)
    assert parse_url("amqp://u:2024%2Frest@h").password == "2024/rest"
    assert parse_url("amqp://h/team%40eu?server_name_indication=x").virtual_host == "team@eu"


def test_connection_repr_hides_password() -> None:
    conn = amqp.Connection(parse_url(f"amqp://alice:{SECRET}@h/"))
    assert SECRET not in repr(conn)


# ---------------------------------------------------------------------- TLS context


def test_ssl_context_verifies_by_default(tls_material: TLSMaterial) -> None:
    parsed = parse_url(f"amqps://h/?cacertfile={tls_material.ca_cert_path}")
    ctx = parsed.ssl_context()
    assert ctx is not None
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert ctx.check_hostname is True


def test_ssl_context_verify_none(tls_material: TLSMaterial) -> None:
    ctx = parse_url("amqps://h/?verify=verify_none").ssl_context()
    assert ctx is not None
    assert ctx.verify_mode == ssl.CERT_NONE
    assert ctx.check_hostname is False


def test_ssl_context_missing_cert_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    with pytest.raises(OSError):
        parse_url(f"amqps://h/?cacertfile={missing}").ssl_context()


def test_amqpurl_is_frozen() -> None:
    parsed = AMQPURL()
    with pytest.raises(AttributeError):
        parsed.username = "x"  # type: ignore[misc]
