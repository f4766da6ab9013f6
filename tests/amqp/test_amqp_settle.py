"""Settling rules the broker would otherwise enforce by closing the channel, and the first
connect trying every host of a multi-host URL."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import pytest
from harness import FaultProxy
from pamqp import commands

import ojs_codec as codec
from ojs_anyio import amqp

from .amqp_helpers import closed_port, deleted_afterwards, wait_until

pytestmark = pytest.mark.anyio


async def _three_messages(ch: amqp.Channel, queue: str) -> list[amqp.IncomingMessage]:
    for i in range(3):
        await ch.publish(f"m{i}".encode(), routing_key=queue)
    got: list[amqp.IncomingMessage] = []
    with anyio.fail_after(10):
        while len(got) < 3:
            msg = await ch.get(queue)
            if msg is not None:
                got.append(msg)
    return got


async def test_multiple_ack_settles_earlier_deliveries_locally(amqp_url: str) -> None:
    async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
        queue = (await ch.queue_declare("", exclusive=True)).name
        first, second, third = await _three_messages(ch, queue)
        await second.ack(multiple=True)  # covers first and second
        with pytest.raises(amqp.DeliveryAlreadySettledError):
            await first.ack()  # caught locally; the broker would have closed the channel (406)
        await third.ack()  # not covered: still ours to settle
        assert ch.is_open
        assert (await ch.queue_declare(queue, passive=True)).message_count == 0
        await ch.publish(b"after", routing_key=queue)  # the channel is still usable
        msg = await ch.get(queue)
        assert msg is not None and msg.body == b"after"
        await msg.ack()


async def test_multiple_nack_settles_earlier_deliveries_locally(amqp_url: str) -> None:
    async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
        queue = (await ch.queue_declare("", exclusive=True)).name
        first, second, _third = await _three_messages(ch, queue)
        await second.nack(requeue=False, multiple=True)
        with pytest.raises(amqp.DeliveryAlreadySettledError):
            await first.reject()
        assert ch.is_open


async def test_recover_makes_earlier_deliveries_stale(amqp_url: str) -> None:
    async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
        queue = (await ch.queue_declare("", exclusive=True)).name
        first, _, _ = await _three_messages(ch, queue)
        await ch.recover(requeue=True)
        assert first.is_stale
        with pytest.raises(amqp.StaleDeliveryError):
            await first.ack()
        assert ch.is_open
        again = await ch.get(queue)
        assert again is not None and again.redelivered
        await again.ack()


@pytest.mark.rabbitmq_only("a host list with a dead TCP port first: memory:// has no ports")
async def test_first_connect_tries_every_host(amqp_url: str, unique: Callable[[str], str]) -> None:
    parsed = amqp.parse_url(amqp_url)
    dead = closed_port()
    url = amqp_url.replace(f"{parsed.host}:{parsed.port}", f"127.0.0.1:{dead},{parsed.host}:{parsed.port}")
    if url == amqp_url:  # URL without an explicit port
        url = amqp_url.replace(f"@{parsed.host}", f"@127.0.0.1:{dead},{parsed.host}:{parsed.port}")
    assert amqp.parse_url(url).hosts[0] == ("127.0.0.1", dead)
    with anyio.fail_after(15):
        async with amqp.connect(url, connection_timeout=5) as conn, conn.channel() as ch:
            queue = (await ch.queue_declare("", exclusive=True)).name
            await ch.publish(b"x", routing_key=queue)


async def test_first_connect_reports_the_last_failure_when_no_host_answers() -> None:
    a, b = closed_port(), closed_port()
    with pytest.raises(amqp.ConnectionLostError, match=str(b)), anyio.fail_after(15):
        async with amqp.connect(f"amqp://guest:guest@127.0.0.1:{a},127.0.0.1:{b}/"):
            pass


@pytest.mark.rabbitmq_only("cuts the TCP connection with a FaultProxy")
async def test_batched_ack_is_sent_even_if_the_consumer_stops_iterating(
    amqp_url: str, unique: Callable[[str], str]
) -> None:
    """An ack made while more deliveries are buffered is batched, not dropped: the
    connection's flusher sends it within milliseconds although the user never asks for
    the next message.  Proof from the broker: after a cut, only the two unacked messages
    come back."""
    queue = unique("q")
    async with (
        amqp.connect(amqp_url) as setup,
        setup.channel() as ch,
        deleted_afterwards(setup, queues=[queue]),
    ):
        await ch.queue_declare(queue)
        for i in range(3):
            await ch.publish(f"m{i}".encode(), routing_key=queue)
        async with FaultProxy() as proxy:
            with anyio.fail_after(15), pytest.raises(amqp.ConnectionLostError):
                async with (
                    amqp.connect(proxy.url()) as conn,
                    conn.channel() as cch,
                    cch.consume(queue, prefetch=3) as messages,
                ):
                    first = await messages.__anext__()
                    while messages.statistics().current_buffer_used < 2:  # noqa: ASYNC110 (broker pushes)
                        await anyio.sleep(0.01)
                    await first.ack()  # batched: two more are buffered
                    await anyio.sleep(0.2)  # time is the behaviour here: the flush bound
                    proxy.cut_all()
                    await anyio.sleep_forever()  # the connection's failure ends the block
        with anyio.fail_after(10):
            back = []
            while len(back) < 2:
                msg = await ch.get(queue)
                if msg is None:
                    await anyio.sleep(0.05)  # the broker requeues asynchronously after the cut
                    continue
                back.append(msg)
                await msg.ack()
        assert sorted(m.body for m in back) == [b"m1", b"m2"]
        assert all(m.redelivered for m in back)
        assert await ch.get(queue) is None


# ------------------------------------------------------------ acks folded into one frame

_BURST = 20


@asynccontextmanager
async def _burst_queue(conn: amqp.Connection) -> AsyncIterator[str]:
    """A queue holding the _BURST messages m0, m1..., deleted afterwards."""
    async with conn.channel() as ch:
        queue = (await ch.queue_declare("")).name
    async with deleted_afterwards(conn, queues=[queue]):
        async with conn.channel() as ch:
            for i in range(_BURST):
                await ch.publish(f"m{i}".encode(), routing_key=queue)
        yield queue


async def _the_burst(messages: amqp.Consumer) -> AsyncIterator[amqp.IncomingMessage]:
    """Once all _BURST messages sit in the consumer's buffer, each of them in turn."""
    await wait_until(lambda: messages.statistics().current_buffer_used == _BURST, what="burst buffered")
    for _ in range(_BURST):
        yield await anext(messages)


