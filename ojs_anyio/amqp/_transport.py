"""One connection generation: a socket, the codec state on it, and the tasks that serve it.

A :class:`Transport` is made for each successful TCP (+TLS) connect and thrown away when
it fails; the :class:`~ojs_anyio.amqp.Connection` outlives it and makes a new one when
recovery is on.  Everything that must start fresh on a new socket lives here, so nothing
is reset by hand: the codec state machine, the writer flag, the deferred-flush flag, the
handshake / Close-Ok / down events and the error that ended it.

Writes use "group commit": the task that finds the writer idle becomes the writer and
sends everything queued, including bytes other tasks queued while it was sending.  A
message's frames are queued in one synchronous step, so frames of two messages never
interleave.  Sends are shielded from cancellation: a half-written frame would corrupt
the stream for every channel.

The reader, the heartbeat and the deferred flusher (started by the connection's
supervisor in one task group per transport) end when the transport dies; frames are
handed to the connection's handler of their type synchronously, and a failure is reported once
through ``on_lost``.  On plain TCP the socket is read and written below anyio's stream
(``_socket_io.py``): on asyncio the bytes are decoded in the loop's callback as they
arrive, and the first write after each arrival goes straight to the socket.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import anyio.abc

from ojs_codec import AMQPConnection, AMQPError, ConnectionLevelError, ConnectionState, ProtocolError

from . import _metrics
from ._errors import ConnectionClosedError, ConnectionLostError
from ._socket_io import READ_SIZE, socket_feeder, socket_reader, socket_writer

__all__ = ["Transport"]

log = logging.getLogger("ojs_anyio.amqp")

#: Longest a batched ack waits for a write (see ChannelLink.ack and IncomingMessage._batching).
_DEFERRED_FLUSH_DELAY = 0.002
#: The codec's states after which nothing more is read.
_ENDED = (ConnectionState.CLOSED, ConnectionState.ERROR)


class Transport:
    """The socket and codec of one connection generation, with its reader and writer."""

    def __init__(
        self,
        proto: AMQPConnection,
        stream: anyio.abc.ByteStream | None,
        *,
        generation: int,
        label: str,
        handlers: Mapping[type[Any], Callable[[Any], None]],
        on_lost: Callable[[BaseException], None],
    ) -> None:
        #: The codec (every frame of this generation is encoded and decoded here), the
        #: socket (None once closed), and which generation of the connection this is.
        self.proto, self.stream, self.generation = proto, stream, generation
        #: For log lines: the broker's URL, without the password.
        self.label = label
        #: The connection's event handlers by event type, and its "this transport failed" handler.
        self._handlers, self._on_lost = handlers, on_lost
        #: A task is sending (group commit: others only queue bytes).
        self.writing = False
        #: Set when a write finishes, for a task waiting in flushed() (made on demand).
        self._written: anyio.Event | None = None
        #: Bytes were queued without writing them (batched acks); the flusher sends them.
        self.deferred_flush = False
        self._flush_soon = anyio.Event()
        #: The running backend's CancelScope class, found at the first write:
        #: ``anyio.CancelScope()`` looks the backend up anew on each call.
        self._scope_type: Callable[..., anyio.CancelScope] | None = None
        #: Writes straight to the socket without a yield (see _socket_io; None for TLS and
        #: in-memory streams).
        self._write_now = socket_writer(stream)
        #: A direct write went out since the broker's bytes last came: the next flushes
        #: gather through anyio's send until more come (see _socket_io).
        self._wrote_direct = False
        #: Reads straight from a Trio socket (see _socket_io; None on asyncio, TLS, memory).
        self._read_now = socket_reader(stream)
        self.handshake_done = anyio.Event()
        self.close_ok = anyio.Event()
        #: Why this transport ended (None while it is healthy).
        self.error: BaseException | None = None
        self.down = anyio.Event()
        #: Counts in ``ojs_amqp_connections_active`` (handshake done, not closed).
        self.counted = False
        #: Its failure was handled by the connection (once per transport).
        self.lost = stream is None

    async def handshake(self) -> None:
        """Send the protocol header and read until the AMQP handshake completes (the
        reader task isn't running yet).  Closes the socket if it fails."""
        self.proto.initiate()
        try:
            await self.flush()
            while not self.handshake_done.is_set():
                data = await self.receive()
                self.feed(data)
                await self.flush()
                if self.error is not None:
                    raise self.error
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.force_close()
            raise
        self.counted = True
        _metrics.stats.connections_active += 1

    async def receive(self) -> bytes:
        stream = self.stream
        if stream is None:  # closed by aclose(), a failed send or the heartbeat check
            raise ConnectionLostError("connection closed")
        try:
            read_now = self._read_now
            if read_now is None:
                return await stream.receive(READ_SIZE)
            data = await read_now(READ_SIZE)
            if not data:
                raise anyio.EndOfStream
            return data
        except anyio.EndOfStream:
            raise ConnectionLostError("broker closed the socket") from None
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError, ssl.SSLError) as exc:
            raise ConnectionLostError(f"socket error: {exc!r}") from exc

    def feed(self, data: bytes) -> None:
        try:
            events = self.proto.receive_data(data)
        except ProtocolError as exc:
            self.error = exc
            log.error("protocol error from broker: %s", exc)
            return
        handler_of = self._handlers.get
        for ev in events:
            handler = handler_of(type(ev))
            if handler is not None:  # an event type with no handler is ignored
                handler(ev)

    async def flush(self) -> None:
        """Send everything the codec has queued.  Group commit: if another task is already
        writing, it will send our bytes too, so return at once."""
        if self.writing:
            return
        stream = self.stream
        if stream is None:
            raise ConnectionLostError("not connected")
        proto = self.proto
        self.writing = True
        self.deferred_flush = False
        try:
            while True:
                data = proto.data_to_send()
                if not data:
                    return
                write_now = self._write_now
                if write_now is not None and not self._wrote_direct:
                    self._wrote_direct = True
                    rest = write_now(data)
                    if rest is None:
                        continue
                    data = rest  # not taken, or b"": taken, but wait for the socket to drain
                scope_type = self._scope_type
                if scope_type is None:
                    scope_type = self._scope_type = type(anyio.CancelScope())
                with scope_type(shield=True):
                    await stream.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError, ssl.SSLError) as exc:
            err = ConnectionLostError(f"socket error while sending: {exc!r}")
            if self.error is None:
                self.error = err
            if self.stream is stream:
                # Wake the reader too: the transport is unusable in both directions.
                await self.force_close()
            raise err from exc
        finally:
            self.writing = False
            written, self._written = self._written, None
            if written is not None:
                written.set()

    async def flushed(self) -> None:
        """Return once every byte queued before the call was handed to the socket: unlike
        :meth:`flush`, wait for a write another task has under way (group commit leaves
        our bytes to it), then write whatever is left (batched acks included)."""
        while self.writing:
            if self._written is None:
                self._written = anyio.Event()
            await self._written.wait()
        await self.flush()

    async def flush_quietly(self) -> None:
        try:
            await self.flush()
        except AMQPError:
            pass  # the transport's failure is recorded in .error and reported there

    async def force_close(self) -> None:
        if self.counted:
            self.counted = False
            _metrics.stats.connections_active -= 1
        stream, self.stream = self.stream, None
        if stream is not None:
            with anyio.CancelScope(shield=True):
                try:
                    await anyio.aclose_forcefully(stream)
                except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                    pass  # already broken; nothing else to release

    def defer_flush(self) -> None:
        """Bytes were queued without writing them (batched acks): the flusher task sends
        them within ``_DEFERRED_FLUSH_DELAY`` unless someone writes first."""
        if not self.deferred_flush:
            self.deferred_flush = True
            self._flush_soon.set()

    async def deferred_flusher(self) -> None:
        while True:
            await self._flush_soon.wait()
            self._flush_soon = anyio.Event()
            await anyio.sleep(_DEFERRED_FLUSH_DELAY)
            if self.deferred_flush:
                await self.flush_quietly()

    def _arrived(self, data: bytes) -> bool:
        """Feed a chunk; whether the reader task must look: the frames made us queue bytes
        (Close-Ok, rejects of late deliveries…; acks queued by consumers are theirs to send,
        batched), or the connection ended."""
        proto = self.proto
        self._wrote_direct = False
        if self.error is not None or proto.state in _ENDED:
            return True  # nothing more is decoded once the connection ended
        queued = len(proto.outbound)
        self.feed(data)
        return len(proto.outbound) > queued or self.error is not None or proto.state in _ENDED

    async def reader(self, scope: anyio.CancelScope) -> None:
        """Read and feed until the transport ends.  On asyncio's plain TCP the chunks are fed
        as they arrive (``_socket_io.socket_feeder``) and this task only does what needs one."""
        proto = self.proto
        try:
            feeder = None if self.stream is None else socket_feeder(self.stream, self._arrived)
            while True:
                if feeder is not None:
                    await feeder.wait()
                elif not self._arrived(await self.receive()):
                    continue
                if proto.has_data_to_send:
                    await self.flush()
                if self.error is not None or proto.state in _ENDED:
                    self._on_lost(self.error or ConnectionClosedError("connection closed"))
                    if proto.has_data_to_send:
                        await self.flush_quietly()  # Close-Ok, or our Close after a protocol error
                    if self.error is None:
                        self.error = ConnectionClosedError("connection closed")
                    return
        except ConnectionLostError as exc:
            if self.error is None:
                self.error = exc
            self._on_lost(self.error)
        finally:
            self.down.set()
            scope.cancel()

    async def heartbeat_loop(self) -> None:
        proto = self.proto
        while True:
            try:
                deadline = proto.heartbeat_tick(anyio.current_time())
            except ConnectionLevelError as exc:
                log.error("connection to %s is dead: %s", self.label, exc)
                self.error = ConnectionLostError(f"broker unresponsive: {exc.reply_text}")
                self._on_lost(self.error)
                # Closing the socket ends the reader and wakes a writer stuck on a stalled peer.
                await self.force_close()
                return
            if deadline is None:
                await anyio.sleep_forever()
                return
            if proto.has_data_to_send:
                await self.flush_quietly()
            await anyio.sleep(max(0.0, deadline - anyio.current_time()))
