"""Hostile deliveries: messages RabbitMQ accepts and delivers whose content header our
codec's strict rules refuse (a short string or a header key that is not UTF-8, headers
nested deeper than 64 levels, a timestamp no datetime holds, a header larger than the
consumer's ``frame_max``).  Before the codec decoded delivered headers leniently, each
of them closed the consumer's whole connection, again on every reconnect.

They are published by a foreign client, pika, which writes such properties as it is
given them, with publisher confirms and ``mandatory``: a publish returns once RabbitMQ
took the message into a queue.  pika is blocking: call :func:`publish` in a worker
thread (``await anyio.to_thread.run_sync(...)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pika

__all__ = ["CONSUMER_FRAME_MAX", "HOSTILE", "Hostile", "publish", "with_frame_max"]

#: The ``frame_max`` of the consumers in these tests: the ``large-header`` case's header
#: fits RabbitMQ's (and pika's) 131072 but not this.
CONSUMER_FRAME_MAX = 4096


def _nested(levels: int) -> dict[str, Any]:
    table: dict[str, Any] = {"leaf": 1}
    for _ in range(levels):
        table = {"n": table}
    return table


@dataclass(frozen=True)
class Hostile:
    """One hostile case: its properties (pika's keyword arguments) and a piece of the
    ``malformed`` reason our consumers must report for it."""

    name: str
    properties: dict[str, Any]
    reason: str

    def pika_properties(self, **extra: Any) -> pika.BasicProperties:
        return pika.BasicProperties(**{**extra, **self.properties})


HOSTILE = (
    Hostile("message-id", {"message_id": b"\xff\xfeid"}, "message_id is not UTF-8"),
    Hostile("correlation-id", {"correlation_id": b"c\xff"}, "correlation_id is not UTF-8"),
    Hostile("type", {"type": b"t\xc3"}, "type is not UTF-8"),
    Hostile("header-key", {"headers": {b"k\xff": 1}}, "header table key b'k\\xff' is not UTF-8"),
    Hostile("deep-headers", {"headers": {"d": _nested(100)}}, "nest deeper than 64 levels"),
    Hostile("timestamp", {"timestamp": 2**64 - 1}, "timestamp 18446744073709551615 is out of range"),
    Hostile(
        "large-header",
        {"headers": {"pad": "x" * 3 * CONSUMER_FRAME_MAX}},
        f"is larger than frame_max ({CONSUMER_FRAME_MAX}): it cannot be published again as it is",
    ),
)
"""Every case (each test puts them all in front of good messages)."""


def with_frame_max(url: str, frame_max: int = CONSUMER_FRAME_MAX) -> str:
    """``url`` with its ``frame_max`` query parameter set (our URL syntax, as RabbitMQ's)."""
    return f"{url}{'&' if '?' in url else '?'}frame_max={frame_max}"


def publish(url: str, messages: Sequence[tuple[str, str, bytes, pika.BasicProperties]]) -> None:
    """Publish ``(exchange, routing_key, body, properties)`` in order on one channel, each
    confirmed by the broker (``pika.exceptions.UnroutableError`` / ``NackError`` if not)."""
    params = pika.URLParameters(url)
    params.blocked_connection_timeout = 30
    params.socket_timeout = 30
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for exchange, routing_key, body, properties in messages:
            ch.basic_publish(exchange, routing_key, body, properties, mandatory=True)
    finally:
        conn.close()
