"""Cancelling operations mid-flight leaves the connection and channel consistent and usable."""

from __future__ import annotations

import random

import anyio
import anyio.lowlevel
import pytest
from harness import FaultProxy

from ojs_anyio import amqp

from .amqp_helpers import drain, wait_for_message_count, wait_until

pytestmark = pytest.mark.anyio


async def _still_works(ch: amqp.Channel, queue: str, body: bytes = b"still works") -> None:
    await ch.publish(body, routing_key=queue)
    seen = await drain(ch, queue)
    assert seen[-1:] == [body]


@pytest.mark.usefixtures("rabbitmq_url")
async def test_cancel_a_publish_waiting_for_its_confirm() -> None:
    async with FaultProxy() as proxy:
        with anyio.fail_after(20):
            async with amqp.connect(proxy.url()) as conn, conn.channel() as ch:
                queue = (await ch.queue_declare("", exclusive=True)).name
                proxy.stall("downstream")
                with anyio.move_on_after(0.3) as scope:
                    await ch.publish(b"cancelled while waiting", routing_key=queue)
                assert scope.cancelled_caught
                assert ch.unconfirmed == 1  # sent; its confirm is still to come
                proxy.unstall("downstream")
                await wait_until(lambda: ch.unconfirmed == 0, what="late confirm")
                # Same connection, same channel.
                await ch.publish(b"after", routing_key=queue)
                assert await drain(ch, queue) == [b"cancelled while waiting", b"after"]
                assert conn.is_open and ch.is_open


@pytest.mark.rabbitmq_only("needs network latency: memory:// confirms before the earliest cancel point")
async def test_cancel_publishes_at_random_points(amqp_url: str) -> None:
    """Cancellation at any await of publish never corrupts the stream (sends are shielded)."""
    rng = random.Random(1234)
    body = b"x" * 200_000  # several frames
    with anyio.fail_after(30):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            queue = (await ch.queue_declare("", exclusive=True)).name
            cancelled = 0
            for _ in range(150):
                with anyio.move_on_after(rng.choice([0, 0.0001, 0.0005, 0.001])) as scope:
                    await ch.publish(body, routing_key=queue)
                cancelled += scope.cancelled_caught
            assert cancelled > 0
            await wait_until(lambda: ch.unconfirmed == 0, what="confirms")
            assert conn.is_open and ch.is_open
            count = (await ch.queue_declare(queue, passive=True)).message_count
            assert 150 - cancelled <= count <= 150
            await ch.queue_purge(queue)
            await _still_works(ch, queue)


async def test_cancel_a_publish_window(amqp_url: str) -> None:
    with anyio.fail_after(20):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            queue = (await ch.queue_declare("", exclusive=True)).name
            window = ch.publish_window(max_in_flight=8)
            with anyio.move_on_after(0.001):
                for i in range(5000):
                    await window.publish(b"%d" % i, routing_key=queue)
            assert await window.wait_all() == []
            assert window.in_flight == 0
            await _still_works(ch, queue)


async def test_cancel_a_consume_loop(amqp_url: str) -> None:
    handled: list[bytes] = []
    with anyio.fail_after(20):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            queue = (await ch.queue_declare("", exclusive=True)).name
            for i in range(20):
                await ch.publish(b"%d" % i, routing_key=queue)
            with anyio.CancelScope() as scope:
                async with ch.consume(queue, prefetch=5) as messages:
                    async for msg in messages:
                        handled.append(msg.body)
                        await msg.ack()
                        if len(handled) == 7:
                            scope.cancel()
            assert scope.cancelled_caught
            # A buffered message is taken without a cancellation check: the loop may go on
            # with what was buffered, at most 32 more messages (Consumer's docstring).
            handled_n = len(handled)
            assert 7 <= handled_n <= 7 + 32
            assert handled == [b"%d" % i for i in range(handled_n)]
            # The consumer is gone at the broker; what it buffered went back, in order.
            assert (await ch.queue_declare(queue, passive=True)).consumer_count == 0
            await wait_for_message_count(ch, queue, 20 - handled_n)
            assert await drain(ch, queue) == [b"%d" % i for i in range(handled_n, 20)]
            await _still_works(ch, queue)
            # And consuming again works.
            await ch.publish(b"again", routing_key=queue)
            async with ch.consume(queue, prefetch=5) as messages:
                msg = await messages.__anext__()
                assert msg.body == b"again"
                await msg.ack()


