"""The transport's socket I/O below anyio (``amqp/_socket_io.py``).

Plain TCP on asyncio and Trio reads and writes the socket directly, without the pass of
the event loop anyio's stream adds to each call; everything else (TLS, ``memory://``)
goes through anyio.  These tests check that the direct paths are the ones in use (so an
anyio release that moves what they rely on is noticed here, not as a silent slowdown),
and that they keep what the anyio path guaranteed: other tasks run, backed-up sockets
are waited for, and an error raised while decoding reaches the caller.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
from collections.abc import Callable

import anyio
import anyio.lowlevel
import anyio.streams.stapled
import pytest
import sniffio

from ojs_anyio import amqp
from ojs_anyio._common import current_backend
from ojs_anyio.amqp._socket_io import READ_SIZE, Feeder, socket_feeder, socket_reader, socket_writer
from ojs_anyio.amqp._transport import Transport

from .amqp_helpers import deleted_afterwards, wait_for_message_count

pytestmark = pytest.mark.anyio

Unique = Callable[[str], str]


async def test_plain_tcp_takes_the_direct_paths(rabbitmq_url: str) -> None:
    async with amqp.connect(rabbitmq_url) as conn:
        transport = conn._transport
        assert socket_writer(transport.stream) is not None
        if current_backend() == "asyncio":
            # The reader task put a Feeder in place of anyio's protocol after the handshake.
            raw = transport.stream._transport  # type: ignore[union-attr]
            assert isinstance(raw.get_protocol(), Feeder)
        else:
            assert socket_reader(transport.stream) is not None
        async with conn.channel() as ch:  # and the connection works through them
            q = (await ch.queue_declare("", exclusive=True)).name
            await ch.publish(b"x", routing_key=q)
            msg = await ch.get(q, no_ack=True)
            assert msg is not None and msg.body == b"x"


async def test_other_streams_go_through_anyio() -> None:
    """TLS and in-memory streams are not anyio's TCP socket streams: nothing direct."""
    send, receive = anyio.create_memory_object_stream[bytes](1)
    with send, receive:
        stream = anyio.streams.stapled.StapledObjectStream(send, receive)
        assert socket_writer(stream) is None
        assert socket_reader(stream) is None
        assert socket_feeder(stream, lambda data: False) is None


async def test_publishing_in_a_loop_lets_other_tasks_run(rabbitmq_url: str, unique: Unique) -> None:
    """Publishes without confirms never wait for the broker, and a direct write does not
    yield: only the first write after the broker's bytes came is direct, the others go
    through anyio's send, which yields, so another task runs between them."""
    publishes = 200
    ran = 0
    done = False

    async def other() -> None:
        nonlocal ran
        while not done:
            ran += 1
            await anyio.lowlevel.checkpoint()

    async with amqp.connect(rabbitmq_url) as conn, conn.channel(confirms=False) as ch:
        q = unique("loop")
        await ch.queue_declare(q)
        async with deleted_afterwards(conn, queues=[q]):
            async with anyio.create_task_group() as tg:
                tg.start_soon(other)
                await anyio.lowlevel.checkpoint()  # other() has started
                started = ran
                for _ in range(publishes):
                    await ch.publish(b"m", routing_key=q)
                ran_meanwhile = ran - started
                done = True
            assert ran_meanwhile >= publishes // 2, ran_meanwhile
            await wait_for_message_count(ch, q, publishes)  # every one reached the broker


async def test_a_backed_up_socket_holds_the_writer(rabbitmq_url: str, unique: Unique) -> None:
    """A message too big for the socket buffers: the kernel takes part, the writer waits
    for the rest to drain (as anyio's send does) and the broker gets it whole."""
    body = os.urandom(8_000_000)
    async with amqp.connect(rabbitmq_url) as conn, conn.channel() as ch:
        q = unique("big")
        await ch.queue_declare(q)
        async with deleted_afterwards(conn, queues=[q]):
            with anyio.fail_after(30):
                await ch.publish(body, routing_key=q)
                msg = await ch.get(q, no_ack=True)
            assert msg is not None and msg.body == body


async def test_reads_are_bounded_and_each_chunk_is_kept_whole(
    rabbitmq_url: str, unique: Unique, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No read asks for more than READ_SIZE (a larger read maps fresh memory each time,
    see _socket_io), and the asyncio feeder, which reads every chunk into the same buffer,
    hands the codec a copy: messages spanning many reads, each different, arrive intact."""
    feed = Transport.feed
    chunks: list[int] = []

    def counting(self: Transport, data: bytes) -> None:
        chunks.append(len(data))
        feed(self, data)

    monkeypatch.setattr(Transport, "feed", counting)
    bodies = [os.urandom(3 * READ_SIZE + 1234 * i) for i in range(8)]
    async with amqp.connect(rabbitmq_url) as conn, conn.channel() as ch:
        q = unique("chunks")
        await ch.queue_declare(q)
        async with deleted_afterwards(conn, queues=[q]):
            for body in bodies:
                await ch.publish(body, routing_key=q)
            received: list[bytes] = []
            with anyio.fail_after(30):
                async with ch.consume(q, prefetch=8) as deliveries:
                    async for msg in deliveries:
                        received.append(msg.body)
                        await msg.ack()
                        if len(received) == len(bodies):
                            break
    assert received == bodies
    assert max(chunks) <= READ_SIZE
    assert sum(1 for n in chunks if n == READ_SIZE) >= 8  # the bodies did take several full reads


async def test_an_error_while_decoding_reaches_the_caller(
    rabbitmq_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On asyncio the chunks are decoded in the protocol's callback, outside any task: an
    error there is raised by the connection's block, not left to the loop's log."""
    feed = Transport.feed
    armed = False

    def failing(self: Transport, data: bytes) -> None:
        if armed:
            raise RuntimeError("a bug in an event handler")
        feed(self, data)

    monkeypatch.setattr(Transport, "feed", failing)
    with pytest.raises(RuntimeError, match="a bug in an event handler"):
        async with amqp.connect(rabbitmq_url) as conn, conn.channel() as ch:
            armed = True
            with anyio.fail_after(10):
                await ch.queue_declare("", exclusive=True)


def test_decoding_knows_its_library_under_plain_asyncio_run(
    rabbitmq_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Servers such as uvicorn start asyncio themselves, not through ``anyio.run``, which
    is what names the library for sniffio.  The loop's callback that decodes has no current
    task to sniff, so the feeder names it: anything the frames' handlers ask anyio (a
    listener reading the clock, an event made) still works there."""
    feed = Transport.feed
    libraries: list[str] = []

    def probing(self: Transport, data: bytes) -> None:
        libraries.append(sniffio.current_async_library())  # raises where nothing names it
        feed(self, data)

    monkeypatch.setattr(Transport, "feed", probing)

    async def main() -> None:
        async with amqp.connect(rabbitmq_url) as conn, conn.channel() as ch:
            await ch.queue_declare("", exclusive=True)

    # A fresh context: nothing set by the test runner (anyio's pytest plugin names the library).
    contextvars.Context().run(asyncio.run, main())
    assert libraries and set(libraries) == {"asyncio"}
