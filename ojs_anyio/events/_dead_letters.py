"""A subscription's dead-letter queue, ``{queue}.dlq``: peek, requeue, purge, prune.

``bus.dead_letters("rec.read")`` (the subscription's name, as given to ``subscribe``).
The scans are :mod:`ojs_anyio._dead_letter_queue`'s, with the job DLQ's guarantees: a
peek removes nothing, a requeue publishes each event with a confirm before its dead copy
is acked (interrupted, it leaves at most a duplicate, never a loss), and a prune drops the
oldest first and never an event whose death time is unknown.

A requeued event goes back to its own subscription's queue only (through the default
exchange), not to every queue its routing key is bound to: other subscriptions already
had it.  It keeps its message id, body, headers and original routing key, and starts
again at attempt 1.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import msgspec

from .. import amqp
from .._dead_letter_queue import DeadLetterQueue, died_at, latest_death
from .._misuse import ArgumentTypeError
from ._wire import H_ATTEMPT, H_DEAD_LETTERED_AT, H_ERROR, H_QUEUE, H_REASON, H_ROUTING_KEY


class _Bus(Protocol):
    """What the dead-letter tools need of an :class:`~ojs_anyio.events.EventBus` (a
    protocol, so this module does not import the bus: the bus imports it)."""

    @property
    def republish(self) -> amqp.RepublishPolicy: ...

    def queue_name(self, name: str) -> str: ...

    async def admin_connection(self) -> amqp.Connection: ...


__all__ = ["DeadEvent", "EventDeadLetters"]

#: Headers of the dead-letter hop, dropped when an event is requeued.  RabbitMQ's own
#: ``x-death`` family goes too: a message that still carries it may be dropped as a cycle.
_HOP_HEADERS = frozenset(
    {
        H_ATTEMPT,
        H_DEAD_LETTERED_AT,
        H_ERROR,
        H_QUEUE,
        H_REASON,
        "x-death",
        "x-first-death-exchange",
        "x-first-death-queue",
        "x-first-death-reason",
        "x-last-death-exchange",
        "x-last-death-queue",
        "x-last-death-reason",
    }
)


class DeadEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One dead event, as :meth:`EventDeadLetters.peek` reads it."""

    message_id: str | None
    #: The routing key it was published with.
    routing_key: str | None
    #: ``max_attempts``, ``invalid_payload`` or ``rejected`` (the subscriber's), or
    #: RabbitMQ's reason when the queue's own dead-lettering took it (``expired``...).
    reason: str | None
    #: The last handler error (``Type: message``), if any.
    error: str | None
    attempt: int | None
    died_at: datetime | None
    content_type: str | None
    body: bytes
    headers: dict[str, Any]
    #: Why the codec could not read the message whole (then it is never requeued).
    malformed: str | None = None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _event_died_at(props: amqp.BasicProperties, now: datetime) -> datetime | None:
    return died_at(props, H_DEAD_LETTERED_AT, datetime.fromisoformat, now=now)


def _original_key(msg: amqp.IncomingMessage) -> str | None:
    headers = msg.properties.headers or {}
    key = _text(headers.get(H_ROUTING_KEY))
    if key is not None:
        return key
    death = latest_death(headers)
    keys = death.get("routing-keys") if death is not None else None
    if isinstance(keys, list) and keys and isinstance(keys[0], str):
        return keys[0]
    return msg.routing_key


def _dead_event(msg: amqp.IncomingMessage) -> DeadEvent:
    headers = dict(msg.properties.headers or {})
    reason = _text(headers.get(H_REASON))
    if reason is None:
        death = latest_death(headers)
        reason = _text(death.get("reason")) if death is not None else None
    attempt = headers.get(H_ATTEMPT)
    return DeadEvent(
        message_id=amqp.property_text(msg.properties.message_id),
        routing_key=_original_key(msg),
        reason=reason,
        error=_text(headers.get(H_ERROR)),
        attempt=attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else None,
        died_at=_event_died_at(msg.properties, datetime.now(UTC)),
        content_type=amqp.property_text(msg.properties.content_type),
        body=msg.body,
        headers=headers,
        malformed=msg.malformed,
    )


