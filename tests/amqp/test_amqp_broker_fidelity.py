"""What memory:// must do as RabbitMQ 3.10 does, found by running the same probes against
both (docs/testing.md, "memory:// fidelity"): each test runs on RabbitMQ and memory://.

* expiries that fall due while no connection is open are applied at once, not when a new
  connection first waits;
* an exchange redeclared with different arguments is accepted, unless
  ``alternate-exchange`` differs (406);
* a queue redeclared with an argument RabbitMQ does not compare (an unknown ``x-`` one,
  or one it ignores for that queue type) is accepted; the arguments it compares give 406;
* ``x-death[].count`` and ``x-delivery-count`` are int64 (field type ``l``) on the wire.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

from ojs_anyio import amqp

from .amqp_helpers import deleted_afterwards, wait_for_message_count

pytestmark = pytest.mark.anyio

Unique = Callable[[str], str]


async def _get_raw(url: str, queue: str) -> tuple[amqp.IncomingMessage, bytes]:
    """Basic.Get the head of ``queue`` (no ack) on a fresh connection, with the raw bytes
    the broker sent for it (the transport's reads recorded while it comes in)."""
    async with amqp.connect(url) as conn:
        received: list[bytes] = []
        transport = conn._transport
        feed = transport.feed

        def recording(data: bytes) -> None:
            received.append(bytes(data))
            feed(data)

        transport.feed = recording  # type: ignore[method-assign]
        async with conn.channel(confirms=False) as ch:
            received.clear()
            msg = await ch.get(queue, no_ack=True)
            assert msg is not None, f"{queue} is empty"
        return msg, b"".join(received)


def _field_type(raw: bytes, key: str) -> str:
    """The type code of the first field table entry named ``key`` in ``raw``."""
    entry = bytes([len(key)]) + key.encode()
    at = raw.find(entry)
    assert at >= 0, f"{key!r} not in the message"
    return chr(raw[at + len(entry)])


async def test_expiries_due_while_no_connection_is_open_are_applied_at_once(
    amqp_url: str, unique: Unique
) -> None:
    """Expiries that fall due while nobody is connected happen when they are due: a message
    that goes through two TTL queues (how a scheduled job waits, level by level) has
    reached the last queue by the time a new connection looks, as on RabbitMQ.  (Applied
    only when a connection comes back, the second TTL would start then, and a job
    scheduled 1 s ahead would be missing right after a 2 s disconnect.)"""
    first, second, landing = unique("ttl1"), unique("ttl2"), unique("landing")

    def ttl_to(target: str) -> dict[str, object]:
        return {"x-message-ttl": 150, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": target}

    with anyio.fail_after(20):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            await ch.queue_declare(landing)
            await ch.queue_declare(second, arguments=ttl_to(landing))
            await ch.queue_declare(first, arguments=ttl_to(second))
            await ch.publish(b"due", routing_key=first)
        # Nobody is connected while both TTLs pass: time passing is the point here, this
        # waits for nothing to happen.
        await anyio.sleep(0.6)
        async with (
            amqp.connect(amqp_url) as conn,
            conn.channel() as ch,
            deleted_afterwards(conn, queues=[first, second, landing]),
        ):
            assert (await ch.queue_declare(landing, passive=True)).message_count == 1
            assert (await ch.queue_declare(second, passive=True)).message_count == 0


async def test_exchange_redeclare_with_other_arguments(amqp_url: str, unique: Unique) -> None:
    plain, with_alternate = unique("ex"), unique("ex-ae")
    with anyio.fail_after(20):
        async with (
            amqp.connect(amqp_url) as conn,
            deleted_afterwards(conn, exchanges=[plain, with_alternate]),
        ):
            async with conn.channel() as ch:
                await ch.exchange_declare(plain, "direct", arguments={"x-foo": 1})
                await ch.exchange_declare(plain, "direct", arguments={"x-foo": 2})  # accepted
                await ch.exchange_declare(plain, "direct")  # accepted
                await ch.exchange_declare(with_alternate, "direct", arguments={"alternate-exchange": "a1"})
                await ch.exchange_declare(
                    with_alternate, "direct", arguments={"alternate-exchange": "a1", "x": 1}
                )
            for arguments in ({"alternate-exchange": "a2"}, None):
                async with conn.channel() as ch:
                    with pytest.raises(amqp.PreconditionFailed, match="alternate-exchange"):
                        await ch.exchange_declare(with_alternate, "direct", arguments=arguments)
            async with conn.channel() as ch:
                with pytest.raises(amqp.PreconditionFailed, match="alternate-exchange"):
                    await ch.exchange_declare(plain, "direct", arguments={"alternate-exchange": "a1"})


@pytest.mark.parametrize(
    ("arguments", "ignored", "compared"),
    [
        pytest.param(
            {},
            {
                "x-unknown": 1,
                "foo": 5,
                "x-delivery-limit": 5,
                "x-max-age": "1D",
                "x-quorum-initial-group-size": 3,
            },
            {"x-max-length": 5, "x-queue-mode": "lazy", "x-single-active-consumer": True},
            id="classic",
        ),
        pytest.param(
            {"x-queue-type": "quorum"},
            {"x-unknown": 1, "x-max-priority": 5, "x-queue-mode": "lazy"},
            {"x-max-length": 5, "x-delivery-limit": 5, "x-single-active-consumer": True},
            id="quorum",
        ),
    ],
)
async def test_queue_redeclare_with_arguments_rabbitmq_does_not_compare(
    amqp_url: str,
    unique: Unique,
    arguments: dict[str, object],
    ignored: dict[str, object],
    compared: dict[str, object],
) -> None:
    queue = unique("q")
    durable = bool(arguments)
    with anyio.fail_after(20):
        async with amqp.connect(amqp_url) as conn, deleted_afterwards(conn, queues=[queue]):
            async with conn.channel() as ch:
                await ch.queue_declare(queue, durable=durable, arguments=arguments)
                for key, value in ignored.items():
                    await ch.queue_declare(queue, durable=durable, arguments={**arguments, key: value})
            for key, value in compared.items():
                async with conn.channel() as ch:
                    with pytest.raises(amqp.PreconditionFailed, match=key):
                        await ch.queue_declare(queue, durable=durable, arguments={**arguments, key: value})


async def test_x_death_count_and_x_delivery_count_are_int64(amqp_url: str, unique: Unique) -> None:
    queue, dead, quorum = unique("ttl"), unique("dead"), unique("qq")
    with anyio.fail_after(30):
        async with (
            amqp.connect(amqp_url) as conn,
            conn.channel() as ch,
            deleted_afterwards(conn, queues=[queue, dead, quorum]),
        ):
            await ch.queue_declare(dead)
            await ch.queue_declare(
                queue,
                arguments={
                    "x-message-ttl": 0,
                    "x-dead-letter-exchange": "",
                    "x-dead-letter-routing-key": dead,
                },
            )
            await ch.queue_declare(quorum, durable=True, arguments={"x-queue-type": "quorum"})
            await ch.publish(b"dies", routing_key=queue)
            await ch.publish(b"redelivered", routing_key=quorum)
            await wait_for_message_count(ch, dead, 1)
            first = await ch.get(quorum)
            assert first is not None
            await first.nack(requeue=True)
            msg, raw = await _get_raw(amqp_url, dead)
            assert msg.properties.headers is not None
            assert msg.properties.headers["x-death"][0]["count"] == 1
            assert _field_type(raw, "count") == "l"
            msg, raw = await _get_raw(amqp_url, quorum)
            assert msg.properties.headers is not None and msg.properties.headers["x-delivery-count"] == 1
            assert _field_type(raw, "x-delivery-count") == "l"
