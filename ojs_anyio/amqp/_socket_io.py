"""The transport's socket I/O below anyio's stream, for plain TCP on asyncio and Trio.

``anyio``'s ``SocketStream`` costs a pass of the event loop more than the socket needs,
on each read and on each write:

* ``send`` yields even when the kernel takes every byte at once (asyncio checks for
  cancellation and then yields after the write; Trio's socket does a cancel-shielded
  checkpoint after each ``send``);
* ``receive`` on asyncio resumes the transport's reading before it waits and pauses it
  again after (two ``epoll_ctl`` calls), and the bytes reach the reader task one pass
  after they arrived; on Trio, a read that waited checkpoints once more after it.

On the job path that is one pass per delivery and one per ack, and at worker concurrency
1 every pass sits between a delivery and the broker's next one.  This module does the
same I/O directly, for a stream made by ``anyio.connect_tcp``:

* :func:`socket_writer`: a function that hands bytes to the socket without awaiting.  On
  asyncio, ``transport.write`` while the transport is not paused (anyio sets its write
  buffer limit to 0, so "not paused" means nothing is left unsent from before); what the
  kernel does not take at once stays in the transport's buffer and pauses it, and the
  caller then waits for it to drain in anyio's ``send``, still the writer, exactly as
  after anyio's own write: one chunk at most is ever held there.  On Trio, ``send`` on
  the non-blocking socket beneath Trio's; the caller sends what it did not take with
  ``await stream.send``.
* :func:`socket_feeder` (asyncio): a protocol put in place of anyio's on the transport
  once the handshake is done, which hands each chunk to the codec as it is read
  itself, so a delivery wakes its consumer in the pass it arrived in.  It is a buffered
  protocol: the transport reads into one buffer of ``READ_SIZE`` kept for the
  connection's life, and the codec gets a copy of what was read (asyncio's own reads
  allocate 256 KiB each, see ``READ_SIZE``).  The reader task
  then only waits for what needs a task: bytes the frames made us queue (Close-Ok), the
  end of the socket, or an error raised while feeding, which it raises (errors are never
  left in the loop's exception handler).  Reading is never paused and queues nothing:
  each chunk is decoded as it comes, and what the frames hold is bounded where it was
  before (the prefetch window, the codec's frame limit).
* :func:`socket_reader` (Trio): ``recv`` on the non-blocking socket, waiting in
  ``wait_readable`` only when nothing is there (known without trying when the last read
  took less than it asked for).

Any other stream (TLS, the in-memory broker's, a future anyio whose private attributes
moved) gets ``None`` from each, and the transport goes through anyio as before.  A socket
error surfaces as the ``OSError`` it is, which the transport turns into a lost connection.

A direct write does not yield, and it does not gather the frames of other tasks as a
writer waiting in anyio's ``send`` does ("group commit").  So the transport writes
directly once per arrival of bytes from the broker (``Transport.flush``): the first flush
after the broker's bytes came goes straight out; later ones, until the broker's next
bytes, go through anyio's ``send`` as before, whose writer yields and then sends, in one
write, everything other tasks queued meanwhile.  A worker serving one job at a time acks
each delivery directly; a hundred tasks woken by one read of confirms make two or three
writes, not a hundred; and a task that publishes in a loop without awaiting anything else
(no confirms) yields on every publish but the first, as before.  The Trio reader, for its
part, yields at least every ``YIELD_EVERY`` reads that did not wait.  (A write is shielded
from cancellation on every path: half a frame would corrupt the stream.)
"""

from __future__ import annotations

import asyncio
import socket
import sys
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from ._errors import ConnectionLostError

__all__ = ["READ_SIZE", "YIELD_EVERY", "Feeder", "socket_feeder", "socket_reader", "socket_writer"]

#: Direct reads in a row without a yield to the event loop (the Trio reader; module docstring).
YIELD_EVERY = 32
#: The most one read asks of the socket.  Below glibc's default ``mmap`` threshold
#: (128 KiB): a ``recv(256 KiB)`` (asyncio's own read size, and ours before) may get a
#: fresh mapping for every read, fault two pages into it and shrink it with ``mremap``
#: when the read took less: 15-25 µs more a read on the 2-core virtual machines of
#: docs/benchmarks.md (``benchmarks/_read_size_probe.py``).  A frame larger than this
#: comes in several reads, which the codec's reader joins.
READ_SIZE = 64 * 1024


def socket_writer(stream: object) -> Callable[[bytes], bytes | None] | None:
    """A function that writes bytes to ``stream``'s socket without awaiting, or ``None``
    when ``stream`` is not one of anyio's TCP streams.  It returns ``None`` when the bytes
    are on their way, or what the caller must still pass to ``await stream.send``: the bytes
    the socket did not take, or ``b""`` when the socket took them but is backed up (the
    send of nothing then returns once it drains, as anyio's own send does after a write)."""
    asyncio_parts = _asyncio_parts(stream)
    if asyncio_parts is not None:
        transport, protocol = asyncio_parts

        def write(data: bytes) -> bytes | None:
            # write_event is replaced (unset) while the transport is paused; exception is
            # set by connection_lost: either way, leave it to anyio's send, which waits or raises.
            if not protocol.write_event.is_set() or protocol.exception is not None or transport.is_closing():
                return data
            transport.write(data)
            return None if protocol.write_event.is_set() else b""

        return write
    sock = _trio_socket(stream)
    if sock is None:
        return None
    send = sock.send

    def send_now(data: bytes) -> bytes | None:
        try:
            sent = send(data)
        except BlockingIOError:
            return data
        return None if sent == len(data) else data[sent:]

    return send_now


