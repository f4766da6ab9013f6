"""A typed, structured-concurrency event bus over RabbitMQ (asyncio and Trio).

::

    from ojs_anyio import events

    class RecordRead(msgspec.Struct):
        id: str

    async def on_read(event: RecordRead) -> None: ...

    async with events.connect("amqp://guest:guest@localhost/prod", exchange="beds.events",
                              queue_tag="prod_") as bus:
        async with bus.subscribe("rec.read", on_read, concurrency=4):  # declares prod_rec.read
            await bus.publish("rec.read", RecordRead(id="42"))         # confirmed, persistent

Topic exchange, per-environment queue tags, competing consumers, redelivery with backoff
through a bounded ladder of TTL wait queues, dead-letter queues with the reason, a
publisher channel pool and a subscriber connection pool with a per-connection
subscription limit, all recovering after a connection loss; middleware around publishing
and handling (:class:`Middleware`).  See ``docs/events.md``.
"""

from .._queue_options import QueueOptions
from ._bus import (
    DEFAULT_URL,
    DEVELOPMENT_URL,
    RESERVED_PREFIXES,
    EventBus,
    EventHandle,
    EventWindow,
    QueueFullError,
    connect,
)
from ._catalog import ASYNCAPI_VERSION, Catalog
from ._context import EventContext
from ._dead_letters import DeadEvent, EventDeadLetters
from ._middleware import Middleware, OutgoingEvent
from ._redelivery import MAX_WAIT_QUEUES, WAIT_LADDER_MS, RedeliveryPolicy, ladder_ms
from ._subscriber import DeadLetter, Handler, HandlerTimeoutError, Subscription
from ._wire import (
    CONTENT_BYTES,
    CONTENT_JSON,
    H_ATTEMPT,
    H_DEAD_LETTERED_AT,
    H_ERROR,
    H_QUEUE,
    H_REASON,
    H_ROUTING_KEY,
    new_message_id,
)

__all__ = [
    "ASYNCAPI_VERSION",
    "CONTENT_BYTES",
    "CONTENT_JSON",
    "Catalog",
    "DEFAULT_URL",
    "DEVELOPMENT_URL",
    "DeadEvent",
    "DeadLetter",
    "EventBus",
    "EventContext",
    "EventDeadLetters",
    "EventHandle",
    "EventWindow",
    "H_ATTEMPT",
    "H_DEAD_LETTERED_AT",
    "H_ERROR",
    "H_QUEUE",
    "H_REASON",
    "H_ROUTING_KEY",
    "Handler",
    "HandlerTimeoutError",
    "MAX_WAIT_QUEUES",
    "Middleware",
    "OutgoingEvent",
    "QueueFullError",
    "QueueOptions",
    "RESERVED_PREFIXES",
    "RedeliveryPolicy",
    "Subscription",
    "WAIT_LADDER_MS",
    "connect",
    "ladder_ms",
    "new_message_id",
]
