"""Helpers for the fault-injection tests: an event recorder, an observer channel, and the
shared waits and fast recovery policy of ``tests/support`` (re-exported)."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import anyio
from support.policies import FAST
from support.waits import message_count, queue_exists
from support.waits import wait_until as _wait_until

from ojs_anyio import amqp

#: Resilience waits span reconnects: 10 s unless the caller says otherwise.
wait_until = functools.partial(_wait_until, timeout=10.0)
__all__ = ["FAST", "message_count", "queue_exists"]  # re-exported from tests/support

E = TypeVar("E", bound=amqp.RecoveryEvent)


class EventLog:
    """Records a connection's events (with the time each arrived) and waits for them."""

    def __init__(self, conn: amqp.Connection) -> None:
        self.events: list[tuple[float, amqp.RecoveryEvent]] = []
        self._changed = anyio.Event()
        conn.add_listener(self._on_event)

    def _on_event(self, event: amqp.RecoveryEvent) -> None:
        self.events.append((anyio.current_time(), event))
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    def of(self, kind: type[E]) -> list[E]:
        return [ev for _, ev in self.events if isinstance(ev, kind)]

    def times_of(self, kind: type[amqp.RecoveryEvent]) -> list[float]:
        return [t for t, ev in self.events if isinstance(ev, kind)]

    async def wait_for(
        self,
        kind: type[E],
        count: int = 1,
        *,
        timeout: float = 10.0,
        where: Callable[[E], bool] | None = None,
    ) -> E:
        """Wait until ``count`` events of ``kind`` (matching ``where``) arrived; return the last."""
        with anyio.fail_after(timeout):
            while True:
                found = [ev for ev in self.of(kind) if where is None or where(ev)]
                if len(found) >= count:
                    return found[count - 1]
                await self._changed.wait()

    async def wait_recovered(self, count: int = 1, *, timeout: float = 10.0) -> None:
        await self.wait_for(amqp.ConnectionRecovered, count, timeout=timeout)


async def wait_queue_exists(url: str, queue: str, exists: bool, *, timeout: float = 10.0) -> None:
    with anyio.fail_after(timeout):
        while await queue_exists(url, queue) != exists:  # noqa: ASYNC110 (broker state)
            await anyio.sleep(0.05)


@asynccontextmanager
async def observer(url: str) -> AsyncIterator[amqp.Channel]:
    """A channel on a separate, direct connection: the "operator" acting on the broker."""
    async with amqp.connect(url) as conn, conn.channel() as ch:
        yield ch
