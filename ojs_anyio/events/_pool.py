"""The event bus's connections, and the consumers of a subscription.

:class:`ConnectionPool`: every AMQP connection of a bus is held by one task of the bus's
task group (inside ``amqp.connect(...)``, so none outlives the bus), opened on first use:
the publisher's, and as many subscriber connections as the per-connection subscription
limit requires.

:class:`ConsumerStopper` and :func:`stop_all`: a subscription's consumers, stopped early
(a graceful stop) or by the exit stack.  A subscription's N consumers x M pull tasks and
its graceful stop are a :class:`ojs_anyio._consume_pool.ConsumePool`, the one the job
worker uses too.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import anyio
import anyio.abc

from .. import amqp

__all__ = ["ConnectionPool", "ConsumerStopper", "Slot", "stop_all"]


class Slot:
    """One AMQP connection of the bus and the subscriptions (consumers) it carries."""

    __slots__ = ("conn", "stop", "subscriptions")

    def __init__(self, conn: amqp.Connection) -> None:
        self.conn = conn
        self.subscriptions = 0
        self.stop = anyio.Event()


class ConnectionPool:
    """The bus's connections: each held by a task of ``start()``'s task group until
    :meth:`close` (or the group's end)."""

    def __init__(
        self,
        url: str,
        *,
        recovery: amqp.RecoveryPolicy,
        connection_name: str,
        max_subscriptions_per_connection: int,
        connect_options: dict[str, Any],
    ) -> None:
        self.url = url
        self.recovery = recovery
        self.connection_name = connection_name
        self.max_subscriptions_per_connection = max_subscriptions_per_connection
        self._connect_options = connect_options
        self._tg: anyio.abc.TaskGroup | None = None
        self._lock = anyio.Lock()
        self.subscriber_slots: list[Slot] = []
        self.closed = False

    def start(self, tg: anyio.abc.TaskGroup) -> None:
        """Where the connections' tasks run (the bus's task group)."""
        self._tg = tg

    @property
    def usable(self) -> bool:
        """Started and not closed."""
        return self._tg is not None and not self.closed

    async def open(self, name: str, **options: Any) -> Slot:
        """A new connection named ``name`` (``options`` over the bus's connect options)."""
        if self._tg is None:
            raise amqp.UsageError("the event bus is not started: use ojs_anyio.events.connect()")
        slot: Slot = await self._tg.start(self._hold, name, options)
        return slot

    async def _hold(
        self, name: str, options: dict[str, Any], *, task_status: anyio.abc.TaskStatus[Slot]
    ) -> None:
        options = {**self._connect_options, **options}
        async with amqp.connect(self.url, recovery=self.recovery, name=name, **options) as conn:
            slot = Slot(conn)
            task_status.started(slot)
            await slot.stop.wait()

    async def acquire(self) -> Slot:
        """A subscriber connection with room for one more subscription (opens one if none)."""
        async with self._lock:
            for slot in self.subscriber_slots:
                if slot.subscriptions < self.max_subscriptions_per_connection:
                    slot.subscriptions += 1
                    return slot
            if self.closed:
                raise amqp.UsageError("the event bus is closed")
            n = len(self.subscriber_slots) + 1
            slot = await self.open(f"{self.connection_name}-sub-{n}")
            slot.subscriptions = 1
            self.subscriber_slots.append(slot)
            return slot

    @staticmethod
    def release(slot: Slot) -> None:
        slot.subscriptions -= 1

    def close(self, *others: Slot | None) -> None:
        """Let every subscriber connection (and ``others``) close."""
        self.closed = True
        for slot in (*others, *self.subscriber_slots):
            if slot is not None:
                slot.stop.set()


class ConsumerStopper:
    """A ``ch.consume(...)`` context, entered at start and exited once: early, to stop a
    subscription gracefully, or by the exit stack."""

    __slots__ = ("_cm", "_stopped")

    def __init__(self, cm: AbstractAsyncContextManager[amqp.Consumer]) -> None:
        self._cm = cm
        self._stopped = False

    async def start(self) -> amqp.Consumer:
        return await self._cm.__aenter__()

    async def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            await self._cm.__aexit__(None, None, None)


async def stop_all(stoppers: Sequence[ConsumerStopper]) -> None:
    """Stop a subscription's consumers (its pool's ``stop_fetching``): what they buffered
    goes back to the queue."""
    for stopper in stoppers:
        await stopper.stop()
