"""No single message ends a subscription (issue 23, point 3).

A poison event (a bad ``x-event-attempt``, JSON nested 100,000 deep, a validated
``user_id`` of another client) goes in front of good events.  The poison is dead-lettered
with its reason (or handled, where the rule says it is fine), every good event behind it
is handled, and the subscription is still consuming.  RabbitMQ and memory://, asyncio and
Trio.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from support.waits import Seen

from ojs_anyio import amqp, events

from .bus_support import WAIT, Names

pytestmark = pytest.mark.anyio

DEEP = b'{"n": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
#: (case, body, headers, reason words if dead-lettered, else None: handled).
CASES: list[tuple[str, bytes, dict[str, Any], str | None]] = [
    ("attempt not a number", b'{"n": 0}', {"x-event-attempt": "soon"}, "x-event-attempt"),
    ("attempt void", b'{"n": 0}', {"x-event-attempt": None}, None),
    ("attempt 0 means 1", b'{"n": 0}', {"x-event-attempt": 0}, None),
    ("attempt negative", b'{"n": 0}', {"x-event-attempt": -3}, "x-event-attempt"),
    ("attempt huge", b'{"n": 0}', {"x-event-attempt": 2**40}, "x-event-attempt"),
    ("JSON nested 100,000 deep", DEEP, {}, "RecursionError"),
    ("not UTF-8", b'{"n": "\xff"}', {}, "invalid_payload"),
]


@pytest.mark.parametrize("case", [c[0] for c in CASES])
async def test_a_poison_event_in_front_of_good_ones(names: Names, case: str) -> None:
    [(_, body, headers, dead)] = [c for c in CASES if c[0] == case]
    handled = Seen()
    dead_letters: list[amqp.IncomingMessage] = []

    async def on_event(payload: dict[str, Any]) -> None:
        handled.add(payload["n"] if isinstance(payload["n"], int) else -1)

    def on_outcome(outcome: str, msg: amqp.IncomingMessage) -> None:
        if outcome == "dead_lettered":
            dead_letters.append(msg)

    async with (
        events.connect(names.url, **names.bus_options()) as bus,
        bus.subscribe(names.sub("orders"), on_event) as sub,
    ):
        sub.add_listener(on_outcome)
        async with amqp.connect(names.url) as conn, conn.channel() as ch:
            props = amqp.BasicProperties(
                content_type="application/json", headers=headers, message_id="poison"
            )
            await ch.publish(body, exchange=names.exchange, routing_key="orders", properties=props)
        for n in range(1, 6):
            await bus.publish("orders", {"n": n})
        expected = 5 if dead else 6
        await handled.wait(expected)
        await bus.publish("orders", {"n": 99})  # still consuming
        await handled.wait(expected + 1)
        async with amqp.connect(names.url) as conn, conn.channel() as ch:
            dlq = await ch.queue_declare(sub.dead_letter_queue, passive=True)
            if dead is not None:
                with anyio.fail_after(WAIT):
                    msg = None
                    while msg is None:
                        msg = await ch.get(sub.dead_letter_queue)
                        if msg is None:
                            await anyio.sleep(0.05)  # polling the broker: no event to wait on
                reason = " ".join(str(v) for v in (msg.properties.headers or {}).values())
                await msg.ack()
    assert sorted(n for n in handled.items if n != 99) == ([1, 2, 3, 4, 5] if dead else [0, 1, 2, 3, 4, 5])
    if dead is None:
        assert dlq.message_count == 0 and not dead_letters
    else:
        assert msg.properties.message_id == "poison" and dead in reason, reason


async def test_a_redelivery_drops_another_clients_user_id(names: Names, second_user_url: str) -> None:
    """A validated ``user_id`` names the *publishing* user: a copy published by the bus
    with it would be refused (406) and close the subscriber's channel."""
    seen = Seen()

    async def flaky(payload: dict[str, Any], ctx: events.EventContext) -> None:
        seen.add(ctx.attempt)
        if ctx.attempt == 1:
            raise RuntimeError("once")

    async with (
        events.connect(names.url, **names.bus_options()) as bus,
        bus.subscribe(names.sub("orders"), flaky),
    ):
        async with amqp.connect(second_user_url) as conn, conn.channel() as ch:
            user = amqp.parse_url(second_user_url).username
            props = amqp.BasicProperties(content_type="application/json", user_id=user)
            await ch.publish(json.dumps({"n": 1}).encode(), exchange=names.exchange,
                                 routing_key="orders", properties=props)  # fmt: skip
        assert await seen.wait(2) == [1, 2]