def socket_reader(stream: object) -> Callable[[int], Awaitable[bytes]] | None:
    """For a Trio TCP stream, ``receive(max_bytes)`` straight from its socket (``b""`` at
    the end of the stream); ``None`` for any other stream."""
    sock = _trio_socket(stream)
    if sock is None:
        return None
    import trio  # only reached with a Trio stream, so Trio is installed

    recv, wait_readable = sock.recv, trio.lowlevel.wait_readable
    checkpoint = trio.lowlevel.checkpoint
    unyielded = 0
    #: The last read took less than it asked for: the socket is empty, so the next read
    #: waits first instead of trying a recv that would fail.
    drained = False

    async def wait() -> None:
        try:
            await wait_readable(sock)
        except trio.ClosedResourceError:  # another task closed the socket
            raise anyio.ClosedResourceError from None

    async def receive(max_bytes: int) -> bytes:
        nonlocal unyielded, drained
        if drained:
            drained, unyielded = False, 0
            await wait()
        elif unyielded >= YIELD_EVERY:
            unyielded = 0
            await checkpoint()
        while True:
            try:
                data = recv(max_bytes)
            except BlockingIOError:
                unyielded = 0
                await wait()
            else:
                unyielded += 1
                drained = len(data) < max_bytes
                return data

    return receive


class Feeder(asyncio.BufferedProtocol):
    """Stands in for anyio's protocol on an asyncio transport and feeds each chunk to
    ``on_data`` as it arrives, read into one buffer (see the module docstring).
    ``on_data`` returns whether the reader task must look (bytes to send, the connection
    ended); anyio's protocol still gets what its ``send`` and ``aclose`` rely on (write
    pause and resume, the loss)."""

    def __init__(self, inner: Any, transport: asyncio.Transport, on_data: Callable[[bytes], bool]) -> None:
        self._inner, self._transport, self._on_data = inner, transport, on_data
        #: The reader task has something to do (set by data_received, cleared by wait()).
        self._look = False
        #: Why the socket or the feeding ended (raised by wait() once _look is handled).
        self._end: BaseException | None = None
        self._woken: anyio.Event | None = None
        self._buffer = memoryview(bytearray(READ_SIZE))

    def begin(self) -> None:
        """Feed what anyio had read but not handed out, take over the transport, and resume
        reading (or note the end that came meanwhile)."""
        transport, inner = self._transport, self._inner
        # A handler running in the loop's callback has no current task, so sniffio (when
        # imported) cannot tell the loop from the task: name it in the callback's context,
        # which is copied from this task when reading resumes below.
        sniffio = sys.modules.get("sniffio")
        if sniffio is not None:
            sniffio.current_async_library_cvar.set("asyncio")
        read_queue: deque[bytes] = inner.read_queue
        while read_queue:
            self._look = self._on_data(read_queue.popleft()) or self._look
        inner.read_event.clear()
        transport.set_protocol(self)
        if transport.is_closing() or inner.exception is not None:
            self._ended(ConnectionLostError("connection closed"))
        elif inner.is_at_eof:
            self.eof_received()
        else:
            # Paused (anyio pauses after each read; a no-op if not), then resumed from this
            # task, so the loop's read callback runs in this task's context (sniffio above).
            transport.pause_reading()
            transport.resume_reading()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._buffer[:nbytes].tobytes())

    def data_received(self, data: bytes) -> None:
        if self._end is not None:
            return  # feeding failed: nothing more is decoded on this socket
        try:
            look = self._on_data(data)
        except Exception as exc:  # a bug in an event handler: the reader task raises it
            # (KeyboardInterrupt and SystemExit go on up to the loop, as from any callback.)
            self._end = exc
            self._transport.pause_reading()
            look = True
        if look:
            self._look = True
            self._wake()

    def eof_received(self) -> bool:
        self._inner.eof_received()
        self._ended(ConnectionLostError("broker closed the socket"))
        return True  # keep the transport: the connection closes it (force_close)

    def connection_lost(self, exc: Exception | None) -> None:
        self._inner.connection_lost(exc)
        why = "connection closed" if exc is None else f"socket error: {exc!r}"
        self._ended(ConnectionLostError(why))

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def _ended(self, err: BaseException) -> None:
        if self._end is None:
            self._end = err
        self._wake()

    def _wake(self) -> None:
        woken = self._woken
        if woken is not None:
            self._woken = None
            woken.set()

    async def wait(self) -> None:
        """Return when the reader task has something to do (once per time it was asked);
        raise why the socket ended, or what feeding raised, once nothing else is left."""
        while not self._look:
            if self._end is not None:
                raise self._end
            self._woken = woken = anyio.Event()
            await woken.wait()
        self._look = False


def socket_feeder(stream: object, on_data: Callable[[bytes], bool]) -> Feeder | None:
    """Put a :class:`Feeder` on ``stream``'s asyncio transport, after feeding what anyio
    had already read, and resume reading; ``None`` (nothing changed) for any other stream."""
    parts = _asyncio_parts(stream)
    if parts is None:
        return None
    transport, inner = parts
    feeder = Feeder(inner, transport, on_data)
    feeder.begin()
    return feeder


def _asyncio_parts(stream: object) -> tuple[asyncio.Transport, Any] | None:
    transport = getattr(stream, "_transport", None)
    protocol = getattr(stream, "_protocol", None)
    if isinstance(transport, asyncio.Transport) and isinstance(
        getattr(protocol, "write_event", None), asyncio.Event
    ):
        return transport, protocol
    return None


def _trio_socket(stream: object) -> socket.socket | None:
    raw = getattr(getattr(stream, "_trio_socket", None), "_sock", None)
    if isinstance(raw, socket.socket) and not raw.getblocking():
        return raw
    return None
