"""Errors raised by the AnyIO AMQP runtime, grouped by meaning.

* The transport and lifecycle: :class:`ConnectionLostError` (and
  :class:`RecoveryFailedError`, :class:`TransactionLostError`),
  :class:`ConnectionClosedError`, :class:`ChannelClosedError`.
* Waiting too long: :class:`OperationTimeoutError` (and, for publishes,
  :class:`PublishTimeoutError` and :class:`BlockedTimeoutError`).
* A publish's outcome: :class:`PublishError` and its subclasses.
* A consumer ending: :class:`ConsumerCancelledError`.
* Local misuse: :class:`~ojs_codec.UsageError` (also a ``ValueError``), such as
  :class:`DeliveryAlreadySettledError` and :class:`StaleDeliveryError`.

They extend :mod:`ojs_codec`'s hierarchy (every one is an :class:`ojs_codec.AMQPError`), so one
``except ojs_codec.AMQPError`` catches everything this library raises, and the
reply-code classes (``NotFound``, ``PreconditionFailed``…) come straight from the codec.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ojs_codec import AMQPError, UsageError

if TYPE_CHECKING:
    from ojs_codec import BasicProperties

__all__ = [
    "ChannelClosedError",
    "ConnectionLostError",
    "OperationTimeoutError",
    "ConnectionClosedError",
    "ConsumerCancelledError",
    "DeliveryAlreadySettledError",
    "PublishError",
    "PublishNackedError",
    "PublishOutcomeUnknownError",
    "PublishTimeoutError",
    "StaleDeliveryError",
    "UnroutableError",
    "BlockedTimeoutError",
    "RecoveryFailedError",
    "TransactionLostError",
    "DELIVERY_LOST_ERRORS",
]


class ConnectionLostError(AMQPError):
    """The transport failed (reset, EOF, missed heartbeats, TLS error…)."""


class ConnectionClosedError(AMQPError):
    """The connection is closed (by us, or it failed earlier); nothing can be sent."""


class ChannelClosedError(AMQPError):
    """The channel is closed; ``__cause__`` holds the broker's error if it closed it."""


class RecoveryFailedError(ConnectionLostError):
    """Automatic recovery gave up (attempts or deadline exhausted)."""


class TransactionLostError(ConnectionLostError):
    """The connection was lost during a transaction: the broker rolled it back.

    Everything published or acked since the last commit was discarded.  The recovered
    channel is transactional again and a new transaction has begun: redo the work and
    commit again.
    """


class PublishError(AMQPError):
    """Base of the errors a publish can end with."""


class PublishNackedError(PublishError):
    """The broker nacked the publish (for example ``x-overflow=reject-publish``: queue full)."""

    def __init__(self, message: str, *, exchange: str, routing_key: str) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        super().__init__(message)


class UnroutableError(PublishError):
    """A mandatory publish matched no queue: the broker returned it (Basic.Return)."""

    def __init__(
        self,
        message: str,
        *,
        reply_code: int,
        reply_text: str,
        exchange: str,
        routing_key: str,
        properties: BasicProperties | None = None,
    ) -> None:
        self.reply_code = reply_code
        self.reply_text = reply_text
        self.exchange = exchange
        self.routing_key = routing_key
        self.properties = properties
        super().__init__(message)


class PublishOutcomeUnknownError(PublishError):
    """The channel or connection died before the broker confirmed the publish.

    The message may or may not have been routed: retry it if duplicates are acceptable.
    """


class OperationTimeoutError(AMQPError, TimeoutError):
    """An operation waited longer than its timeout for a recovering (or blocked)
    connection; nothing was sent.  Raised by calls, ``Channel.open`` and
    ``Connection.wait_connected``; publishes raise the subclass :class:`PublishTimeoutError`."""


class PublishTimeoutError(PublishError, OperationTimeoutError):
    """A publish could not be written in time (broker blocked, or disconnected).

    Raised by publishes only; other operations raise :class:`OperationTimeoutError`,
    which also catches this one."""


class BlockedTimeoutError(PublishTimeoutError):
    """The broker kept publishers blocked (``connection.blocked``) past the timeout."""


class ConsumerCancelledError(AMQPError):
    """The broker cancelled the consumer (for example, its queue was deleted)."""

    def __init__(self, message: str, *, consumer_tag: str, queue: str) -> None:
        self.consumer_tag = consumer_tag
        self.queue = queue
        super().__init__(message)


class DeliveryAlreadySettledError(UsageError):
    """The delivery was already acked, nacked or rejected.  Nothing was sent."""


class StaleDeliveryError(UsageError):
    """The delivery came from a channel that has since closed or been recovered.

    The broker will redeliver it (with ``redelivered=True``); nothing was sent.
    """


#: The errors that mean "this delivery can no longer be settled here": its channel or
#: connection died (or was recovered, or stayed away longer than the operation's
#: timeout: it is recovering) before the settlement went out, so the broker delivers the
#: message again.  A consumer catches these around one message's handling, logs them and
#: carries on with the next delivery.
DELIVERY_LOST_ERRORS: tuple[type[Exception], ...] = (
    PublishOutcomeUnknownError,
    StaleDeliveryError,
    ChannelClosedError,
    ConnectionLostError,
    OperationTimeoutError,
)
