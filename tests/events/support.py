"""Helpers for the event bus tests: names, waiting on handlers, reading queues directly."""

from __future__ import annotations

import os
import uuid
from typing import Any
from urllib.parse import quote

import anyio

from ojs_anyio import amqp, events

URL = os.environ.get("OJS_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
#: Reconnect within tens of milliseconds after a cut.
FAST = amqp.RecoveryPolicy(
    initial_delay=0.01, multiplier=2.0, max_delay=0.1, jitter=0.1, consumer_resubscribe_delay=0.05
)
WAIT = 20.0


class Names:
    def __init__(self, url: str = URL) -> None:
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


def vhost_url(vhost: str, base: str = URL) -> str:
    return base.rstrip("/") + "/" + quote(vhost, safe="")


class Seen:
    """Things a handler saw, with a way to wait for them (never a sleep)."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self._changed = anyio.Event()

    def add(self, item: Any) -> None:
        self.items.append(item)
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    async def wait(self, count: int, timeout: float = WAIT) -> list[Any]:
        with anyio.fail_after(timeout):
            while len(self.items) < count:
                await self._changed.wait()
        return self.items


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
