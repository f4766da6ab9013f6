"""Queue options shared by the job layer and the event bus: :class:`QueueOptions`, its
checks, and the ``Queue.Declare`` arguments they become.

A leaf over the AMQP layer's public ``UsageError``: the two layers declare different
queues (``ojs.queue.{q}`` and its retry ladder; ``{tag}{name}`` and its wait ladder), but a
length limit, an overflow policy, a TTL or a quorum queue mean the same thing to RabbitMQ
in both, so the rules live here once.  No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

import msgspec

from ._misuse import UsageError

__all__ = [
    "MAX_TTL_MS",
    "QueueOptions",
    "TopologyError",
    "check_quorum",
    "dead_letter_queue_arguments",
    "queue_arguments",
    "quorum_queue_arguments",
]

#: RabbitMQ's largest TTL (``x-message-ttl``, ``expiration``): 2^32 - 1 ms, about 49.7 days.
MAX_TTL_MS: Final = 2**32 - 1


class TopologyError(UsageError):
    """A queue, exchange or binding request that the broker or the OJS naming would refuse."""


class QueueOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Options of a queue and its dead-letter queue; ``None`` means "not set".

    ``max_priority`` defaults to 10 for job queues (001 §15.1; the event bus has no
    priorities and ignores it); quorum queues need ``max_priority=None``.
    ``dlq_max_age_ms`` and ``dlq_max_length`` are opt-in broker-side bounds on the
    dead-letter queue (``x-message-ttl``, ``x-max-length``); by default a job DLQ is
    declared exactly as the spec declares it, with no arguments, and retention is the job of
    ``DeadLetters.prune`` (``bus.dead_letters(name).prune`` for events).  Setting them makes a
    job DLQ incompatible with another OJS implementation that declares it plainly.

    ``max_length`` / ``max_length_bytes`` with ``overflow="reject-publish"``: a full queue
    refuses new messages (the publisher gets a QUEUE_FULL error) instead of dropping the
    oldest (``drop-head``, RabbitMQ's default).  Nothing already queued is lost either way
    with ``reject-publish``.

    Quorum queues (RabbitMQ 3.10+, replicated with Raft; see docs/scaling.md): use
    :meth:`quorum`.  With ``queue_type="quorum"`` the queue's ladder of wait or retry queues
    and its dead-letter queue are quorum queues too; ``dead_letter_strategy="at-least-once"``
    makes every dead-letter hop between them survive a node loss, and needs
    ``overflow="reject-publish"``.  ``delivery_limit`` sets ``x-delivery-limit``: after that
    many redeliveries (a consumer or node died holding the message) RabbitMQ dead-letters it
    instead of delivering it again.
    """

    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: Literal["reject-publish", "drop-head", "reject-publish-dlx"] | None = None
    message_ttl_ms: int | None = None
    queue_type: Literal["classic", "quorum"] | None = None
    max_priority: int | None = 10
    dlq_max_age_ms: int | None = None
    dlq_max_length: int | None = None
    dead_letter_strategy: Literal["at-most-once", "at-least-once"] | None = None
    delivery_limit: int | None = None

    @classmethod
    def quorum(cls, *, delivery_limit: int | None = None, **options: Any) -> QueueOptions:
        """Quorum queues with at-least-once dead-lettering through the whole topology.

        ``queue_type="quorum"``, no priority, ``overflow="reject-publish"`` and
        ``dead_letter_strategy="at-least-once"``; other options as keywords.
        """
        defaults: dict[str, Any] = {
            "queue_type": "quorum",
            "max_priority": None,
            "overflow": "reject-publish",
            "dead_letter_strategy": "at-least-once",
        }
        return cls(delivery_limit=delivery_limit, **{**defaults, **options})

    def __post_init__(self) -> None:
        limits = ("max_length", "max_length_bytes", "message_ttl_ms", "dlq_max_age_ms", "dlq_max_length")
        for name in (*limits, "delivery_limit"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise TopologyError(f"QueueOptions.{name} must be a non-negative int or None, got {value!r}")
        if self.message_ttl_ms is not None and self.message_ttl_ms > MAX_TTL_MS:
            raise TopologyError(f"QueueOptions.message_ttl_ms exceeds RabbitMQ's maximum of {MAX_TTL_MS} ms")
        if self.max_priority is not None and (
            isinstance(self.max_priority, bool)
            or not isinstance(self.max_priority, int)
            or not 1 <= self.max_priority <= 255
        ):
            raise TopologyError(f"QueueOptions.max_priority must be 1..255 or None: {self.max_priority!r}")
        check_quorum(self)
        _check_quorum_only(self)


def check_quorum(options: QueueOptions) -> None:
    """Refuse what a quorum queue cannot do (priorities, ``reject-publish-dlx``)."""
    if options.queue_type != "quorum":
        return
    if options.max_priority is not None:
        raise TopologyError(
            "quorum queues on RabbitMQ 3.10 have no priorities (x-max-priority is classic-only); "
            "pass max_priority=None with queue_type='quorum', or use a classic queue"
        )
    if options.overflow == "reject-publish-dlx":
        raise TopologyError("quorum queues do not support x-overflow=reject-publish-dlx; use reject-publish")


def _check_quorum_only(options: QueueOptions) -> None:
    quorum = options.queue_type == "quorum"
    if options.dead_letter_strategy is not None and not quorum:
        raise TopologyError("dead_letter_strategy applies to quorum queues only (queue_type='quorum')")
    if options.delivery_limit is not None and not quorum:
        raise TopologyError("delivery_limit (x-delivery-limit) applies to quorum queues only")
    if options.dead_letter_strategy == "at-least-once" and options.overflow != "reject-publish":
        raise TopologyError(
            "at-least-once dead-lettering needs overflow='reject-publish' (RabbitMQ falls back to "
            "at-most-once with any other overflow); use QueueOptions.quorum()"
        )


def queue_arguments(
    options: QueueOptions, *, dead_letter_exchange: str, dead_letter_routing_key: str, priorities: bool = True
) -> dict[str, Any]:
    """``Queue.Declare`` arguments of a consumed queue that dead-letters to
    ``dead_letter_exchange`` / ``dead_letter_routing_key``: those two, then each option that
    is set (``priorities=False``: ``max_priority`` is not the caller's business)."""
    check_quorum(options)
    args: dict[str, Any] = {
        "x-dead-letter-exchange": dead_letter_exchange,
        "x-dead-letter-routing-key": dead_letter_routing_key,
    }
    if priorities and options.max_priority is not None:
        args["x-max-priority"] = options.max_priority
    if options.max_length is not None:
        args["x-max-length"] = options.max_length
    if options.max_length_bytes is not None:
        args["x-max-length-bytes"] = options.max_length_bytes
    if options.overflow is not None:
        args["x-overflow"] = options.overflow
    if options.message_ttl_ms is not None:
        args["x-message-ttl"] = options.message_ttl_ms
    if options.queue_type is not None:
        args["x-queue-type"] = options.queue_type
    if options.dead_letter_strategy is not None:
        args["x-dead-letter-strategy"] = options.dead_letter_strategy
    if options.delivery_limit is not None:
        args["x-delivery-limit"] = options.delivery_limit
    return args


def quorum_queue_arguments(arguments: Mapping[str, Any], options: QueueOptions | None) -> dict[str, Any]:
    """``arguments`` of a wait, retry, delay-level or landing queue, made quorum when
    ``options`` say so.

    Unchanged (a copy) unless ``options.queue_type == "quorum"``: then ``x-queue-type:
    quorum`` is added, and for a queue that dead-letters (every one of these does: that is
    how a message leaves it), ``x-dead-letter-strategy`` and ``x-overflow: reject-publish``
    when ``options.dead_letter_strategy`` is set.
    """
    args = dict(arguments)
    if options is None or options.queue_type != "quorum":
        return args
    args["x-queue-type"] = "quorum"
    if options.dead_letter_strategy is not None and "x-dead-letter-exchange" in args:
        args["x-dead-letter-strategy"] = options.dead_letter_strategy
        if options.dead_letter_strategy == "at-least-once":
            args["x-overflow"] = "reject-publish"
    return args


def dead_letter_queue_arguments(options: QueueOptions) -> dict[str, Any]:
    """Arguments of a dead-letter queue: none by default.  Opt-in: ``x-max-length`` =
    ``dlq_max_length`` (the default overflow, drop-head, drops the oldest first) and
    ``x-message-ttl`` = ``dlq_max_age_ms`` when it fits RabbitMQ's TTL limit
    (:data:`MAX_TTL_MS`).  ``x-queue-type`` follows the queue's when set (dead letters
    deserve the same durability)."""
    args: dict[str, Any] = {}
    if options.dlq_max_age_ms is not None and options.dlq_max_age_ms <= MAX_TTL_MS:
        args["x-message-ttl"] = options.dlq_max_age_ms
    if options.dlq_max_length is not None:
        args["x-max-length"] = options.dlq_max_length
    if options.queue_type is not None:
        args["x-queue-type"] = options.queue_type
    return args
