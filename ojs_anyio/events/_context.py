"""What an event handler (and an ``around_handler`` middleware) gets besides the payload."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .. import amqp

__all__ = ["EventContext"]


class EventContext:
    """What a handler that takes a second argument gets besides the payload."""

    __slots__ = ("attempt", "body", "message", "payload", "queue", "routing_key")

    def __init__(
        self, message: amqp.IncomingMessage, queue: str, routing_key: str, attempt: int, payload: Any = None
    ) -> None:
        #: The AMQP delivery (properties, headers, ``redelivered``).
        self.message = message
        self.body = message.body
        self.queue = queue
        #: The routing key the event was published with (also after a redelivery).
        self.routing_key = routing_key
        #: 1 for the first delivery, n+1 after n redeliveries by the bus.
        self.attempt = attempt
        #: The payload the handler is called with (decoded and converted to its type).
        self.payload = payload

    @property
    def message_id(self) -> str | None:
        return self.message.properties.message_id

    @property
    def timestamp(self) -> datetime | None:
        return self.message.properties.timestamp

    @property
    def headers(self) -> dict[str, Any]:
        return self.message.properties.headers or {}

    def __repr__(self) -> str:
        return (
            f"<EventContext queue={self.queue!r} routing_key={self.routing_key!r} "
            f"message_id={self.message_id!r} attempt={self.attempt}>"
        )
