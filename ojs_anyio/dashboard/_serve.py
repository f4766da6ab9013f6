"""Serving the dashboard with Hypercorn, on whichever event loop runs (asyncio or Trio)."""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable

from starlette.types import ASGIApp

from ojs_anyio._common import current_backend

__all__ = ["is_loopback", "listen", "serve"]

BACKLOG = 128
#: A request still running this long after the shutdown began is cut.
GRACEFUL_TIMEOUT = 3.0


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) stays on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port`` (port 0: any free port); raises ``OSError``.
    Connections made before the server runs wait in its backlog."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


async def serve(app: ASGIApp, sock: socket.socket, *, shutdown: Callable[[], Awaitable[None]]) -> None:
    """Serve ``app`` on ``sock`` (taken over: Hypercorn closes it) until ``shutdown()``
    returns; requests still running get :data:`GRACEFUL_TIMEOUT` seconds to finish."""
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"fd://{sock.detach()}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("ojs_anyio.dashboard.http")
    config.graceful_timeout = GRACEFUL_TIMEOUT
    if current_backend() == "trio":
        from hypercorn.trio import serve as trio_serve

        await trio_serve(app, config, shutdown_trigger=shutdown)  # type: ignore[arg-type]
    else:
        from hypercorn.asyncio import serve as asyncio_serve

        await asyncio_serve(app, config, shutdown_trigger=shutdown)  # type: ignore[arg-type]
