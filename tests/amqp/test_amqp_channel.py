"""Channels: ids, typed channel errors that leave the connection and other channels alone."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import anyio.lowlevel
import pytest
from harness import FaultProxy

from ojs_anyio import amqp

from .amqp_helpers import wait_for_message_count, wait_until

pytestmark = pytest.mark.anyio


async def test_channel_ids_are_reused_after_close(amqp_url: str) -> None:
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn:
            async with conn.channel() as ch1, conn.channel() as ch2:
                assert (ch1.channel_id, ch2.channel_id) == (1, 2)
                await ch1.aclose()
                assert not ch1.is_open and ch1.channel_id == 0
                async with conn.channel() as ch3:
                    assert ch3.channel_id == 1
                    info = await ch3.queue_declare("", exclusive=True)
                    await ch3.publish(b"x", routing_key=info.name)
                    assert ch2.is_open
            async with conn.channel() as ch4:
                assert ch4.channel_id == 1


async def test_channel_object_opens_once(amqp_url: str) -> None:
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn:
            ch = conn.channel()
            await ch.open()
            assert ch.is_open
            await ch.aclose()
            await ch.aclose()  # idempotent
            with pytest.raises(amqp.UsageError, match="opened once"):
                await ch.open()


async def test_precondition_failed_closes_only_its_channel(
    amqp_url: str, unique: Callable[[str], str]
) -> None:
    queue = unique("q")
    with anyio.fail_after(20):
        async with amqp.connect(amqp_url) as conn, conn.channel() as healthy, conn.channel() as doomed:
            await healthy.queue_declare(queue, arguments={"x-max-length": 10, "x-expires": 60000})
            try:
                async with healthy.consume(queue, prefetch=10) as messages:
                    await healthy.publish(b"before", routing_key=queue)
                    assert (await messages.__anext__()).body == b"before"

                    with pytest.raises(amqp.PreconditionFailed) as info:
                        await doomed.queue_declare(queue, arguments={"x-max-length": 20, "x-expires": 60000})
                    err = info.value
                    assert err.code == 406
                    assert "inequivalent arg" in err.reply_text and "x-max-length" in err.reply_text
                    assert err.method_name == "Queue.Declare"
                    assert isinstance(err, amqp.ChannelLevelError)
                    assert err.remote

                    # The dead channel says so, with the broker's error as the cause.
                    assert not doomed.is_open
                    assert doomed.closed_error is err
                    with pytest.raises(amqp.ChannelClosedError) as closed:
                        await doomed.publish(b"x", routing_key=queue)
                    assert closed.value.__cause__ is err
                    with pytest.raises(amqp.ChannelClosedError):
                        await doomed.queue_declare("", exclusive=True)
                    with pytest.raises(amqp.ChannelClosedError):
                        await doomed.get(queue)

                    # The connection and the other channel carry on.
                    assert conn.is_open
                    await healthy.publish(b"after", routing_key=queue)
                    msg = await messages.__anext__()
                    assert msg.body == b"after"
                    await msg.ack()

                # A fresh channel works too.
                async with conn.channel() as fresh:
                    assert fresh.channel_id == doomed.channel_id or fresh.channel_id > 0
                    await fresh.publish(b"fresh", routing_key=queue)
                    got = await fresh.get(queue, no_ack=True)
                    assert got is not None and got.body == b"fresh"
            finally:
                await healthy.queue_delete(queue)


async def test_not_found(amqp_url: str, unique: Callable[[str], str]) -> None:
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn:
            async with conn.channel() as ch:
                with pytest.raises(amqp.NotFound) as info:
                    await ch.queue_declare(unique("missing"), passive=True)
                assert info.value.code == 404
                assert "no queue" in info.value.reply_text
                assert info.value.method_name == "Queue.Declare"
                with pytest.raises(amqp.ChannelClosedError):
                    await ch.queue_declare("", exclusive=True)
            async with conn.channel() as ch:
                with pytest.raises(amqp.NotFound) as info:
                    await ch.queue_bind(unique("missing-q"), "amq.direct", "rk")
                assert info.value.method_name == "Queue.Bind"
            async with conn.channel() as ch:
                with pytest.raises(amqp.NotFound) as info:
                    await ch.exchange_declare(unique("missing-x"), passive=True)
                assert info.value.method_name == "Exchange.Declare"
            async with conn.channel() as ch:
                await ch.queue_declare("", exclusive=True)  # the connection is fine


async def test_publish_to_a_missing_exchange_fails_that_publish(
    amqp_url: str, unique: Callable[[str], str]
) -> None:
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn:
            async with conn.channel() as ch:
                with pytest.raises(amqp.PublishError) as info:
                    await ch.publish(b"x", exchange=unique("missing-x"), routing_key="rk")
                # The broker closed the channel (404 on Basic.Publish) before confirming.
                assert "404" in str(info.value) and "NOT_FOUND" in str(info.value)
                assert not ch.is_open
                assert isinstance(ch.closed_error, amqp.NotFound)
                assert ch.closed_error.method_name == "Basic.Publish"
            async with conn.channel() as ch:
                await ch.queue_declare("", exclusive=True)


async def test_access_refused_and_resource_locked(amqp_url: str, unique: Callable[[str], str]) -> None:
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as owner, amqp.connect(amqp_url) as other:
            async with owner.channel() as ch:
                with pytest.raises(amqp.AccessRefused) as refused:
                    await ch.queue_declare("amq.reserved-" + unique("q"))
                assert refused.value.code == 403
            async with owner.channel() as ch, other.channel() as ch2:
                info = await ch.queue_declare(unique("excl"), exclusive=True)
                with pytest.raises(amqp.ResourceLocked) as locked:
                    await ch2.queue_declare(info.name, passive=True)
                assert locked.value.code == 405
                assert "exclusive" in locked.value.reply_text
                assert ch.is_open  # the owner's channel is untouched


async def test_consumer_on_a_channel_the_broker_closes(amqp_url: str, unique: Callable[[str], str]) -> None:
    """A consumer whose channel dies ends with ChannelClosedError (not a normal end)."""
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            info = await ch.queue_declare("", exclusive=True)
            async with ch.consume(info.name, prefetch=5) as messages:
                with pytest.raises(amqp.NotFound):
                    await ch.queue_declare(unique("missing"), passive=True)
                with pytest.raises(amqp.ChannelClosedError) as closed:
                    await messages.__anext__()
                assert isinstance(closed.value.__cause__, amqp.NotFound)


async def test_concurrent_rpcs_on_one_channel_are_serialised(amqp_url: str) -> None:
    """AMQP allows one synchronous method at a time per channel; concurrent callers queue."""
    names: list[str] = []
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:

            async def declare() -> None:
                names.append((await ch.queue_declare("", exclusive=True)).name)

            async with anyio.create_task_group() as tg:
                for _ in range(20):
                    tg.start_soon(declare)
            assert len(set(names)) == 20
            assert ch.is_open


async def test_many_channels_on_one_connection(amqp_url: str) -> None:
    with anyio.fail_after(20):
        async with amqp.connect(amqp_url) as conn:
            channels = [await conn.channel().__aenter__() for _ in range(50)]
            assert sorted(ch.channel_id for ch in channels) == list(range(1, 51))

            async def use(ch: amqp.Channel) -> None:
                info = await ch.queue_declare("", exclusive=True)
                await ch.publish(b"%d" % ch.channel_id, routing_key=info.name)
                msg = await ch.get(info.name, no_ack=True)
                assert msg is not None and msg.body == b"%d" % ch.channel_id
                await ch.aclose()

            async with anyio.create_task_group() as tg:
                for ch in channels:
                    tg.start_soon(use, ch)
            assert not any(ch.is_open for ch in channels)


@pytest.mark.usefixtures("rabbitmq_url")
async def test_closing_a_channel_fails_calls_waiting_on_it() -> None:
    """aclose() while other tasks wait for replies on the channel: they fail at once with
    ChannelClosedError instead of waiting for a reply the closing channel drops."""
    failures: list[BaseException] = []
    async with FaultProxy() as proxy:
        with anyio.fail_after(10):
            async with amqp.connect(proxy.url()) as conn, conn.channel() as ch:
                queue = (await ch.queue_declare("", exclusive=True)).name
                proxy.stall("downstream")

                async def call() -> None:
                    try:
                        await ch.queue_declare(queue, passive=True)
                    except amqp.AMQPError as exc:
                        failures.append(exc)

                async with anyio.create_task_group() as tg:
                    for _ in range(3):  # one waits for its reply, two queue behind it
                        tg.start_soon(call)
                    await wait_until(lambda: ch._waiter is not None, what="call in flight")
                    async with anyio.create_task_group() as closer:
                        closer.start_soon(ch.aclose)
                        await anyio.lowlevel.checkpoint()
                        proxy.unstall("downstream")
                assert not ch.is_open
                assert len(failures) == 3
                assert all(isinstance(e, amqp.ChannelClosedError) for e in failures)
                async with conn.channel() as fresh:
                    await fresh.queue_declare(queue, passive=True)


@pytest.mark.usefixtures("rabbitmq_url")
async def test_operations_on_a_closing_channel_raise_channel_closed() -> None:
    async with FaultProxy() as proxy:
        with anyio.fail_after(10):
            async with amqp.connect(proxy.url(), close_timeout=2) as conn, conn.channel() as ch:
                queue = (await ch.queue_declare("", exclusive=True)).name
                proxy.stall("downstream")  # Close-Ok is held back: the channel stays "closing"
                async with anyio.create_task_group() as tg:
                    tg.start_soon(ch.aclose)
                    await wait_until(lambda: ch._close_waiter is not None, what="closing")
                    with pytest.raises(amqp.ChannelClosedError):
                        await ch.publish(b"x", routing_key=queue)
                    with pytest.raises(amqp.ChannelClosedError):
                        await ch.get(queue)
                    proxy.unstall("downstream")
                assert not ch.is_open


async def test_closing_a_channel_with_content_in_flight(amqp_url: str) -> None:
    """Basic.Return / Get-Ok content that arrives after we sent Channel.Close is dropped
    whole (method, header and body frames); the connection is not failed over it."""
    body = b"r" * 300_000  # several frames per message
    with anyio.fail_after(20):
        async with amqp.connect(amqp_url) as conn:
            async with conn.channel() as keep:
                queue = (await keep.queue_declare("", exclusive=True)).name
                for _ in range(3):
                    await keep.publish(body, routing_key=queue)
                for _ in range(5):
                    async with conn.channel() as ch:
                        window = ch.publish_window()
                        for _ in range(20):
                            await window.publish(body, routing_key="nowhere", mandatory=True)
                        await window.flush()
                        with anyio.move_on_after(0):
                            await ch.get(queue)  # sent; its Get-Ok comes after our Close
                    # leaving the block closed the channel with returns and a Get-Ok in flight
                    assert conn.is_open
                await wait_for_message_count(keep, queue, 3)
                got = await keep.get(queue, no_ack=True)
                assert got is not None and got.body == body
            assert conn.is_open
