"""Events: what :meth:`ojs_codec.AMQPConnection.receive_data` returns.

Events are small, slotted, keyword-only values.  Most are frozen dataclasses; the
three content-carrying events (:class:`Delivery`, :class:`GetOk`, :class:`Returned`)
and :class:`Confirmed` are plain slotted classes because they are built once per
message on the hot path.

The content-carrying events have ``malformed``: ``None``, or why the message's content
header is valid AMQP but outside the codec's strict rules (decoded leniently, see
:func:`~ojs_codec.decode_content_header_lenient`; or larger than ``frame_max``, so that
it cannot be published again as it is).  In a malformed message a short-string property
or a header key may be ``bytes``, a header timestamp an ``int``, and a table nested too
deep is :data:`~ojs_codec.NESTED_TOO_DEEP`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._errors import ChannelLevelError, ConnectionLevelError
from ._properties import BasicProperties

__all__ = [
    "ChannelCloseOk",
    "ChannelClosed",
    "ChannelFlow",
    "ChannelOpened",
    "Confirmed",
    "ConnectionBlocked",
    "ConnectionCloseOk",
    "ConnectionClosed",
    "ConnectionOpened",
    "ConnectionUnblocked",
    "ConsumerCancelled",
    "Delivery",
    "Event",
    "GetOk",
    "MethodReply",
    "Returned",
]


class Event:
    """Base class of every event."""

    __slots__ = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionOpened(Event):
    """The handshake completed (Connection.OpenOk received)."""

    channel_max: int
    frame_max: int
    heartbeat: int
    server_properties: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionClosed(Event):
    """The broker closed the connection.  Close-Ok was queued automatically."""

    error: ConnectionLevelError


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionCloseOk(Event):
    """Our Connection.Close was acknowledged; the socket may now be closed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionBlocked(Event):
    """The broker blocked publishing (resource alarm); ``reason`` says why."""

    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionUnblocked(Event):
    """The broker lifted its publishing block."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ChannelOpened(Event):
    channel_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ChannelClosed(Event):
    """The broker closed a channel.  Close-Ok was queued; the id is free again."""

    channel_id: int
    error: ChannelLevelError


@dataclass(frozen=True, slots=True, kw_only=True)
class ChannelCloseOk(Event):
    """Our Channel.Close was acknowledged; the id is free again."""

    channel_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ChannelFlow(Event):
    """The broker asked us to pause (``active=False``) or resume publishing."""

    channel_id: int
    active: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class MethodReply(Event):
    """The reply to a synchronous method (Queue.DeclareOk, Basic.QosOk, Basic.GetEmpty…).

    ``method`` is the pamqp command instance.
    """

    channel_id: int
    method: Any


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerCancelled(Event):
    """The broker cancelled a consumer (its queue was deleted, or it failed over)."""

    channel_id: int
    consumer_tag: str


class Delivery(Event):
    """A message pushed to a consumer (Basic.Deliver + content)."""

    __slots__ = (
        "body",
        "channel_id",
        "consumer_tag",
        "delivery_tag",
        "exchange",
        "malformed",
        "properties",
        "redelivered",
        "routing_key",
    )

    def __init__(
        self,
        channel_id: int,
        consumer_tag: str,
        delivery_tag: int,
        redelivered: bool,
        exchange: str,
        routing_key: str,
        properties: BasicProperties,
        body: bytes,
        malformed: str | None = None,
    ) -> None:
        self.channel_id = channel_id
        self.consumer_tag = consumer_tag
        self.delivery_tag = delivery_tag
        self.redelivered = redelivered
        self.exchange = exchange
        self.routing_key = routing_key
        self.properties = properties
        self.body = body
        #: Why the content header is malformed (see the module docstring), or ``None``.
        self.malformed = malformed

    def __repr__(self) -> str:
        return (
            f"Delivery(channel_id={self.channel_id}, consumer_tag={self.consumer_tag!r}, "
            f"delivery_tag={self.delivery_tag}, redelivered={self.redelivered}, "
            f"exchange={self.exchange!r}, routing_key={self.routing_key!r}, body=<{len(self.body)} bytes>)"
        )


class GetOk(Event):
    """The reply to Basic.Get when a message was available."""

    __slots__ = (
        "body",
        "channel_id",
        "delivery_tag",
        "exchange",
        "malformed",
        "message_count",
        "properties",
        "redelivered",
        "routing_key",
    )

    def __init__(
        self,
        channel_id: int,
        delivery_tag: int,
        redelivered: bool,
        exchange: str,
        routing_key: str,
        message_count: int,
        properties: BasicProperties,
        body: bytes,
        malformed: str | None = None,
    ) -> None:
        self.channel_id = channel_id
        self.delivery_tag = delivery_tag
        self.redelivered = redelivered
        self.exchange = exchange
        self.routing_key = routing_key
        self.message_count = message_count
        self.properties = properties
        self.body = body
        #: Why the content header is malformed (see the module docstring), or ``None``.
        self.malformed = malformed


class Returned(Event):
    """A mandatory message the broker could not route (Basic.Return + content).

    On a channel in confirm mode it is not emitted on its own: it is attached to the
    :class:`Confirmed` event of the publish it belongs to (``publish_tag``).
    """

    __slots__ = (
        "body",
        "channel_id",
        "exchange",
        "malformed",
        "properties",
        "publish_tag",
        "reply_code",
        "reply_text",
        "routing_key",
    )

    def __init__(
        self,
        channel_id: int,
        reply_code: int,
        reply_text: str,
        exchange: str,
        routing_key: str,
        properties: BasicProperties,
        body: bytes,
        publish_tag: int = 0,
        *,
        malformed: str | None = None,
    ) -> None:
        self.channel_id = channel_id
        self.reply_code = reply_code
        self.reply_text = reply_text
        self.exchange = exchange
        self.routing_key = routing_key
        self.properties = properties
        self.body = body
        self.publish_tag = publish_tag
        #: Why the content header is malformed (see the module docstring), or ``None``.
        self.malformed = malformed

    def __repr__(self) -> str:
        return (
            f"Returned(channel_id={self.channel_id}, reply_code={self.reply_code}, "
            f"reply_text={self.reply_text!r}, exchange={self.exchange!r}, "
            f"routing_key={self.routing_key!r}, publish_tag={self.publish_tag})"
        )


class Confirmed(Event):
    """Publisher confirms for one or more publishes on a channel in confirm mode.

    ``tags`` are exactly the publish sequence numbers this Basic.Ack or Basic.Nack
    covers, in ascending order (a ``multiple=True`` frame is expanded against the
    publishes still unconfirmed).  ``returned`` maps a tag to the Basic.Return that
    the broker sent for that publish before confirming it.
    """

    __slots__ = ("ack", "channel_id", "returned", "tags")

    def __init__(
        self, channel_id: int, tags: list[int], ack: bool, returned: dict[int, Returned] | None
    ) -> None:
        self.channel_id = channel_id
        self.tags = tags
        self.ack = ack
        self.returned = returned

    def __repr__(self) -> str:
        return f"Confirmed(channel_id={self.channel_id}, tags={self.tags}, ack={self.ack})"