async def test_cancel_a_consumer_waiting_for_messages(amqp_url: str) -> None:
    with anyio.fail_after(20):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            queue = (await ch.queue_declare("", exclusive=True)).name
            with anyio.move_on_after(0.2) as scope:
                async with ch.consume(queue, prefetch=5) as messages:
                    async for _ in messages:
                        pytest.fail("nothing was published")
            assert scope.cancelled_caught
            assert (await ch.queue_declare(queue, passive=True)).consumer_count == 0
            await _still_works(ch, queue)


@pytest.mark.usefixtures("rabbitmq_url")
async def test_cancel_an_rpc_waiting_for_its_reply() -> None:
    async with FaultProxy() as proxy:
        with anyio.fail_after(20):
            async with amqp.connect(proxy.url()) as conn, conn.channel() as ch:
                queue = (await ch.queue_declare("", exclusive=True)).name
                proxy.stall("downstream")
                with anyio.move_on_after(0.3) as scope:
                    await ch.queue_declare("", exclusive=True)
                assert scope.cancelled_caught
                proxy.unstall("downstream")
                # The late Declare-Ok must not be taken for the reply to the next call.
                await ch.publish(b"m", routing_key=queue)
                info = await ch.queue_declare(queue, passive=True)
                assert info.name == queue and info.message_count == 1
                got = await ch.get(queue, no_ack=True)
                assert got is not None and got.body == b"m"
                await _still_works(ch, queue)


async def test_cancel_a_get(amqp_url: str) -> None:
    with anyio.fail_after(20):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            queue = (await ch.queue_declare("", exclusive=True)).name
            for i in range(50):
                await ch.publish(b"%d" % i, routing_key=queue)
            rng = random.Random(7)
            got: list[amqp.IncomingMessage] = []
            for _ in range(50):
                with anyio.move_on_after(rng.choice([0, 0.0002, 0.001])):
                    msg = await ch.get(queue)
                    if msg is not None:
                        got.append(msg)
            for msg in got:
                await msg.ack()
            assert ch.is_open
            # Every message is either acked or still in the queue (or out, unacked, after a
            # cancelled get: it returns when the channel closes).
            remaining = len(await drain(ch, queue))
            assert len(got) + remaining <= 50
            await _still_works(ch, queue)


@pytest.mark.usefixtures("rabbitmq_url")
async def test_cancel_opening_a_channel() -> None:
    async with FaultProxy() as proxy:
        with anyio.fail_after(20):
            async with amqp.connect(proxy.url()) as conn:
                proxy.stall("downstream")
                with anyio.move_on_after(0.3) as scope:
                    async with conn.channel():
                        pytest.fail("Open-Ok cannot arrive")
                assert scope.cancelled_caught
                proxy.unstall("downstream")
                async with conn.channel() as ch:
                    queue = (await ch.queue_declare("", exclusive=True)).name
                    await _still_works(ch, queue)
                # The half-opened channel was not leaked.
                await wait_until(lambda: conn._proto.open_channel_ids == [], what="channels released")


@pytest.mark.usefixtures("rabbitmq_url")
async def test_cancel_while_closing_a_channel() -> None:
    async with FaultProxy() as proxy:
        with anyio.fail_after(20):
            async with amqp.connect(proxy.url(), close_timeout=0.5) as conn:
                ch = await conn.channel().__aenter__()
                proxy.stall("downstream")
                started = anyio.current_time()
                with anyio.move_on_after(0.1):
                    await ch.aclose()  # shielded, bounded by close_timeout
                assert anyio.current_time() - started < 1.5
                assert not ch.is_open
                proxy.unstall("downstream")
                await ch.aclose()
                assert not ch.is_open
                async with conn.channel() as ch2:
                    queue = (await ch2.queue_declare("", exclusive=True)).name
                    await _still_works(ch2, queue)
