"""RabbitMQ's queue features the job layer and its users rely on, on both brokers (RabbitMQ and
memory://) with the same assertions: TTLs and expiry at the head, dead-lettering with
``x-death``, length limits, priorities, single active consumer, quorum rules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

from ojs_anyio import amqp

from .amqp_helpers import deleted_afterwards, scratch_channel, wait_for_message_count

pytestmark = pytest.mark.anyio

Unique = Callable[[str], str]


def _death(msg: amqp.IncomingMessage) -> list[dict[str, Any]]:
    headers = msg.properties.headers or {}
    deaths: list[dict[str, Any]] = headers["x-death"]
    return deaths


async def _get(ch: amqp.Channel, queue: str) -> amqp.IncomingMessage:
    msg = await ch.get(queue)
    assert msg is not None
    return msg


async def _dead_lettering_queue(
    ch: amqp.Channel, queue: str, target: str, arguments: dict[str, Any] | None = None
) -> None:
    """Declare ``target``, then ``queue`` (with ``arguments``) dead-lettering into it through
    the default exchange."""
    await ch.queue_declare(target)
    args = {**(arguments or {}), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": target}
    await ch.queue_declare(queue, arguments=args)


async def test_message_ttl_dead_letters_with_x_death(amqp_url: str, unique: Unique) -> None:
    source, target = unique("ttl"), unique("dead")
    with anyio.fail_after(10):
        async with scratch_channel(amqp_url, queues=[source, target]) as ch:
            await _dead_lettering_queue(ch, source, target, {"x-message-ttl": 50})
            await ch.publish(b"late", routing_key=source, mandatory=True)
            await wait_for_message_count(ch, target, 1)
            assert (await ch.queue_declare(source, passive=True)).message_count == 0
            msg = await _get(ch, target)
            assert msg.body == b"late"
            assert (msg.exchange, msg.routing_key) == ("", target)
            death = _death(msg)[0]
            assert death["reason"] == "expired" and death["queue"] == source
            assert death["count"] == 1 and death["exchange"] == ""
            assert list(death["routing-keys"]) == [source]
            headers = msg.properties.headers or {}
            assert headers["x-first-death-reason"] == "expired"
            assert headers["x-first-death-queue"] == source
            await msg.ack()


async def test_per_message_expiration_applies_only_at_the_head(amqp_url: str, unique: Unique) -> None:
    queue, target = unique("head"), unique("dead")
    with anyio.fail_after(10):
        async with scratch_channel(amqp_url, queues=[queue, target]) as ch:
            await _dead_lettering_queue(ch, queue, target)
            await ch.publish(b"long", routing_key=queue, properties=amqp.BasicProperties(expiration="60000"))
            await ch.publish(b"short", routing_key=queue, properties=amqp.BasicProperties(expiration="10"))
            await anyio.sleep(0.3)  # the time that passes is what is tested
            # "short" is overdue but not at the head: it is still counted.
            assert (await ch.queue_declare(queue, passive=True)).message_count == 2
            first = await _get(ch, queue)
            assert first.body == b"long"
            await first.ack()
            # Now at the head, it expires instead of being delivered, and is dead-lettered.
            assert await ch.get(queue) is None
            await wait_for_message_count(ch, target, 1)
            dead = await _get(ch, target)
            assert dead.body == b"short" and _death(dead)[0]["reason"] == "expired"
            assert _death(dead)[0]["original-expiration"] == "10"
            assert dead.properties.expiration is None
            await dead.ack()


async def test_max_length_drop_head_dead_letters_as_maxlen(amqp_url: str, unique: Unique) -> None:
    queue, target = unique("full"), unique("dead")
    with anyio.fail_after(10):
        async with scratch_channel(amqp_url, queues=[queue, target]) as ch:
            await _dead_lettering_queue(ch, queue, target, {"x-max-length": 1})
            await ch.publish(b"old", routing_key=queue)
            await ch.publish(b"new", routing_key=queue)
            await wait_for_message_count(ch, target, 1)
            dropped = await _get(ch, target)
            assert dropped.body == b"old" and _death(dropped)[0]["reason"] == "maxlen"
            await dropped.ack()
            kept = await _get(ch, queue)
            assert kept.body == b"new"
            await kept.ack()


async def test_rejected_twice_counts_two_deaths(amqp_url: str, unique: Unique) -> None:
    queue, target = unique("work"), unique("dead")
    with anyio.fail_after(10):
        async with scratch_channel(amqp_url, queues=[queue, target]) as ch:
            await _dead_lettering_queue(ch, queue, target)
            await ch.publish(b"job", routing_key=queue)
            await (await _get(ch, queue)).reject(requeue=False)
            await wait_for_message_count(ch, target, 1)
            once = await _get(ch, target)
            assert [(d["reason"], d["count"]) for d in _death(once)] == [("rejected", 1)]
            # Sent back with its headers and rejected again: the same entry counts 2.
            await ch.publish(once.body, routing_key=queue, properties=once.properties)
            await once.ack()
            await (await _get(ch, queue)).reject(requeue=False)
            await wait_for_message_count(ch, target, 1)
            twice = await _get(ch, target)
            assert [(d["reason"], d["queue"], d["count"]) for d in _death(twice)] == [("rejected", queue, 2)]
            await twice.ack()


async def test_priority_queue_delivers_highest_first(amqp_url: str, unique: Unique) -> None:
    queue = unique("prio")
    with anyio.fail_after(10):
        async with scratch_channel(amqp_url, queues=[queue]) as ch:
            await ch.queue_declare(queue, arguments={"x-max-priority": 5})
            for body, priority in ((b"p1", 1), (b"none", None), (b"p9", 9), (b"p3", 3), (b"p5", 5)):
                await ch.publish(body, routing_key=queue, properties=amqp.BasicProperties(priority=priority))
            order = []
            while (msg := await ch.get(queue, no_ack=True)) is not None:
                order.append(msg.body)
            # 9 is above x-max-priority: it counts as 5, and equal priorities keep publish
            # order (p9 was published before p5).
            assert order == [b"p9", b"p5", b"p3", b"p1", b"none"]


async def test_single_active_consumer_gets_everything_until_it_leaves(amqp_url: str, unique: Unique) -> None:
    queue = unique("sac")
    with anyio.fail_after(10):
        async with (
            amqp.connect(amqp_url) as conn,
            conn.channel() as ch,
            conn.channel() as other,
            deleted_afterwards(conn, queues=[queue]),
        ):
            await ch.queue_declare(queue, arguments={"x-single-active-consumer": True})
            async with other.consume(queue, prefetch=10) as second:
                async with ch.consume(queue, prefetch=10) as first:
                    for i in range(4):
                        await ch.publish(b"%d" % i, routing_key=queue)
                    # The first consumer registered is `second`: it gets all four.
                    got = []
                    for _ in range(4):
                        msg = await second.__anext__()
                        got.append(msg.body)
                        await msg.ack()
                    assert got == [b"0", b"1", b"2", b"3"]
                    assert first.statistics().current_buffer_used == 0
                await ch.publish(b"after", routing_key=queue)
                msg = await second.__anext__()
                assert msg.body == b"after"
                await msg.ack()


async def test_quorum_queue_rules(amqp_url: str, unique: Unique) -> None:
    queue = unique("quorum")
    with anyio.fail_after(20):
        async with amqp.connect(amqp_url) as conn, deleted_afterwards(conn, queues=[queue]):
            async with conn.channel() as ch:
                with pytest.raises(amqp.PreconditionFailed):
                    await ch.queue_declare(queue, durable=False, arguments={"x-queue-type": "quorum"})
            async with conn.channel() as ch:
                with pytest.raises(amqp.PreconditionFailed):
                    await ch.queue_declare(
                        queue, durable=True, arguments={"x-queue-type": "quorum", "x-max-priority": 5}
                    )
            async with conn.channel() as ch:
                await ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
                await ch.publish(b"q", routing_key=queue)
                msg = await _get(ch, queue)
                await msg.nack(requeue=True)
                await wait_for_message_count(ch, queue, 1)
                again = await _get(ch, queue)
                assert again.redelivered
                assert (again.properties.headers or {}).get("x-delivery-count") == 1
                await again.ack()


async def test_inequivalent_redeclare_and_reserved_names(amqp_url: str, unique: Unique) -> None:
    queue = unique("q")
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn, deleted_afterwards(conn, queues=[queue]):
            async with conn.channel() as ch:
                await ch.queue_declare(queue, arguments={"x-max-length": 5})
                with pytest.raises(amqp.PreconditionFailed) as info:
                    await ch.queue_declare(queue, arguments={"x-max-length": 6})
                assert "inequivalent arg 'x-max-length'" in info.value.reply_text
            async with conn.channel() as ch:
                with pytest.raises(amqp.AccessRefused):
                    await ch.queue_declare("amq.mine")
            async with conn.channel() as ch:
                with pytest.raises(amqp.PreconditionFailed):
                    await ch.queue_declare(unique("bad"), arguments={"x-message-ttl": -1})
            async with conn.channel() as ch:
                with pytest.raises(amqp.AccessRefused):
                    await ch.queue_bind(queue, "")
