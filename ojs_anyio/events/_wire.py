"""What an event looks like on the wire: body, properties, headers, trace context.

* Body: a msgspec Struct, a dict (anything msgspec encodes) as JSON
  (``application/json``); bytes as they are (``application/octet-stream``).
* Properties: ``delivery_mode`` 2 (persistent), ``message_id`` (a UUIDv7-format id),
  ``timestamp`` (seconds), ``content_type``, and the headers.
* Trace context: the W3C ``traceparent`` / ``tracestate`` headers, written from the
  current OpenTelemetry context (opentelemetry-api only; nothing is recorded without an
  SDK).  The consumer runs the handler in a CONSUMER span whose parent is the producer.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any, Final

import msgspec
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from .. import amqp
from .._common import new_id, tracing_recording, utc_second
from .._misuse import ArgumentTypeError
from .._trace_context import NO_SPAN, context_from, current_traceparent, start_settle_span

__all__ = [
    "CONTENT_BYTES",
    "CONTENT_JSON",
    "H_ATTEMPT",
    "H_DEAD_LETTERED_AT",
    "H_ERROR",
    "H_QUEUE",
    "H_REASON",
    "H_ROUTING_KEY",
    "consumer_span",
    "encode_payload",
    "new_message_id",
    "now_timestamp",
    "producer_span",
    "trace_headers",
]

CONTENT_JSON: Final = "application/json"
CONTENT_BYTES: Final = "application/octet-stream"

#: The delivery number of a redelivered event (1 for the first delivery; absent means 1).
H_ATTEMPT: Final = "x-event-attempt"
#: The routing key the event was published with (a redelivery goes through another queue).
H_ROUTING_KEY: Final = "x-event-routing-key"
#: The last handler error (type: message), on redeliveries and dead letters.
H_ERROR: Final = "x-event-error"
#: Why an event was dead-lettered: ``max_attempts``, ``invalid_payload`` or ``rejected``.
H_REASON: Final = "x-event-dead-letter-reason"
#: The subscriber queue a dead letter came from, and when (ISO 8601, UTC).
H_QUEUE: Final = "x-event-queue"
H_DEAD_LETTERED_AT: Final = "x-event-dead-lettered-at"

_encode_json = msgspec.json.Encoder().encode

# ----------------------------------------------------------------------------- ids, time

#: Event message ids: the library's one id generator (UUIDv7 text; see ``_common.new_id``).
new_message_id = new_id


def now_timestamp() -> datetime.datetime:
    """The AMQP timestamp (whole seconds, UTC), one datetime object per second."""
    return utc_second(int(time.time()))


# ----------------------------------------------------------------------------- payloads


def encode_payload(payload: object) -> tuple[bytes, str]:
    """``(body, content_type)`` for a Struct / dict / JSON value, or bytes as they are."""
    if isinstance(payload, bytes | bytearray | memoryview):
        return bytes(payload), CONTENT_BYTES
    try:
        return _encode_json(payload), CONTENT_JSON
    except (TypeError, msgspec.EncodeError) as exc:
        raise ArgumentTypeError(
            f"cannot encode an event payload of type {type(payload).__name__}: {exc} "
            "(give a msgspec Struct, a dict, or bytes)"
        ) from None


# ----------------------------------------------------------------------------- tracing

tracer = trace.get_tracer("ojs_anyio.events", "0.1.0")


def _recording() -> bool:
    return tracing_recording(tracer)


def trace_headers() -> dict[str, str] | None:
    """The current W3C trace context as headers, or None when there is no valid span."""
    current = current_traceparent()
    if current is None:
        return None
    parent, state = current
    return {"traceparent": parent, "tracestate": state} if state else {"traceparent": parent}


def producer_span(exchange: str, routing_key: str, message_id: str) -> AbstractContextManager[trace.Span]:
    if not _recording():
        return NO_SPAN
    return tracer.start_as_current_span(
        f"send event {routing_key}",
        kind=SpanKind.PRODUCER,
        attributes={
            "messaging.system": "rabbitmq",
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.destination.name": exchange,
            "messaging.rabbitmq.destination.routing_key": routing_key,
            "messaging.message.id": message_id,
        },
    )


def _publisher_context(headers: Mapping[str, Any] | None) -> otel_context.Context:
    """The publisher's trace context from an event's ``traceparent`` / ``tracestate``."""
    if not headers:
        return context_from(None)
    return context_from(headers.get("traceparent"), headers.get("tracestate"))


def consumer_span(
    headers: Mapping[str, Any] | None, queue: str, routing_key: str, message_id: str | None, attempt: int
) -> AbstractContextManager[trace.Span]:
    if not _recording():
        return NO_SPAN
    ctx = _publisher_context(headers)
    attributes: dict[str, Any] = {
        "messaging.system": "rabbitmq",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": queue,
        "messaging.rabbitmq.destination.routing_key": routing_key,
        "messaging.event.attempt": attempt,
    }
    if message_id:
        attributes["messaging.message.id"] = message_id
    return tracer.start_as_current_span(
        f"process event {routing_key}", context=ctx, kind=SpanKind.CONSUMER, attributes=attributes
    )


def settle_span(
    msg: amqp.IncomingMessage, queue: str, routing_key: str, operation: str, outcome: str
) -> AbstractContextManager[trace.Span]:
    """The span ``{ack|nack|reject} event {routing_key}`` around settling ``msg`` (see
    ``_trace_context.start_settle_span``), in the publisher's trace; nothing when unrecorded."""
    if not _recording():
        return NO_SPAN
    return start_settle_span(
        tracer, _publisher_context(msg.properties.headers), f"{operation} event {routing_key}",
        operation=operation, destination=queue,
        message_id=amqp.property_text(msg.properties.message_id), outcome=outcome,
        extra={"messaging.rabbitmq.destination.routing_key": routing_key},
    )  # fmt: skip


def event_properties(
    content_type: str, message_id: str, headers: dict[str, Any] | None
) -> amqp.BasicProperties:
    return amqp.BasicProperties(
        content_type=content_type,
        delivery_mode=2,
        message_id=message_id,
        timestamp=now_timestamp(),
        headers=headers,
    )
