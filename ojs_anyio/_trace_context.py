"""W3C trace context through opentelemetry-api: what the jobs and events layers share.

Each layer names its own headers (jobs: ``x-ojs-trace-id`` / ``x-ojs-traceparent`` /
``x-ojs-trace-state``; events: ``traceparent`` / ``tracestate``) and opens its own spans;
reading and writing the context, and the span nobody records, are the same and live here.
A leaf: it imports nothing from ojs_anyio, so either layer may use it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

__all__ = ["NO_SPAN", "context_from", "current_traceparent", "header_text", "start_settle_span"]


def current_traceparent() -> tuple[str, str | None] | None:
    """The current context's ``(traceparent, tracestate or None)``, or None when there is no
    valid span.  A valid context is written even when nothing records spans here (a remote
    parent set by a web framework with the API alone, say)."""
    if not otel_context.get_current():  # an empty context has no span: the common, cheap case
        return None
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    parent = carrier.get("traceparent")
    if not parent:
        return None
    return parent, carrier.get("tracestate") or None


def header_text(value: object) -> str | None:
    """A header's value as text (AMQP tables may carry it as bytes), or None."""
    if isinstance(value, bytes):
        return value.decode("ascii", "replace")
    return value if isinstance(value, str) else None


def context_from(traceparent: object, tracestate: object = None) -> otel_context.Context:
    """The context a producer's ``traceparent`` (and ``tracestate``) header values carry;
    the current one, unchanged, when there is no traceparent."""
    carrier: dict[str, str] = {}
    parent = header_text(traceparent)
    if parent is not None:
        carrier["traceparent"] = parent
        state = header_text(tracestate)
        if state is not None:
            carrier["tracestate"] = state
    return propagate.extract(carrier)


class _NoSpan:
    """The context manager of a span nobody records: enters as the invalid span."""

    __slots__ = ()

    def __enter__(self) -> trace.Span:
        return trace.INVALID_SPAN

    def __exit__(self, *exc_info: object) -> None:
        return None


#: Returned instead of a span when no tracer provider records one (no generator, no span).
NO_SPAN: Final = _NoSpan()


def start_settle_span(
    tracer: trace.Tracer,
    parent: otel_context.Context,
    name: str,
    *,
    operation: str,
    destination: str,
    message_id: str | None,
    outcome: str,
    extra: dict[str, Any] | None = None,
) -> AbstractContextManager[trace.Span]:
    """A CLIENT span around one settlement (OpenTelemetry's messaging conventions:
    ``messaging.operation.type`` ``settle``, ``messaging.operation.name`` ``ack``, ``nack``
    or ``reject``), in the producer's trace (``parent``), with ``ojs.outcome`` saying what
    the settlement meant (``completed``, ``retried``, ``dead_lettered``...).  Callers ask
    whether their tracer records first, so an unrecorded settlement pays nothing here."""
    attributes: dict[str, Any] = {
        "messaging.system": "rabbitmq",
        "messaging.operation.type": "settle",
        "messaging.operation.name": operation,
        "messaging.destination.name": destination,
        "ojs.outcome": outcome,
    }
    if message_id:
        attributes["messaging.message.id"] = message_id
    if extra:
        attributes.update(extra)
    kind = trace.SpanKind.CLIENT
    return tracer.start_as_current_span(name, context=parent, kind=kind, attributes=attributes)
