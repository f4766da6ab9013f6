"""The structured-concurrency AMQP 0-9-1 client of ojs-anyio (asyncio and Trio, via AnyIO).

::

    from ojs_anyio import amqp

    async with amqp.connect("amqp://guest:guest@localhost/") as conn:
        async with conn.channel() as ch:
            await ch.queue_declare("hello")
            await ch.publish(b"hi", routing_key="hello")          # returns once confirmed
            async with ch.consume("hello", prefetch=10) as messages:
                async for msg in messages:
                    await msg.ack()
                    break

This layer knows AMQP and nothing about jobs.
"""

from ojs_codec import (
    NESTED_TOO_DEEP,
    AccessRefused,
    AMQPError,
    AuthenticationError,
    BasicProperties,
    ChannelLevelError,
    ConnectionForced,
    ConnectionLevelError,
    Int32,
    NotFound,
    PreconditionFailed,
    ProtocolError,
    ResourceLocked,
    UsageError,
)

from ._channel import (
    Channel,
    Consumer,
    IncomingMessage,
    PublishHandle,
    PublishWindow,
    QueueInfo,
    property_text,
)
from ._connection import Connection, RecoveryPolicy, connect
from ._errors import (
    DELIVERY_LOST_ERRORS,
    BlockedTimeoutError,
    ChannelClosedError,
    ConnectionClosedError,
    ConnectionLostError,
    ConsumerCancelledError,
    DeliveryAlreadySettledError,
    OperationTimeoutError,
    PublishError,
    PublishNackedError,
    PublishOutcomeUnknownError,
    PublishTimeoutError,
    RecoveryFailedError,
    StaleDeliveryError,
    TransactionLostError,
    UnroutableError,
)
from ._events import (
    ConnectionBlockedEvent,
    ConnectionLost,
    ConnectionRecovered,
    ConnectionUnblockedEvent,
    ConsumerRecovered,
    Reconnecting,
    RecoveryEvent,
    TopologyRecoveryFailed,
)
from ._metrics import timing_enabled as sdk_meter_provider_installed
from ._policy import DEFAULT_CONFIRM_TIMEOUT, DEFAULT_PUBLISH_TIMEOUT
from ._republish import DEFAULT_REPUBLISH_POLICY, Republished, RepublishPolicy, copy_properties, republish
from ._url import AMQPURL, InvalidURL, parse_url

__all__ = [
    "sdk_meter_provider_installed",
    "AMQPError",
    "AMQPURL",
    "AccessRefused",
    "AuthenticationError",
    "BasicProperties",
    "BlockedTimeoutError",
    "Channel",
    "ChannelClosedError",
    "ChannelLevelError",
    "Connection",
    "ConnectionBlockedEvent",
    "ConnectionClosedError",
    "ConnectionForced",
    "ConnectionLevelError",
    "ConnectionLost",
    "ConnectionLostError",
    "ConnectionRecovered",
    "ConnectionUnblockedEvent",
    "Consumer",
    "ConsumerCancelledError",
    "ConsumerRecovered",
    "DELIVERY_LOST_ERRORS",
    "DEFAULT_CONFIRM_TIMEOUT",
    "DEFAULT_PUBLISH_TIMEOUT",
    "DeliveryAlreadySettledError",
    "IncomingMessage",
    "NESTED_TOO_DEEP",
    "Int32",
    "InvalidURL",
    "NotFound",
    "OperationTimeoutError",
    "PreconditionFailed",
    "ProtocolError",
    "PublishError",
    "PublishHandle",
    "PublishNackedError",
    "PublishOutcomeUnknownError",
    "PublishTimeoutError",
    "PublishWindow",
    "QueueInfo",
    "Reconnecting",
    "RecoveryEvent",
    "RecoveryFailedError",
    "RecoveryPolicy",
    "RepublishPolicy",
    "Republished",
    "ResourceLocked",
    "StaleDeliveryError",
    "TopologyRecoveryFailed",
    "TransactionLostError",
    "UnroutableError",
    "UsageError",
    "connect",
    "copy_properties",
    "DEFAULT_REPUBLISH_POLICY",
    "parse_url",
    "property_text",
    "republish",
]
