"""Events with a malformed content header (``IncomingMessage.malformed``) in front of good
ones, against RabbitMQ, on asyncio and Trio: the subscriber rejects each into its DLQ
through the queue's dead-letter arguments (it cannot publish them again with their
headers), logs the reason, and handles every good event behind them on a connection that
never reconnects.

The hostile events are published by pika (tests/harness/hostile.py).  Before the codec
decoded delivered headers leniently, the first of them closed the subscriber's
connection, and it came first again after every reconnect.
"""

from __future__ import annotations

import logging

import anyio
import pika
import pytest
from harness.hostile import HOSTILE, publish, with_frame_max
from support.waits import Seen

from ojs_anyio import events

from .bus_support import WAIT, Names, take

pytestmark = pytest.mark.anyio


@pytest.mark.rabbitmq_only("pika publishes the hostile frames over TCP: memory:// has no socket")
async def test_the_subscriber_dead_letters_malformed_events_and_handles_the_rest(
    names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    seen = Seen()
    outcomes: list[tuple[str, str | None]] = []

    async def handler(event: dict[str, int]) -> None:
        seen.add(event["n"])

    name = names.sub("hostile.read")
    poison = [
        (names.exchange, name, b'{"n": -1}', h.pika_properties(content_type="application/json"))
        for h in HOSTILE
    ]
    good = [
        (names.exchange, name, b'{"n": %d}' % i, pika.BasicProperties(content_type="application/json"))
        for i in range(10)
    ]
    with caplog.at_level(logging.ERROR, logger="ojs_anyio.events"):
        # The subscriber's frame_max (4096) is below the large-header case's header.
        async with (
            events.connect(with_frame_max(names.url), **names.bus_options()) as bus,
            bus.subscribe(name, handler, concurrency=2) as sub,
        ):
            sub.add_listener(lambda outcome, msg: outcomes.append((outcome, msg.malformed)))
            with anyio.fail_after(WAIT):
                await anyio.to_thread.run_sync(publish, names.url, [*poison, *good])
            assert sorted(await seen.wait(10)) == list(range(10))
            await bus.publish(name, {"n": 10})  # still consuming
            assert sorted(await seen.wait(11)) == list(range(11))
            dead = await take(names.url, sub.dead_letter_queue, len(HOSTILE))
            assert sub.dead_lettered == len(HOSTILE) and sub.handled == 11
            assert all(conn.reconnections == 0 for conn in sub.connections)
    # In the DLQ as they were, moved there by the broker (x-death), in order.
    assert [m.body for m in dead] == [b'{"n": -1}'] * len(HOSTILE)
    for case, msg in zip(HOSTILE, dead, strict=True):
        death = (msg.properties.headers or {}).get("x-death")
        assert isinstance(death, list) and death[0]["reason"] == "rejected", case.name
        assert death[0]["queue"] == sub.queue
    dead_outcomes = [reason for outcome, reason in outcomes if outcome == "dead_lettered"]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    for case in HOSTILE:
        assert len([r for r in dead_outcomes if r is not None and case.reason in r]) == 1, case.name
        assert any(f"rejected into {sub.dead_letter_queue}" in e and case.reason in e for e in errors), (
            case.name
        )
