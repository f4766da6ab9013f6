"""Bounded waits and counts, shared by every test folder (``from support.waits import wait_until``).

Polling state that has no event to wait on (:func:`wait_until`), a queue's message count
(:func:`message_count`, :func:`wait_message_count`), whether a queue exists
(:func:`queue_exists`), and :class:`Seen`: things a handler saw, with a way to wait for them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

from ojs_anyio import amqp

__all__ = [
    "Seen",
    "message_count",
    "queue_exists",
    "wait_message_count",
    "wait_until",
]


async def wait_until(
    predicate: Callable[[], bool], timeout: float = 5.0, *, what: str = "condition", interval: float = 0.01
) -> None:
    """Poll ``predicate`` until it is true, failing after ``timeout`` seconds.

    Only for state outside our control (a proxy, the broker, a worker's private flag):
    where an event exists, wait on the event instead."""
    with anyio.fail_after(timeout):
        while not predicate():  # noqa: ASYNC110 (external state: no event to wait on)
            await anyio.sleep(interval)


async def message_count(target: str | amqp.Connection | amqp.Channel, queue: str) -> int:
    """Ready messages in ``queue`` (passive Queue.Declare) on a URL's own connection, a
    fresh channel of a connection, or a channel."""
    if isinstance(target, amqp.Channel):
        return (await target.queue_declare(queue, passive=True)).message_count
    if isinstance(target, amqp.Connection):
        async with target.channel(confirms=False) as ch:
            return (await ch.queue_declare(queue, passive=True)).message_count
    async with amqp.connect(target) as conn, conn.channel(confirms=False) as ch:
        return (await ch.queue_declare(queue, passive=True)).message_count


async def queue_exists(url: str, queue: str) -> bool:
    """Ask the broker directly (own connection) whether ``queue`` exists."""
    async with amqp.connect(url) as conn, conn.channel(confirms=False) as ch:
        try:
            await ch.queue_declare(queue, passive=True)
        except amqp.NotFound:
            return False
    return True


async def wait_message_count(
    target: str | amqp.Connection | amqp.Channel,
    queue: str,
    count: int,
    timeout: float = 5.0,
    *,
    at_least: bool = False,
    interval: float = 0.02,
) -> None:
    """Wait until ``queue`` holds exactly ``count`` ready messages (or ``at_least``).

    Settling and dead-lettering are asynchronous inside RabbitMQ (a requeue can overtake
    a later passive declare; a rejected message reaches its DLQ later), and no event
    tells a client when they are done, so the count is polled.  ``target`` as in
    :func:`message_count`; a connection gets one channel for the whole wait."""
    with anyio.fail_after(timeout):
        if isinstance(target, amqp.Connection):
            async with target.channel(confirms=False) as ch:
                await _poll_count(ch, queue, count, at_least, interval)
        else:
            await _poll_count(target, queue, count, at_least, interval)


async def _poll_count(
    target: str | amqp.Channel, queue: str, count: int, at_least: bool, interval: float
) -> None:
    while True:
        n = await message_count(target, queue)
        if n == count or (at_least and n >= count):
            return
        await anyio.sleep(interval)  # polling broker state: there is no event for it


class Seen:
    """Things a handler saw, with a way to wait for them (never a sleep)."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self._changed = anyio.Event()

    def add(self, item: Any) -> None:
        self.items.append(item)
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    async def wait(self, count: int, timeout: float = 20.0) -> list[Any]:
        """Wait until ``count`` items were seen; return all of them."""
        with anyio.fail_after(timeout):
            while len(self.items) < count:
                await self._changed.wait()
        return self.items
