"""A fault proxy that cuts at an exact AMQP method: :class:`MethodCutProxy`.

``proxy.cut_at(CHANNEL_OPEN, nth=2)`` arms it: the second ``Channel.Open`` a client sends
from then on (counted over every proxied connection) makes the proxy cut every connection
the moment it reads that frame, before it reaches the broker.  The client has sent the
method and waits for its reply when its connection dies: the cut lands exactly inside that
call, whatever the timing.  ``proxy.fired`` is set once it has cut (it cuts once per arming).

It reads the client's bytes as AMQP frames (after the 8-byte protocol header): type,
channel, size, payload, frame end; a method frame's payload starts with its class and
method ids.
"""

from __future__ import annotations

import struct
from typing import Any

import anyio
from anyio.abc import ByteStream, SocketStream

from .proxy import FaultProxy, _Connection

__all__ = ["BASIC_CONSUME", "CHANNEL_OPEN", "MethodCutProxy"]

#: (class id, method id) of the methods tests cut at.
CHANNEL_OPEN = (20, 10)
BASIC_CONSUME = (60, 20)

_PROTOCOL_HEADER = 8
_FRAME_HEADER = struct.Struct(">BHI")
_METHOD_FRAME = 1


class MethodCutProxy(FaultProxy):
    """A :class:`~harness.proxy.FaultProxy` that can cut at the n-th client method of a kind."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._armed: tuple[int, int] | None = None
        self._left = 0
        self._reset = False
        #: Set once an armed cut has happened.
        self.fired = anyio.Event()

    def cut_at(self, method: tuple[int, int], *, nth: int = 1, reset: bool = False) -> None:
        """Cut every connection when the ``nth`` ``method`` from now reaches the proxy."""
        if nth < 1:
            raise ValueError("nth must be >= 1")
        self._armed, self._left, self._reset = method, nth, reset
        self.fired = anyio.Event()

    def _saw(self, method: tuple[int, int]) -> None:
        if self._armed != method:
            return
        self._left -= 1
        if self._left == 0:
            self._armed = None
            self.cut_all(reset=self._reset)
            self.fired.set()

    async def _wrap_client(self, stream: SocketStream, conn: _Connection) -> ByteStream:
        return _WatchedStream(stream, self._saw)


class _WatchedStream(ByteStream):
    """The client's stream, its received bytes read as frames (the methods go to ``saw``)."""

    def __init__(self, stream: SocketStream, saw: Any) -> None:
        self._stream = stream
        self._saw = saw
        self._buffer = bytearray()
        self._header_left = _PROTOCOL_HEADER

    async def receive(self, max_bytes: int = 65536) -> bytes:
        data = await self._stream.receive(max_bytes)
        self._read(data)
        return data

    def _read(self, data: bytes) -> None:
        skip = min(self._header_left, len(data))
        self._header_left -= skip
        self._buffer += data[skip:]
        buffer = self._buffer
        while len(buffer) >= _FRAME_HEADER.size:
            kind, _channel, size = _FRAME_HEADER.unpack_from(buffer)
            end = _FRAME_HEADER.size + size + 1
            if len(buffer) < end:
                return
            if kind == _METHOD_FRAME and size >= 4:
                self._saw(struct.unpack_from(">HH", buffer, _FRAME_HEADER.size))
            del buffer[:end]

    async def send(self, item: bytes) -> None:
        await self._stream.send(item)

    async def send_eof(self) -> None:
        await self._stream.send_eof()

    async def aclose(self) -> None:
        await self._stream.aclose()

    @property
    def extra_attributes(self) -> Any:
        return self._stream.extra_attributes
