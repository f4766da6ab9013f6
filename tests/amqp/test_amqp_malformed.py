"""Deliveries RabbitMQ accepts but our codec's strict rules refuse are handed out flagged
(``IncomingMessage.malformed``), and the connection stays up.

Before, each of them closed the consumer's whole connection (a ``ProtocolSyntaxError`` or
a ``FrameError`` from the codec), and a recovering consumer got the same message first
again after every reconnect.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pika
import pytest
from harness.hostile import HOSTILE, publish, with_frame_max

from ojs_anyio import amqp

from .amqp_helpers import deleted_afterwards

pytestmark = [pytest.mark.anyio, pytest.mark.rabbitmq_only("a foreign client (pika) publishes the messages")]


async def test_malformed_deliveries_are_flagged_and_the_connection_stays_up(
    amqp_url: str, unique: Callable[[str], str]
) -> None:
    queue = unique("q")
    poison = [("", queue, f"poison {h.name}".encode(), h.pika_properties()) for h in HOSTILE]
    good = [("", queue, b"good %d" % i, pika.BasicProperties(message_id=f"g{i}")) for i in range(3)]
    with anyio.fail_after(30):
        # The consumer's frame_max is smaller than the publisher's (the large-header case).
        async with amqp.connect(with_frame_max(amqp_url)) as conn, deleted_afterwards(conn, queues=[queue]):
            async with conn.channel() as ch:
                await ch.queue_declare(queue)
                await anyio.to_thread.run_sync(publish, amqp_url, [*poison, *good])
                async with ch.consume(queue, prefetch=4) as messages:
                    for case in HOSTILE:
                        msg = await messages.__anext__()
                        assert msg.body == f"poison {case.name}".encode()
                        assert msg.malformed is not None and case.reason in msg.malformed, case.name
                        assert f"malformed={msg.malformed!r}" in repr(msg)
                        await msg.ack()
                    for i in range(3):
                        msg = await messages.__anext__()
                        assert (msg.body, msg.malformed, msg.properties.message_id) == (
                            b"good %d" % i,
                            None,
                            f"g{i}",
                        )
                        await msg.ack()
                # Basic.Get too, and the channel and connection still work.
                await anyio.to_thread.run_sync(publish, amqp_url, poison[:1])
                got = await ch.get(queue)
                assert got is not None and got.malformed == "message_id is not UTF-8"
                assert got.properties.message_id == b"\xff\xfeid"
                assert amqp.property_text(got.properties.message_id) == "\\xff\\xfeid"
                await got.ack()
                assert (await ch.queue_declare(queue, passive=True)).message_count == 0
            assert conn.is_open and conn.reconnections == 0
