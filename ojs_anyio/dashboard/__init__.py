"""``ojs-anyio dashboard``: a web page for operators (docs/dashboard.md).

An ASGI application (Starlette) over an :class:`Observer` of the broker, served by
Hypercorn on asyncio or Trio.  Needs the ``dashboard`` extra: ``pip install
'ojs-anyio[dashboard]'``.  It uses only the public API of :mod:`ojs_anyio`; nothing in the
library imports it.

::

    async with ojs_anyio.connect(url) as client, observe(client, queues=["email"]) as observer:
        app = create_app(observer, Settings(token="...", broker=client.conn.url.redacted()))
        ...  # serve app with any ASGI server
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Callable, Sequence

import anyio

from .. import amqp, connect
from ._app import LOOPBACK_NAMES, Settings, create_app
from ._serve import is_loopback, listen, serve
from ._state import Observer, Overview, observe

__all__ = [
    "LOOPBACK_NAMES",
    "Observer",
    "Overview",
    "Settings",
    "create_app",
    "is_loopback",
    "listen",
    "observe",
    "run",
    "serve",
]


async def run(
    url: str,
    sock: socket.socket,
    settings: Settings,
    *,
    prefix: str = "",
    queues: Sequence[str] = (),
    refresh: float = 2.0,
    stop: anyio.Event | None = None,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Connect to ``url`` (recovering from lost connections), observe, and serve the
    dashboard on ``sock`` until ``stop`` is set (or the caller is cancelled).

    ``settings.broker`` is filled in with the redacted URL when empty.  ``on_ready`` is
    called once the first poll is done, just before serving."""
    stop = stop or anyio.Event()
    async with (
        connect(
            url, prefix=prefix, recovery=amqp.RecoveryPolicy(), name=f"ojs-anyio dashboard pid={os.getpid()}"
        ) as client,
        observe(client, queues=queues, refresh=refresh) as observer,
    ):
        if not settings.broker:
            settings = dataclasses.replace(settings, broker=client.conn.url.redacted())
        app = create_app(observer, settings, prefix=prefix)
        if on_ready is not None:
            on_ready()
        await serve(app, sock, shutdown=stop.wait)
