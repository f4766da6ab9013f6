"""Consumers: what a delivery carries, settling, the prefetch bound, ends, and isolation."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

from ojs_anyio import amqp

from .amqp_helpers import (
    deleted_afterwards,
    numbered_queue,
    scratch_channel,
    unacked_on,
    wait_for_message_count,
    wait_until,
)

pytestmark = pytest.mark.anyio


async def test_delivery_fields(amqp_url: str) -> None:
    props = amqp.BasicProperties(message_id="m-1", headers={"k": "v"}, content_type="text/plain")
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            queue = (await ch.queue_declare("", exclusive=True)).name
            await ch.queue_bind(queue, "amq.topic", "jobs.#")
            for i in range(3):
                await ch.publish(
                    b"body-%d" % i, exchange="amq.topic", routing_key=f"jobs.{i}", properties=props
                )
            async with ch.consume(queue, prefetch=10, consumer_tag="my-tag") as messages:
                assert messages.consumer_tag == "my-tag" and messages.queue == queue
                got = [await messages.__anext__() for _ in range(3)]
                for i, msg in enumerate(got):
                    assert msg.body == b"body-%d" % i
                    assert (msg.exchange, msg.routing_key) == ("amq.topic", f"jobs.{i}")
                    assert msg.redelivered is False
                    assert msg.consumer_tag == "my-tag"
                    assert msg.properties.message_id == "m-1"
                    assert msg.properties.headers == {"k": "v"}
                    assert msg.properties.content_type == "text/plain"
                    assert msg.channel is ch
                    assert not msg.settled
                assert [m.delivery_tag for m in got] == [1, 2, 3]
                assert messages.unacked == 3
                await got[0].nack(requeue=True)
                again = await messages.__anext__()
                assert again.body == b"body-0" and again.redelivered and again.delivery_tag == 4
                for msg in (*got[1:], again):
                    await msg.ack()
                assert messages.unacked == 0
                assert "body=<6 bytes>" in repr(again)


async def test_settling_twice_is_caught_locally(amqp_url: str) -> None:
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            queue = (await ch.queue_declare("", exclusive=True)).name
            await ch.publish(b"once", routing_key=queue)
            async with ch.consume(queue, prefetch=1) as messages:
                msg = await messages.__anext__()
                await msg.ack()
                assert msg.settled
                for settle in (msg.ack, msg.nack, msg.reject):
                    with pytest.raises(amqp.DeliveryAlreadySettledError):
                        await settle()
                # Nothing reached the broker: the channel is still open and working.
                assert ch.is_open
                await ch.publish(b"next", routing_key=queue)
                nxt = await messages.__anext__()
                assert nxt.body == b"next"
                await nxt.ack()
            assert ch.is_open


async def test_no_ack_deliveries_are_already_settled(amqp_url: str) -> None:
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            queue = (await ch.queue_declare("", exclusive=True)).name
            await ch.publish(b"auto", routing_key=queue)
            async with ch.consume(queue, no_ack=True) as messages:
                msg = await messages.__anext__()
                assert msg.settled
                with pytest.raises(amqp.DeliveryAlreadySettledError):
                    await msg.ack()
            assert await ch.get(queue) is None  # gone for good


async def test_stream_holds_at_most_prefetch(amqp_url: str, unique: Callable[[str], str]) -> None:
    queue = unique("prefetch")
    with anyio.fail_after(20):
        async with scratch_channel(amqp_url, queues=[queue]) as ch:
            await ch.queue_declare(queue, arguments={"x-expires": 60000})
            window = ch.publish_window()
            for i in range(50):
                await window.publish(b"%d" % i, routing_key=queue)
            assert await window.wait_all() == []
            async with ch.consume(queue, prefetch=5) as messages:
                stats = messages.statistics()
                assert stats.max_buffer_size == 5
                await wait_until(lambda: messages.statistics().current_buffer_used == 5, what="buffer full")
                assert messages.unacked == 5
                assert await unacked_on(amqp_url, queue) == 5
                assert (await ch.queue_declare(queue, passive=True)).message_count == 45
                # Reading and acking one lets exactly one more in.
                first = await messages.__anext__()
                await first.ack()
                await wait_until(lambda: messages.statistics().current_buffer_used == 5, what="refilled")
                assert messages.unacked == 5
                assert (await ch.queue_declare(queue, passive=True)).message_count == 44


async def test_queue_deletion_ends_the_stream_with_consumer_cancelled(
    amqp_url: str, unique: Callable[[str], str]
) -> None:
    queue = unique("doomed")
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            await ch.queue_declare(queue, arguments={"x-expires": 60000})
            await ch.publish(b"one", routing_key=queue)
            async with ch.consume(queue, prefetch=5) as messages:
                msg = await messages.__anext__()
                await msg.ack()
                async with conn.channel() as other:
                    await other.queue_delete(queue)
                with pytest.raises(amqp.ConsumerCancelledError) as info:
                    await messages.__anext__()
                assert info.value.consumer_tag == messages.consumer_tag
                assert info.value.queue == queue
                with pytest.raises(amqp.ConsumerCancelledError):  # and it stays ended
                    await messages.__anext__()
            assert ch.is_open  # only the consumer ended
            info_q = await ch.queue_declare("", exclusive=True)
            await ch.publish(b"ok", routing_key=info_q.name)


async def test_normal_end_when_our_side_stops_consuming(amqp_url: str) -> None:
    """Leaving the consume block (or closing the channel) ends iteration without an error."""
    received: list[bytes] = []
    ended = anyio.Event()
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            queue = (await ch.queue_declare("", exclusive=True)).name
            await ch.publish(b"a", routing_key=queue)

            async def iterate(messages: amqp.Consumer) -> None:
                async for msg in messages:
                    received.append(msg.body)
                    await msg.ack()
                ended.set()

            async with anyio.create_task_group() as tg:
                async with ch.consume(queue, prefetch=5) as messages:
                    tg.start_soon(iterate, messages)
                    await wait_until(lambda: received == [b"a"], what="delivery")
                await ended.wait()

            ended = anyio.Event()
            async with anyio.create_task_group() as tg, ch.consume(queue, prefetch=5) as messages:
                tg.start_soon(iterate, messages)
                await ch.aclose()
                await ended.wait()


async def test_leaving_the_block_requeues_buffered_messages(amqp_url: str) -> None:
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            queue = (await ch.queue_declare("", exclusive=True)).name
            for i in range(10):
                await ch.publish(b"%d" % i, routing_key=queue)
            async with ch.consume(queue, prefetch=10) as messages:
                for _ in range(2):
                    await (await messages.__anext__()).ack()
                await wait_until(lambda: messages.statistics().current_buffer_used == 8, what="buffered")
            await wait_for_message_count(ch, queue, 8)
            # The 8 never handed out are back in the queue, in order, for anyone.
            rest = []
            while (msg := await ch.get(queue)) is not None:
                rest.append(msg.body)
                await msg.ack()
            assert rest == [b"%d" % i for i in range(2, 10)]


async def test_unacked_handed_out_messages_return_when_the_channel_closes(amqp_url: str) -> None:
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn:
            async with conn.channel() as ch:
                queue = (await ch.queue_declare("", exclusive=True)).name
                await ch.publish(b"taken", routing_key=queue)
                async with ch.consume(queue, prefetch=1) as messages:
                    msg = await messages.__anext__()
            with pytest.raises(amqp.StaleDeliveryError):
                await msg.ack()
            async with conn.channel() as ch:
                await wait_for_message_count(ch, queue, 1)
                again = await ch.get(queue)
                assert again is not None and again.body == b"taken" and again.redelivered


async def test_slow_consumer_does_not_stall_another_channel(amqp_url: str) -> None:
    with anyio.fail_after(20):
        async with amqp.connect(amqp_url) as conn, conn.channel() as slow_ch, conn.channel() as fast_ch:
            slow_q = (await slow_ch.queue_declare("", exclusive=True)).name
            fast_q = (await fast_ch.queue_declare("", exclusive=True)).name
            async with slow_ch.consume(slow_q, prefetch=5) as slow:
                window = slow_ch.publish_window()
                for i in range(200):
                    await window.publish(b"slow-%d" % i, routing_key=slow_q)
                assert await window.wait_all() == []
                await wait_until(
                    lambda: slow.statistics().current_buffer_used == 5, what="slow consumer full"
                )
                # The slow consumer reads nothing from here on.
                window = fast_ch.publish_window()
                for i in range(500):
                    await window.publish(b"fast-%d" % i, routing_key=fast_q)
                assert await window.wait_all() == []
                async with fast_ch.consume(fast_q, prefetch=20) as fast:
                    count = 0
                    async for msg in fast:
                        assert msg.body == b"fast-%d" % count
                        await msg.ack()
                        count += 1
                        if count == 500:
                            break
                assert slow.statistics().current_buffer_used == 5
                # ...and the slow one still works once it reads.
                first = await slow.__anext__()
                assert first.body == b"slow-0"
                await first.ack()


async def test_slow_consumer_does_not_stall_the_same_channel(amqp_url: str) -> None:
    """Per-consumer prefetch: two consumers on one channel, one never reads."""
    with anyio.fail_after(20):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            q1 = (await ch.queue_declare("", exclusive=True)).name
            q2 = (await ch.queue_declare("", exclusive=True)).name
            for i in range(50):
                await ch.publish(b"%d" % i, routing_key=q1)
            async with ch.consume(q1, prefetch=3) as stuck, ch.consume(q2, prefetch=3) as live:
                await wait_until(lambda: stuck.statistics().current_buffer_used == 3, what="stuck full")
                for i in range(100):
                    await ch.publish(b"live-%d" % i, routing_key=q2)
                    msg = await live.__anext__()
                    assert msg.body == b"live-%d" % i
                    await msg.ack()


async def test_multiple_consumers_and_exclusive_consumer(amqp_url: str) -> None:
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            queue = (await ch.queue_declare("", exclusive=True)).name
            async with ch.consume(queue, prefetch=1, exclusive=True) as only:
                async with conn.channel() as other:
                    with pytest.raises(amqp.AccessRefused) as info:
                        async with other.consume(queue):
                            pass
                    assert info.value.method_name == "Basic.Consume"
                await ch.publish(b"x", routing_key=queue)
                msg = await only.__anext__()
                await msg.ack()
            # Two consumers on one queue share its messages round-robin.
            async with ch.consume(queue, prefetch=1) as c1, ch.consume(queue, prefetch=1) as c2:
                for i in range(4):
                    await ch.publish(b"%d" % i, routing_key=queue)
                got = []
                for consumer in (c1, c2, c1, c2):
                    msg = await consumer.__anext__()
                    got.append(msg.body)
                    await msg.ack()
                assert sorted(got) == [b"0", b"1", b"2", b"3"]


async def test_consuming_a_missing_queue(amqp_url: str, unique: Callable[[str], str]) -> None:
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            with pytest.raises(amqp.NotFound) as info:
                async with ch.consume(unique("missing")):
                    pass
            assert info.value.method_name == "Basic.Consume"
            with pytest.raises(amqp.UsageError):
                async with conn.channel() as ch2, ch2.consume("q", prefetch=0):
                    pass


async def test_max_message_size(amqp_url: str, unique: Callable[[str], str]) -> None:
    """Too large to send: a local UsageError, nothing sent.  Too large to receive: the
    connection fails with FRAME_ERROR (the bound protects memory) and the message stays
    in the queue for a consumer that accepts it."""
    queue = unique("big")
    with anyio.fail_after(20):
        async with (
            amqp.connect(amqp_url) as other,
            other.channel() as och,
            deleted_afterwards(other, queues=[queue]),
        ):
            await och.queue_declare(queue, arguments={"x-expires": 60000})
            with pytest.raises(amqp.ProtocolError) as info:
                async with amqp.connect(amqp_url, max_message_size=1024) as small, small.channel() as ch:
                    with pytest.raises(amqp.UsageError, match="max_message_size"):
                        await ch.publish(b"x" * 1025, routing_key=queue)
                    assert ch.is_open
                    await ch.publish(b"x" * 1024, routing_key=queue)
                    await och.publish(b"y" * 2048, routing_key=queue)
                    async with ch.consume(queue, prefetch=5) as messages:
                        assert (await messages.__anext__()).body == b"x" * 1024
                        await messages.__anext__()
                    pytest.fail("the oversized delivery must end the connection")
            assert info.value.code == 501
            assert "max_message_size" in str(info.value)
            assert not small.is_open
            await wait_for_message_count(och, queue, 2)
            bodies = []
            while (msg := await och.get(queue, no_ack=True)) is not None:
                bodies.append(msg.body)
            assert bodies == [b"x" * 1024, b"y" * 2048]


@pytest.mark.parametrize("no_ack", [False, True], ids=["ack", "no_ack"])
async def test_unbounded_consumer_that_overflows(amqp_url: str, no_ack: bool) -> None:
    """Without a prefetch window the stream is bounded by max_buffer; overflowing ends the
    stream with an error and cancels the consumer at the broker, so no more deliveries
    bounce (or, with no_ack, close the channel over unknown delivery tags)."""
    with anyio.fail_after(20):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            queue = await numbered_queue(ch, 200)
            got = []
            async with ch.consume(queue, prefetch=None, no_ack=no_ack, max_buffer=10) as messages:
                with pytest.raises(amqp.ConsumerCancelledError, match="could not keep up"):
                    async for msg in messages:
                        got.append(msg.body)
                        await anyio.sleep(0.01)  # slower than the broker pushes
                        if not no_ack:
                            await msg.ack()
            assert 10 <= len(got) < 200
            info = await ch.queue_declare(queue, passive=True)
            assert info.consumer_count == 0
            assert ch.is_open
            if not no_ack:  # what was not handed out went back to the queue
                await wait_for_message_count(ch, queue, 200 - len(got))
            await ch.publish(b"after", routing_key=queue)
            assert ch.is_open


async def test_parked_readers_share_deliveries_and_cancelled_ones_lose_none(amqp_url: str) -> None:
    """Several tasks read one consumer: each delivery goes to exactly one of them, readers
    cancelled while parked leave no delivery behind, and the end reaches every reader."""
    with anyio.fail_after(20):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            queue = (await ch.queue_declare("", exclusive=True)).name
            got: dict[str, list[bytes]] = {}
            ended: list[str] = []
            async with ch.consume(queue, prefetch=8) as messages:

                async def reader(name: str, scope: anyio.CancelScope) -> None:
                    got[name] = []
                    with scope:
                        async for msg in messages:
                            got[name].append(msg.body)
                            await msg.ack()
                    if not scope.cancelled_caught:
                        ended.append(name)

                scopes = {f"r{i}": anyio.CancelScope() for i in range(5)}
                async with anyio.create_task_group() as tg:
                    for name, scope in scopes.items():
                        tg.start_soon(reader, name, scope)
                    await wait_until(lambda: messages.statistics().tasks_waiting_receive == 5, what="parked")
                    scopes["r0"].cancel()
                    scopes["r3"].cancel()
                    await wait_until(lambda: messages.statistics().tasks_waiting_receive == 3, what="left")
                    for i in range(40):
                        await ch.publish(b"%d" % i, routing_key=queue)
                    await wait_until(lambda: sum(map(len, got.values())) == 40, what="all read")
                    messages._end(None)  # as when the broker cancels: every reader stops
            bodies = sorted(int(b) for name in got for b in got[name])
            assert bodies == list(range(40))  # each exactly once
            assert got["r0"] == got["r3"] == []
            assert sorted(ended) == ["r1", "r2", "r4"]
            assert messages.unacked == 0


async def test_a_cancelled_loop_over_a_full_buffer_stops_within_the_bound(amqp_url: str) -> None:
    """A buffered message is handed over without a cancellation check, but the consumer
    checkpoints at least once every 32 messages: a cancelled ``async for`` whose body never
    checkpoints stops within 32 messages, and what it did not take stays buffered."""
    with anyio.fail_after(20):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            queue = await numbered_queue(ch, 100)
            async with ch.consume(queue, prefetch=100) as messages:
                await wait_until(lambda: messages.statistics().current_buffer_used == 100, what="buffer full")
                got: list[amqp.IncomingMessage] = []
                with anyio.CancelScope() as scope:
                    async for msg in messages:
                        got.append(msg)  # no checkpoint in the body (no await at all)
                        if len(got) == 5:
                            scope.cancel()
                assert scope.cancelled_caught
                assert 5 <= len(got) <= 5 + 32
                assert messages.statistics().current_buffer_used == 100 - len(got)
                # Cancelled before the first take: at most 32 of the rest.
                with anyio.CancelScope() as scope:
                    scope.cancel()
                    async for msg in messages:
                        got.append(msg)
                assert scope.cancelled_caught
                assert len(got) <= 5 + 2 * 32
                assert messages.statistics().current_buffer_used == 100 - len(got)
                for msg in got:
                    await msg.ack()


async def test_a_burst_reaches_every_parked_reader_while_the_others_are_busy(amqp_url: str) -> None:
    """One wake-up in flight at a time, passed on: each woken reader that leaves deliveries
    buffered wakes the next, so a burst still reaches every parked reader while those
    that took one stay busy (a job that waits), none left waiting in the buffer."""
    with anyio.fail_after(20):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            queue = (await ch.queue_declare("", exclusive=True)).name
            release = anyio.Event()
            holding: list[bytes] = []
            async with ch.consume(queue, prefetch=20) as messages:

                async def reader() -> None:
                    async for msg in messages:
                        holding.append(msg.body)
                        await release.wait()  # busy until released
                        await msg.ack()

                async with anyio.create_task_group() as tg:
                    for _ in range(8):
                        tg.start_soon(reader)
                    await wait_until(lambda: messages.statistics().tasks_waiting_receive == 8, what="parked")
                    window = ch.publish_window()
                    for i in range(8):
                        await window.publish(b"%d" % i, routing_key=queue)
                    assert await window.wait_all() == []
                    await wait_until(lambda: len(holding) == 8, what="every reader holds one")
                    assert messages.statistics().current_buffer_used == 0
                    assert messages.statistics().tasks_waiting_receive == 0
                    release.set()
                    await wait_until(lambda: messages.unacked == 0, what="all acked")
                    tg.cancel_scope.cancel()
            assert sorted(int(b) for b in holding) == list(range(8))
