"""AMQP URIs, per RabbitMQ's URI spec (https://www.rabbitmq.com/docs/uri-spec).

``amqp://user:pass@host:port/vhost?heartbeat=10&connection_timeout=5000``

* ``amqp`` defaults to port 5672, ``amqps`` to 5671 (TLS).
* user, password and vhost are percent-decoded: ``%2f`` is ``/``.  An absent vhost
  (``amqp://host``) or an empty one (``amqp://host/``) means ``/`` (RabbitMQ has no
  vhost named ``""``); ``amqp://host/%2F`` is ``/`` too.
* The only unencoded ``@`` allowed is the one that ends the user name and password.  One
  after the host (in the vhost or the query) means a ``/`` or ``?`` in the password was not
  percent-encoded (``amqp://u:2024/rest@host`` is host ``u``, port 2024, vhost
  ``rest@host``), so it is refused with the hint to encode it, rather than connecting
  somewhere else and showing the rest of the password in the vhost.  Write an ``@`` that
  belongs to a vhost or a query value as ``%40``.
* Several hosts may be given, comma-separated (``amqp://h1,h2:5673/vhost``), to
  rotate across on reconnection.
* The password never appears in ``repr()`` or in any error text.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field, replace
from urllib.parse import parse_qsl, unquote

from ojs_codec import UsageError

from .._schemes import PLUGINS, is_plugin_scheme

__all__ = ["AMQPURL", "InvalidURL", "parse_url"]

_QUERY_KEYS = frozenset(
    {
        "heartbeat",
        "connection_timeout",
        "channel_max",
        "frame_max",
        "auth_mechanism",
        "cacertfile",
        "certfile",
        "keyfile",
        "verify",
        "server_name_indication",
    }
)


class InvalidURL(UsageError):
    """A malformed AMQP URL or an unknown query parameter.  Never shows the password."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AMQPURL:
    scheme: str = "amqp"
    hosts: tuple[tuple[str, int], ...] = (("localhost", 5672),)
    username: str = "guest"
    password: str = field(default="guest", repr=False)
    virtual_host: str = "/"
    heartbeat: int | None = None
    connection_timeout: float | None = None  # seconds (the URL gives milliseconds)
    channel_max: int | None = None
    frame_max: int | None = None
    auth_mechanism: str = "PLAIN"
    cacertfile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    verify: bool = True
    server_name_indication: str | None = None

    @property
    def memory(self) -> bool:
        """A ``memory://NAME`` URL: the in-process broker called NAME (``host``)."""
        return self.scheme == "memory"

    @property
    def tls(self) -> bool:
        return self.scheme == "amqps"

    @property
    def host(self) -> str:
        return self.hosts[0][0]

    @property
    def port(self) -> int:
        return self.hosts[0][1]

    def redacted(self) -> str:
        """The URL with the password replaced by ``***`` (safe for logs)."""
        hosts = ",".join(f"{h}:{p}" for h, p in self.hosts)
        if is_plugin_scheme(self.scheme):
            hosts = self.host
        return f"{self.scheme}://{self.username}:***@{hosts}/{self.virtual_host.replace('/', '%2F')}"

    def with_host(self, index: int) -> AMQPURL:
        """This URL with host ``index`` (modulo the host count) moved first."""
        i = index % len(self.hosts)
        return replace(self, hosts=self.hosts[i:] + self.hosts[:i])

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client TLS context for ``amqps`` URLs: verifies certificates by default."""
        if not self.tls:
            return None
        ctx = ssl.create_default_context(cafile=self.cacertfile)
        if self.certfile:
            ctx.load_cert_chain(self.certfile, self.keyfile)
        if not self.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx


_ENCODE_HINT = "percent-encode '/' (%2F), '?' (%3F), '#' (%23) and '@' (%40) in the user name and password"


def _bad(message: str) -> InvalidURL:
    return InvalidURL(f"invalid AMQP URL: {message}")


def _int_param(name: str, value: str, lo: int, hi: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise _bad(f"query parameter {name!r} must be an integer, got {value!r}") from None
    if not lo <= number <= hi:
        raise _bad(f"query parameter {name!r} must be in {lo}..{hi}, got {number}")
    return number


def parse_url(url: str) -> AMQPURL:
    """Parse an ``amqp://``, ``amqps://`` or ``memory://NAME`` URL.

    Raises :class:`InvalidURL` naming the problem."""
    scheme, plugin, rest = _split_scheme(url)
    if "#" in rest:
        raise _bad("fragments ('#…') are not allowed")
    rest, _, query = rest.partition("?")
    authority, slash, path = rest.partition("/")
    if "@" in path or "@" in query:
        # Not echoed: it is the rest of a password that held an unencoded '/' or '?'.
        raise _bad(f"'@' after the host: {_ENCODE_HINT}; in a vhost or a query value, write '@' as %40")
    username, password, hostpart = _split_authority(authority)
    hosts = _hosts(scheme, plugin, hostpart)
    if slash and "/" in path:
        raise _bad("the vhost must be one path segment; write '/' inside it as %2F")
    return AMQPURL(
        scheme=scheme,
        hosts=hosts,
        username=username,
        password=password,
        virtual_host=unquote(path) if slash and path else "/",
        **_query_options(query),  # type: ignore[arg-type]
    )


def _split_scheme(url: str) -> tuple[str, bool, str]:
    """(the scheme, lowercased; whether it is a plug-in's; what follows ``://``)."""
    if not isinstance(url, str):
        raise _bad(f"expected a string, got {type(url).__name__}")
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise _bad("missing '://' (expected amqp://user:pass@host:port/vhost)")
    scheme = scheme.lower()
    plugin = is_plugin_scheme(scheme)
    if scheme not in ("amqp", "amqps") and not plugin:
        plugins = ", ".join(repr(s) for s in sorted(PLUGINS))
        raise _bad(f"scheme must be 'amqp', 'amqps' or a plug-in's ({plugins}), got {scheme!r}")
    return scheme, plugin, rest


def _split_authority(authority: str) -> tuple[str, str, str]:
    """(user name, password, host list): guest/guest without user info."""
    userinfo, at, hostpart = authority.rpartition("@")
    if not at:
        return "guest", "guest", authority
    user_raw, colon, pass_raw = userinfo.partition(":")
    return unquote(user_raw), unquote(pass_raw) if colon else "", hostpart


def _hosts(scheme: str, plugin: bool, hostpart: str) -> tuple[tuple[str, int], ...]:
    if plugin:
        # memory://NAME/vhost (a plug-in scheme): NAME is what to connect to, such as the
        # in-process broker's name (no port, one host).
        if "," in hostpart or ":" in hostpart:
            raise _bad(f"a {scheme}:// URL names one broker: {scheme}://NAME/vhost")
        return ((unquote(hostpart) or "default", 0),)
    default_port = 5671 if scheme == "amqps" else 5672
    if not hostpart:
        return (("localhost", default_port),)
    return tuple(_parse_host(h, default_port) for h in hostpart.split(","))


def _query_options(query: str) -> dict[str, object]:
    options: dict[str, object] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key not in _QUERY_KEYS:
            raise _bad(f"unknown query parameter {key!r} (known: {', '.join(sorted(_QUERY_KEYS))})")
        options[key] = _query_value(key, value)
    return options


def _query_value(key: str, value: str) -> object:
    if key in ("heartbeat", "channel_max", "frame_max"):
        return _int_param(key, value, 0, 2**31 - 1 if key == "frame_max" else 65535)
    if key == "connection_timeout":
        return _int_param(key, value, 0, 2**31 - 1) / 1000.0
    if key == "auth_mechanism":
        mech = value.upper()
        if mech not in ("PLAIN", "AMQPLAIN", "EXTERNAL"):
            raise _bad(f"auth_mechanism must be PLAIN, AMQPLAIN or EXTERNAL, got {value!r}")
        return mech
    if key == "verify":
        low = value.lower()
        if low in ("verify_peer", "true", "1", "yes"):
            return True
        if low in ("verify_none", "false", "0", "no"):
            return False
        raise _bad(f"verify must be verify_peer or verify_none, got {value!r}")
    return value


def _parse_host(text: str, default_port: int) -> tuple[str, int]:
    if not text:
        raise _bad("empty host in host list")
    if text.startswith("["):  # IPv6 literal
        end = text.find("]")
        if end < 0:
            raise _bad("unterminated IPv6 literal")
        host, port_text = text[1:end], text[end + 1 :].removeprefix(":")
    else:
        host, _, port_text = text.partition(":")
    if not host:
        raise _bad("empty host")
    port = default_port
    if port_text:
        if not port_text.isdigit():
            # Not echoed: with an unencoded '/' or '?' in the password, this is the password.
            raise _bad(f"port must be a number ({_ENCODE_HINT})")
        port = int(port_text)
        if not 0 < port < 65536:
            raise _bad(f"port must be 1..65535, got {port}")
    return unquote(host), port
