"""Helpers for the event bus tests: fresh names (cleaned up after the test) and reading queues
directly.  The broker URL, the fast recovery policy and :class:`Seen` are in ``tests/support``."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
from support.policies import FAST

from ojs_anyio import amqp, events

#: Bound on any single wait of the event tests (seconds).
WAIT = 20.0


class Names:
    """A fresh exchange and queue tag on the broker at ``url``; ``sub(name)`` registers a
    subscription whose queues are deleted by ``cleanup()``."""

    def __init__(self, url: str) -> None:
        token = uuid.uuid4().hex[:10]
        self.url = url
        self.exchange = f"ojs-test-ev-{token}"
        self.tag = f"t{token}_"
        self.subs: list[str] = []

    def sub(self, name: str) -> str:
        self.subs.append(name)
        return name

    def bus_options(self, **extra: Any) -> dict[str, Any]:
        return {"exchange": self.exchange, "queue_tag": self.tag, "recovery": FAST, **extra}

    def queues(self) -> list[str]:
        out = []
        for name in self.subs:
            q = f"{self.tag}{name}"
            out += [q, f"{q}.dlq", *(f"{q}.wait.{ms}" for ms in events.WAIT_LADDER_MS)]
        return out

    async def cleanup(self) -> None:
        for attempt in range(10):
            try:
                async with amqp.connect(self.url) as conn, conn.channel(confirms=False) as ch:
                    for q in self.queues():
                        await ch.queue_delete(q)
                    await ch.exchange_delete(self.exchange)
                return
            except (amqp.ConnectionLostError, amqp.ConnectionLevelError, amqp.ChannelClosedError):
                if attempt == 9:
                    raise
                await anyio.sleep(0.5)


async def take(url: str, queue: str, count: int, timeout: float = WAIT) -> list[amqp.IncomingMessage]:
    """Consume (and ack) ``count`` messages of ``queue`` with a plain AMQP connection."""
    got: list[amqp.IncomingMessage] = []
    with anyio.fail_after(timeout):
        async with amqp.connect(url) as conn, conn.channel() as ch, ch.consume(queue, prefetch=50) as msgs:
            async for msg in msgs:
                got.append(msg)
                await msg.ack()
                if len(got) >= count:
                    break
    return got


async def dead_letter(names: Names, sub: events.Subscription) -> amqp.IncomingMessage:
    """The one dead letter of ``sub``, taken and acked (the listener saw it settled: it is in
    the DLQ)."""
    async with amqp.connect(names.url) as conn, conn.channel() as ch:
        msg = await ch.get(sub.dead_letter_queue)
        assert msg is not None
        await msg.ack()
        return msg