class EventDeadLetters:
    """The dead-letter queue of subscription ``name`` of ``bus``: :meth:`EventBus.dead_letters`."""

    def __init__(self, bus: _Bus, name: str) -> None:
        self.bus = bus
        #: The subscription's queue, where a requeued event goes.
        self.queue = bus.queue_name(name)
        #: The dead-letter queue.
        self.name = f"{self.queue}.dlq"

    async def _dlq(self) -> DeadLetterQueue:
        return DeadLetterQueue(await self.bus.admin_connection(), self.name)

    async def count(self) -> int:
        """How many dead events wait (``amqp.ChannelClosedError`` 404 if the queue does not exist)."""
        return await (await self._dlq()).count()

    async def peek(self, limit: int = 100) -> list[DeadEvent]:
        """Up to ``limit`` dead events, oldest first, left in the queue."""
        return await (await self._dlq()).peek(limit, _dead_event)

    async def requeue(
        self,
        limit: int | None = None,
        *,
        ids: Collection[str] | None = None,
        on_moved: Callable[[int], object] | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> int:
        """Move dead events back to the subscription's queue (only those whose message id is
        in ``ids``, when given; at most ``limit``), each confirmed before its dead copy is
        acked.  Malformed ones stay.  ``on_moved(n)`` reports progress, ``stop()`` ends
        early.  Returns how many moved."""
        if isinstance(ids, str):
            raise ArgumentTypeError(
                "ids must be a collection of message ids, not one str: write ids=[message_id]"
            )
        return await (await self._dlq()).move(
            self._republish,
            key=lambda msg: amqp.property_text(msg.properties.message_id) or "",
            limit=limit,
            ids=ids,
            on_moved=on_moved,
            stop=stop,
        )

    async def _republish(self, ch: amqp.Channel, msg: amqp.IncomingMessage) -> None:
        headers = {k: v for k, v in (msg.properties.headers or {}).items() if k not in _HOP_HEADERS}
        key = _original_key(msg)
        if key is not None:
            headers[H_ROUTING_KEY] = key
        props = msgspec.structs.replace(msg.properties, headers=headers, expiration=None, user_id=None)
        published = await amqp.republish(
            ch, msg.body, exchange="", routing_key=self.queue, properties=props, mandatory=True,
            policy=self.bus.republish,
        )  # fmt: skip
        if not published.confirmed:
            assert published.error is not None
            raise published.error

    async def purge(self) -> int:
        """Delete every dead event; returns how many."""
        return await (await self._dlq()).purge()

    async def prune(
        self,
        older_than: timedelta | float | None = None,
        *,
        max_events: int | None = None,
        limit: int = 100_000,
        on_dropped: Callable[[int], object] | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> int:
        """Drop dead events that died more than ``older_than`` ago (a ``timedelta`` or
        seconds), then the oldest beyond ``max_events``; at most ``limit``.  An event whose
        death time is unknown is never dropped for its age.  Returns how many."""
        cutoff = None
        if older_than is not None:
            if isinstance(older_than, bool) or not isinstance(older_than, (int, float, timedelta)):
                raise ArgumentTypeError(
                    f"older_than must be seconds or a timedelta, not {type(older_than).__name__}"
                )
            age = older_than if isinstance(older_than, timedelta) else timedelta(seconds=older_than)
            if age < timedelta(0):
                raise amqp.UsageError(f"older_than must be zero or more, got {older_than!r}")
            try:
                cutoff = datetime.now(UTC) - age
            except OverflowError:  # before year 1: nothing is that old
                cutoff = None
        return await (await self._dlq()).prune(
            cutoff=cutoff,
            max_count=max_events,
            limit=limit,
            died=_event_died_at,
            on_dropped=on_dropped,
            stop=stop,
        )