@pytest.fixture
def sent_acks(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bool]]:
    """(tag, multiple) of every Basic.Ack the connections hand to their sockets."""
    acks: list[tuple[int, bool]] = []
    reader = codec.FrameReader()
    original = codec.AMQPConnection.data_to_send

    def spy(self: codec.AMQPConnection) -> bytes:
        data = original(self)
        if data and not data.startswith(codec.PROTOCOL_HEADER):
            for kind, _ch, payload in reader.frames(data):
                if kind == codec.FRAME_METHOD:
                    method = codec.decode_method(payload)
                    if isinstance(method, commands.Basic.Ack):
                        acks.append((method.delivery_tag, method.multiple))
        return data

    monkeypatch.setattr(codec.AMQPConnection, "data_to_send", spy)
    return acks


async def test_acks_of_a_buffered_burst_go_out_folded(
    amqp_url: str, sent_acks: list[tuple[int, bool]]
) -> None:
    """Acking each of a burst of deliveries one by one writes a few ``multiple=True`` acks,
    not one frame per delivery (the broker reads a fraction of the frames), and settles
    every one of them: nothing comes back when the channel closes."""
    async with amqp.connect(amqp_url) as conn, _burst_queue(conn) as queue:
        async with conn.channel() as ch, ch.consume(queue, prefetch=_BURST) as messages:
            async for msg in _the_burst(messages):
                await msg.ack()
        assert len(sent_acks) < _BURST // 4, sent_acks
        assert sent_acks[-1] == (_BURST, True)
        async with conn.channel() as ch:
            assert (await ch.queue_declare(queue, passive=True)).message_count == 0


@pytest.mark.parametrize("settle_held", ["hold", "reject"])
async def test_a_held_delivery_is_never_folded_into_a_later_ack(
    amqp_url: str, sent_acks: list[tuple[int, bool]], settle_held: str
) -> None:
    """Delivery 11 is held (or rejected) while the rest of the burst is acked: the folded
    acks settle the others and never that one, which the broker gives back when the
    channel closes (a rejected one is dropped, and the channel stays open)."""
    async with amqp.connect(amqp_url) as conn, _burst_queue(conn) as queue:
        async with conn.channel() as ch, ch.consume(queue, prefetch=_BURST) as messages:
            async for msg in _the_burst(messages):
                if msg.body != b"m10":
                    await msg.ack()
                elif settle_held == "reject":
                    await msg.reject(requeue=False)
            folded = [tag for tag, multiple in sent_acks if multiple]
            assert folded  # folding did happen
            if settle_held == "hold":
                assert max(folded) < 11, sent_acks  # none covers the held delivery
            assert ch.is_open
        # The channel closed with the held delivery unsettled: the broker requeued it.
        held = 0 if settle_held == "reject" else 1
        async with conn.channel() as ch:
            assert (await ch.queue_declare(queue, passive=True)).message_count == held
            bodies = set()
            for _ in range(held):
                got = await ch.get(queue)
                assert got is not None
                bodies.add(got.body)
                await got.ack()
            assert bodies == ({b"m10"} if held else set())
