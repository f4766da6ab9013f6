"""A synchronous write to a plain TCP socket, below anyio's stream, for the transport's flush.

``anyio``'s ``SocketStream.send`` yields to the event loop on every call, even when the
kernel takes every byte at once: asyncio's checks for cancellation and then yields after
the write, Trio's socket does a cancel-shielded checkpoint after each ``send``.  On the
job path that is one more pass of the event loop per ack and per publish, which at
worker concurrency 1 sits between a delivery and the broker's next one.

:func:`socket_writer` returns, for a stream made by ``anyio.connect_tcp`` on asyncio or
Trio, a function that hands bytes to the socket at once, without awaiting, and says how
many it took:

* asyncio: ``transport.write`` while the transport is not paused (anyio sets its write
  buffer limit to 0, so "not paused" means nothing is left unsent from before).  It
  takes everything: what the kernel does not take at once stays in the transport's
  buffer, which pauses the transport, so the next write waits in ``send`` as before (one
  chunk at most is ever held there).
* Trio: ``send`` on the non-blocking socket beneath Trio's; what it does not take
  (``BlockingIOError``, or a partial write) the caller sends with ``await stream.send``.

Any other stream (TLS, the in-memory broker's, a future anyio whose private attributes
moved) gets ``None``, and the transport writes through anyio as before.  A socket error
surfaces as the ``OSError`` it is, which the transport already turns into a lost
connection.

The transport still yields through ``send`` at least every ``YIELD_EVERY`` writes, so a
task that publishes in a loop without awaiting anything else (no confirms) lets the other
tasks run, and sees a cancellation, as often as a consumer taking buffered deliveries does.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

__all__ = ["YIELD_EVERY", "socket_writer"]

#: Writes in a row without a yield to the event loop (see the module docstring).
YIELD_EVERY = 32


def socket_writer(stream: object) -> Callable[[bytes], int] | None:
    """A function that writes bytes to ``stream``'s socket without awaiting and returns
    how many it took, or ``None`` when ``stream`` is not one of anyio's TCP streams."""
    transport = getattr(stream, "_transport", None)
    protocol = getattr(stream, "_protocol", None)
    if isinstance(transport, asyncio.Transport) and isinstance(
        getattr(protocol, "write_event", None), asyncio.Event
    ):
        return _asyncio_writer(transport, protocol)
    raw = getattr(getattr(stream, "_trio_socket", None), "_sock", None)
    if isinstance(raw, socket.socket) and not raw.getblocking():
        return _trio_writer(raw)
    return None


def _asyncio_writer(transport: asyncio.Transport, protocol: Any) -> Callable[[bytes], int]:
    def write(data: bytes) -> int:
        # write_event is replaced (unset) while the transport is paused; exception is set
        # by connection_lost: either way, leave it to anyio's send, which waits or raises.
        if not protocol.write_event.is_set() or protocol.exception is not None or transport.is_closing():
            return 0
        transport.write(data)
        return len(data)

    return write


def _trio_writer(sock: socket.socket) -> Callable[[bytes], int]:
    send = sock.send

    def write(data: bytes) -> int:
        try:
            return send(data)
        except BlockingIOError:
            return 0

    return write
