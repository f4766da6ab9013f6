"""The AMQP 0-9-1 model on the real broker: exchanges, queues, bindings, basic.*, tx."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from harness import rabbitmqctl

from ojs_anyio import amqp

from .amqp_helpers import deleted_afterwards, drain, memory_rows, scratch_channel, wait_for_message_count

pytestmark = pytest.mark.anyio

Unique = Callable[[str], str]


async def _list(url: str, kind: str, *columns: str) -> dict[str, dict[str, Any]]:
    import json

    if url.startswith("memory://"):
        return memory_rows(url, kind)

    output = await rabbitmqctl(f"list_{kind}", "name", *columns, "--formatter", "json", "-q")
    return {row["name"]: row for row in json.loads(output)} if output.strip() else {}


# ---------------------------------------------------------------------- exchanges


async def test_exchange_declare_every_type_and_flag(amqp_url: str, unique: Unique) -> None:
    direct, fanout, topic, headers = (unique(t) for t in ("direct", "fanout", "topic", "headers"))
    alternate = unique("ae")
    with anyio.fail_after(20):
        async with (
            amqp.connect(amqp_url) as conn,
            conn.channel() as ch,
            deleted_afterwards(conn, exchanges=[direct, fanout, topic, headers, alternate]),
        ):
            await ch.exchange_declare(alternate, "fanout")
            await ch.exchange_declare(
                direct, "direct", durable=True, arguments={"alternate-exchange": alternate}
            )
            await ch.exchange_declare(fanout, "fanout", auto_delete=True)
            await ch.exchange_declare(topic, "topic", internal=True)
            await ch.exchange_declare(headers, "headers")
            columns = ("type", "durable", "auto_delete", "internal", "arguments")
            rows = await _list(amqp_url, "exchanges", *columns)
            assert rows[direct]["type"] == "direct" and rows[direct]["durable"] is True
            assert rows[direct]["arguments"] == [["alternate-exchange", "longstr", alternate]]
            assert rows[fanout]["type"] == "fanout" and rows[fanout]["auto_delete"] is True
            assert rows[fanout]["durable"] is False
            assert rows[topic]["type"] == "topic" and rows[topic]["internal"] is True
            assert rows[headers]["type"] == "headers"
            # Passive: succeeds for an existing exchange (whatever type is given).
            for name in (direct, fanout, topic, headers):
                await ch.exchange_declare(name, passive=True)
            # Redeclaring with the same settings is fine; with others, 406.
            await ch.exchange_declare(headers, "headers")
            async with conn.channel() as other:
                with pytest.raises(amqp.PreconditionFailed) as info:
                    await other.exchange_declare(headers, "fanout")
                assert info.value.method_name == "Exchange.Declare"
            # An internal exchange refuses direct publishes (403 on Basic.Publish).
            async with conn.channel() as other:
                with pytest.raises(amqp.PublishError):
                    await other.publish(b"x", exchange=topic, routing_key="a")
                assert isinstance(other.closed_error, amqp.AccessRefused)


async def test_exchange_delete(amqp_url: str, unique: Unique) -> None:
    exchange = unique("x")
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn:
            async with deleted_afterwards(conn, exchanges=[exchange]), conn.channel() as ch:
                await ch.exchange_declare(exchange, "fanout")
                info = await ch.queue_declare("", exclusive=True)
                await ch.queue_bind(info.name, exchange)
                # if_unused: refused while a queue is bound.
                with pytest.raises(amqp.PreconditionFailed):
                    await ch.exchange_delete(exchange, if_unused=True)
            async with conn.channel() as ch:
                await ch.exchange_delete(exchange)
                with pytest.raises(amqp.NotFound):
                    await ch.exchange_declare(exchange, passive=True)


async def test_alternate_exchange_argument_takes_effect(amqp_url: str, unique: Unique) -> None:
    main, alternate = unique("main"), unique("ae")
    with anyio.fail_after(10):
        async with scratch_channel(amqp_url, exchanges=[main, alternate]) as ch:
            await ch.exchange_declare(alternate, "fanout")
            await ch.exchange_declare(main, "direct", arguments={"alternate-exchange": alternate})
            caught = (await ch.queue_declare("", exclusive=True)).name
            await ch.queue_bind(caught, alternate)
            await ch.publish(b"unroutable on main", exchange=main, routing_key="nobody", mandatory=True)
            assert await drain(ch, caught) == [b"unroutable on main"]


async def test_exchange_to_exchange_bind_and_unbind(amqp_url: str, unique: Unique) -> None:
    source, destination = unique("src"), unique("dst")
    with anyio.fail_after(10):
        async with scratch_channel(amqp_url, exchanges=[source, destination]) as ch:
            await ch.exchange_declare(source, "topic")
            await ch.exchange_declare(destination, "direct")
            queue = (await ch.queue_declare("", exclusive=True)).name
            await ch.queue_bind(queue, destination, "orders.created")
            await ch.exchange_bind(destination, source, "orders.*")

            await ch.publish(b"flows", exchange=source, routing_key="orders.created", mandatory=True)
            await ch.publish(b"filtered", exchange=destination, routing_key="other")
            assert await drain(ch, queue) == [b"flows"]

            await ch.exchange_unbind(destination, source, "orders.*")
            with pytest.raises(amqp.UnroutableError):
                await ch.publish(b"stops", exchange=source, routing_key="orders.created", mandatory=True)
            assert await drain(ch, queue) == []


# ---------------------------------------------------------------------- routing by exchange type


async def test_routing_by_type(amqp_url: str, unique: Unique) -> None:
    fanout, topic, headers = unique("fanout"), unique("topic"), unique("headers")
    with anyio.fail_after(10):
        async with scratch_channel(amqp_url, exchanges=[fanout, topic, headers]) as ch:
            await ch.exchange_declare(fanout, "fanout")
            await ch.exchange_declare(topic, "topic")
            await ch.exchange_declare(headers, "headers")
            q1, q2 = [(await ch.queue_declare("", exclusive=True)).name for _ in range(2)]
            # fanout: every bound queue, whatever the key
            await ch.queue_bind(q1, fanout)
            await ch.queue_bind(q2, fanout)
            await ch.publish(b"f", exchange=fanout, routing_key="ignored")
            assert (await drain(ch, q1), await drain(ch, q2)) == ([b"f"], [b"f"])
            # topic: patterns
            await ch.queue_bind(q1, topic, "jobs.*.high")
            await ch.queue_bind(q2, topic, "jobs.#")
            for key in ("jobs.email.high", "jobs.email.low", "jobs.a.b.high", "other"):
                await ch.publish(key.encode(), exchange=topic, routing_key=key)
            assert await drain(ch, q1) == [b"jobs.email.high"]
            assert await drain(ch, q2) == [b"jobs.email.high", b"jobs.email.low", b"jobs.a.b.high"]
            # headers: x-match all / any
            await ch.queue_bind(q1, headers, arguments={"x-match": "all", "kind": "email", "tier": "gold"})
            await ch.queue_bind(q2, headers, arguments={"x-match": "any", "kind": "email", "tier": "gold"})
            for hdrs in ({"kind": "email", "tier": "gold"}, {"kind": "email"}, {"kind": "sms"}):
                await ch.publish(
                    repr(sorted(hdrs.items())).encode(),
                    exchange=headers,
                    properties=amqp.BasicProperties(headers=hdrs),
                )
            assert len(await drain(ch, q1)) == 1
            assert len(await drain(ch, q2)) == 2
            await ch.queue_unbind(q2, headers, arguments={"x-match": "any", "kind": "email", "tier": "gold"})
            await ch.publish(
                b"h", exchange=headers, properties=amqp.BasicProperties(headers={"kind": "email"})
            )
            assert await drain(ch, q2) == []


# ---------------------------------------------------------------------- queues


async def test_queue_declare_variants(amqp_url: str, unique: Unique) -> None:
    named, auto = unique("named"), unique("auto")
    with anyio.fail_after(20):
        async with scratch_channel(amqp_url, queues=[named, auto]) as ch:
            server_named = await ch.queue_declare("", exclusive=True)
            assert server_named.name.startswith("amq.gen-")
            assert (server_named.message_count, server_named.consumer_count) == (0, 0)

            info = await ch.queue_declare(
                named, durable=True, arguments={"x-max-length": 2, "x-expires": 60000}
            )
            assert info.name == named
            for i in range(3):
                await ch.publish(b"%d" % i, routing_key=named)
            passive = await ch.queue_declare(named, passive=True)
            assert passive.message_count == 2  # x-max-length=2 dropped the oldest
            async with ch.consume(named, prefetch=1):
                passive = await ch.queue_declare(named, passive=True)
                assert passive.consumer_count == 1
                assert passive.message_count == 1  # one is out with the consumer

            rows = await _list(amqp_url, "queues", "durable", "auto_delete", "exclusive", "arguments")
            assert rows[named]["durable"] is True and rows[named]["exclusive"] is False
            assert ["x-max-length", "byte", 2] in rows[named]["arguments"] or any(
                arg[0] == "x-max-length" and arg[2] == 2 for arg in rows[named]["arguments"]
            )
            assert rows[server_named.name]["exclusive"] is True

            # auto_delete: the queue goes when its last consumer does.
            await ch.queue_declare(auto, auto_delete=True)
            async with ch.consume(auto, prefetch=1):
                pass
            with pytest.raises(amqp.NotFound):
                await ch.queue_declare(auto, passive=True)


async def test_exclusive_queue_is_private_and_dies_with_its_connection(amqp_url: str, unique: Unique) -> None:
    name = unique("excl")
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            await ch.queue_declare(name, exclusive=True)
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            with pytest.raises(amqp.NotFound):
                await ch.queue_declare(name, passive=True)


async def test_bind_unbind_purge_delete(amqp_url: str, unique: Unique) -> None:
    queue = unique("q")
    with anyio.fail_after(10):
        async with (
            amqp.connect(amqp_url) as conn,
            conn.channel() as ch,
            deleted_afterwards(conn, queues=[queue]),
        ):
            await ch.queue_declare(queue, arguments={"x-expires": 60000})
            await ch.queue_bind(queue, "amq.direct", "rk")
            for _ in range(5):
                await ch.publish(b"m", exchange="amq.direct", routing_key="rk", mandatory=True)
            assert await ch.queue_purge(queue) == 5
            assert await ch.queue_purge(queue) == 0
            await ch.queue_unbind(queue, "amq.direct", "rk")
            with pytest.raises(amqp.UnroutableError):
                await ch.publish(b"m", exchange="amq.direct", routing_key="rk", mandatory=True)
            await ch.publish(b"a", routing_key=queue)
            await ch.publish(b"b", routing_key=queue)
            # if_empty refuses a queue with messages.
            async with conn.channel() as other:
                with pytest.raises(amqp.PreconditionFailed):
                    await other.queue_delete(queue, if_empty=True)
            assert await ch.queue_delete(queue) == 2
            with pytest.raises(amqp.NotFound):
                await ch.queue_declare(queue, passive=True)


# ---------------------------------------------------------------------- basic


async def test_default_exchange_and_properties_round_trip(amqp_url: str) -> None:
    stamp = datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.UTC)
    headers: dict[str, Any] = {
        "str": "é",
        "int": -5,
        "big": 2**40,
        "float": 1.5,
        "bool": True,
        "none": None,
        "list": [1, "two", [3]],
        "table": {"nested": {"deep": b"bytes"}},
    }
    props = amqp.BasicProperties(
        content_type="application/json",
        content_encoding="utf-8",
        headers=headers,
        delivery_mode=2,
        priority=3,
        correlation_id="corr",
        reply_to="replies",
        expiration="60000",
        message_id="mid-1",
        timestamp=stamp,
        type="job.email",
        user_id="guest",
        app_id="tests",
    )
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            queue = (await ch.queue_declare("", exclusive=True)).name
            await ch.publish(b'{"a": 1}', exchange="", routing_key=queue, properties=props)
            msg = await ch.get(queue)
            assert msg is not None
            assert msg.body == b'{"a": 1}'
            assert (msg.exchange, msg.routing_key, msg.redelivered) == ("", queue, False)
            assert msg.message_count == 0
            got = msg.properties
            for field in (
                "content_type",
                "content_encoding",
                "delivery_mode",
                "priority",
                "correlation_id",
                "reply_to",
                "expiration",
                "message_id",
                "timestamp",
                "type",
                "user_id",
                "app_id",
            ):
                assert getattr(got, field) == getattr(props, field), field
            assert got.headers is not None
            assert got.headers["str"] == "é" and got.headers["int"] == -5 and got.headers["big"] == 2**40
            assert got.headers["float"] == 1.5 and got.headers["bool"] is True and got.headers["none"] is None
            assert got.headers["list"] == [1, "two", [3]]
            assert got.headers["table"]["nested"]["deep"] in (b"bytes", "bytes")
            await msg.ack()


async def test_get_empty_and_message_count(amqp_url: str) -> None:
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            queue = (await ch.queue_declare("", exclusive=True)).name
            assert await ch.get(queue) is None
            for i in range(3):
                await ch.publish(b"%d" % i, routing_key=queue)
            first = await ch.get(queue, no_ack=True)
            assert first is not None and first.body == b"0" and first.message_count == 2
            assert first.settled  # no_ack: nothing to settle
            with pytest.raises(amqp.DeliveryAlreadySettledError):
                await first.ack()


async def test_ack_nack_reject(amqp_url: str) -> None:
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            queue = (await ch.queue_declare("", exclusive=True)).name
            for body in (b"nack-requeue", b"reject-requeue", b"nack-drop", b"reject-drop", b"ack"):
                await ch.publish(body, routing_key=queue)

            async def get() -> amqp.IncomingMessage:
                msg = await ch.get(queue)
                assert msg is not None
                return msg

            m = await get()
            assert m.body == b"nack-requeue" and not m.redelivered
            await m.nack(requeue=True)
            await wait_for_message_count(ch, queue, 5)
            again = await get()
            assert again.body == b"nack-requeue" and again.redelivered  # back at the head
            await again.ack()

            m = await get()
            assert m.body == b"reject-requeue"
            await m.reject(requeue=True)
            await wait_for_message_count(ch, queue, 4)
            again = await get()
            assert again.body == b"reject-requeue" and again.redelivered
            await again.ack()

            m = await get()
            assert m.body == b"nack-drop"
            await m.nack(requeue=False)
            m = await get()
            assert m.body == b"reject-drop"
            await m.reject(requeue=False)
            m = await get()
            assert m.body == b"ack"
            await m.ack()
            assert await ch.get(queue) is None
            assert (await ch.queue_declare(queue, passive=True)).message_count == 0


async def test_ack_multiple(amqp_url: str) -> None:
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn:
            async with conn.channel() as ch:
                queue = (await ch.queue_declare("", exclusive=True)).name
                for i in range(3):
                    await ch.publish(b"%d" % i, routing_key=queue)
                got = [await ch.get(queue) for _ in range(3)]
                assert all(m is not None for m in got)
                last = got[-1]
                assert last is not None
                await last.ack(multiple=True)
            # Closing the channel would requeue anything unacked: nothing is.
            async with conn.channel() as ch:
                assert (await ch.queue_declare(queue, passive=True)).message_count == 0


async def test_unacked_messages_return_when_the_channel_closes(amqp_url: str) -> None:
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn:
            async with conn.channel() as ch:
                queue = (await ch.queue_declare("", exclusive=True)).name
                await ch.publish(b"x", routing_key=queue)
                msg = await ch.get(queue)
                assert msg is not None
            with pytest.raises(amqp.StaleDeliveryError):
                await msg.ack()  # its channel is gone; nothing is sent
            async with conn.channel() as ch:
                await wait_for_message_count(ch, queue, 1)
                again = await ch.get(queue)
                assert again is not None and again.redelivered


async def test_basic_recover(amqp_url: str) -> None:
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            queue = (await ch.queue_declare("", exclusive=True)).name
            await ch.publish(b"r", routing_key=queue)
            msg = await ch.get(queue)
            assert msg is not None and not msg.redelivered
            assert await ch.get(queue) is None  # it's out, unacked
            await ch.recover(requeue=True)
            await wait_for_message_count(ch, queue, 1)
            again = await ch.get(queue)
            assert again is not None and again.body == b"r" and again.redelivered
            await again.ack()


async def test_basic_qos_bounds_deliveries(amqp_url: str) -> None:
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            queue = (await ch.queue_declare("", exclusive=True)).name
            for i in range(10):
                await ch.publish(b"%d" % i, routing_key=queue)
            await ch.basic_qos(3)
            assert ch.prefetch == 3
            async with ch.consume(queue, prefetch=None) as messages:
                first = [await messages.__anext__() for _ in range(3)]
                # The broker holds the rest back until something is acked.
                assert (await ch.queue_declare(queue, passive=True)).message_count == 7
                await first[0].ack()
                fourth = await messages.__anext__()
                assert fourth.body == b"3"
                assert (await ch.queue_declare(queue, passive=True)).message_count == 6


# ---------------------------------------------------------------------- transactions


async def test_tx_commit_and_rollback(amqp_url: str) -> None:
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn, conn.channel(confirms=False) as ch:
            queue = (await ch.queue_declare("", exclusive=True)).name
            await ch.tx_select()
            await ch.publish(b"rolled back", routing_key=queue)
            assert (await ch.queue_declare(queue, passive=True)).message_count == 0
            await ch.tx_rollback()
            assert (await ch.queue_declare(queue, passive=True)).message_count == 0

            await ch.publish(b"committed", routing_key=queue)
            await ch.tx_commit()
            assert (await ch.queue_declare(queue, passive=True)).message_count == 1

            # Acks are transactional too.
            msg = await ch.get(queue)
            assert msg is not None and msg.body == b"committed"
            await msg.ack()
            await ch.tx_rollback()  # the ack is undone (the message stays unacked)
            await ch.recover(requeue=True)
            await wait_for_message_count(ch, queue, 1)
            again = await ch.get(queue)
            assert again is not None and again.body == b"committed" and again.redelivered
            await again.ack()
            await ch.tx_commit()
            assert await ch.get(queue) is None


async def test_tx_on_a_confirm_channel_is_refused(amqp_url: str) -> None:
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn, conn.channel(confirms=True) as ch:
            with pytest.raises(amqp.PreconditionFailed) as info:
                await ch.tx_select()
            assert info.value.method_name == "Tx.Select"
