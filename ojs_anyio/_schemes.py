"""URL schemes served by plug-ins: a scheme name -> the function that opens its byte stream.

The AMQP client knows ``amqp://`` and ``amqps://`` (TCP, TLS).  Any other scheme is a
plug-in that registers a :data:`StreamFactory` here with :func:`register_scheme`, usually
when its module is imported.  ``ojs_anyio.memory`` registers ``memory://`` (the in-process
broker) that way.

So that ``connect("memory://")`` keeps working without an import first, :data:`PLUGINS`
names the module that provides each scheme shipped with this package; :func:`stream_factory`
imports it the first time the scheme is used.  The client never imports the broker itself:
a process that never opens ``memory://`` never loads it.

A leaf: it imports nothing of ``ojs_anyio`` (the plug-ins import it), only the codec's
``UsageError``.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from types import MappingProxyType

import anyio.abc

from ojs_codec import UsageError  # the misuse error of every layer (the codec is below us)

__all__ = ["PLUGINS", "StreamFactory", "is_plugin_scheme", "register_scheme", "stream_factory"]

#: Opens a connected byte stream for a URL's host and port (a plug-in scheme's URL has
#: one host: the name of what to connect to, and port 0).
StreamFactory = Callable[[str, int], Awaitable[anyio.abc.ByteStream]]

#: The schemes this package ships a plug-in for, and the module that registers each when
#: imported (the documented hook: imported lazily by :func:`stream_factory`).
PLUGINS: MappingProxyType[str, str] = MappingProxyType({"memory": "ojs_anyio.memory"})

_factories: dict[str, StreamFactory] = {}


def register_scheme(scheme: str, factory: StreamFactory) -> None:
    """Serve ``scheme://`` URLs with ``factory`` (idempotent for the same factory)."""
    scheme = scheme.lower()
    if scheme in ("amqp", "amqps"):
        raise UsageError(f"{scheme}:// is the client's own scheme, not a plug-in")
    known = _factories.get(scheme)
    if known is not None and known is not factory:
        raise UsageError(f"{scheme}:// is already registered by {known!r}")
    _factories[scheme] = factory


def is_plugin_scheme(scheme: str) -> bool:
    """Whether ``scheme`` is served by a plug-in (registered, or shipped in :data:`PLUGINS`)."""
    return scheme in _factories or scheme in PLUGINS


def stream_factory(scheme: str) -> StreamFactory:
    """The factory of a plug-in ``scheme``, importing its shipped module on first use."""
    factory = _factories.get(scheme)
    if factory is None and scheme in PLUGINS:
        importlib.import_module(PLUGINS[scheme])  # registers the scheme as it is imported
        factory = _factories.get(scheme)
    if factory is None:
        raise LookupError(f"no plug-in serves {scheme}:// URLs")
    return factory
