"""W3C trace context and OpenTelemetry spans for jobs (OJS AMQP binding §12.2).

The summary page's ``x-ojs-traceparent`` header is written too, and either is read.

Only ``opentelemetry-api`` is used: with no SDK configured every span is a cheap no-op.

* PUSH opens a PRODUCER span ``{queue} publish`` and writes the W3C ``traceparent`` into
  ``x-ojs-trace-id`` (001) and ``x-ojs-traceparent`` (000), and ``tracestate`` into
  ``x-ojs-trace-state``.
* The worker reads either header and runs the handler in a CONSUMER span
  ``{queue} process`` whose parent is the producer's span.
* A retry republishes the original headers, so every attempt links to the original trace.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind

from ._envelope import Job
from ._wire import H_TRACE_ID, H_TRACE_STATE, H_TRACEPARENT

__all__ = ["consumer_span", "extract_context", "inject_headers", "producer_span", "tracer"]

tracer = trace.get_tracer("ojs_anyio.jobs", "0.1.0")


def _recording() -> bool:
    """Whether spans are recorded: an SDK (or other) tracer provider is installed.

    Without one, spans are skipped entirely (they would be no-ops anyway), which saves
    tens of microseconds per push and per job.  Checked on each call, so a provider
    installed later takes effect at once.
    """
    t = tracer
    if isinstance(t, trace.ProxyTracer):  # follows the global provider once one is set
        provider = trace.get_tracer_provider()
        return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
    return not isinstance(t, trace.NoOpTracer)


def inject_headers() -> dict[str, str]:
    """The current trace context as ``x-ojs-*`` headers ({} when there is no active span).

    A valid context is propagated even when nothing records spans here (for example a
    remote parent set by a web framework with the API alone)."""
    if not otel_context.get_current():  # empty context: no span (the common, cheap case)
        return {}
    if not trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    parent = carrier.get("traceparent")
    if not parent:
        return {}
    headers = {H_TRACE_ID: parent, H_TRACEPARENT: parent}
    state = carrier.get("tracestate")
    if state:
        headers[H_TRACE_STATE] = state
    return headers


def extract_context(headers: Mapping[str, Any] | None) -> otel_context.Context:
    """The producer's context from ``x-ojs-trace-id`` or ``x-ojs-traceparent``."""
    carrier: dict[str, str] = {}
    if headers:
        parent = headers.get(H_TRACE_ID) or headers.get(H_TRACEPARENT)
        if isinstance(parent, bytes):
            parent = parent.decode("ascii", "replace")
        if isinstance(parent, str):
            carrier["traceparent"] = parent
            state = headers.get(H_TRACE_STATE)
            if isinstance(state, bytes):
                state = state.decode("ascii", "replace")
            if isinstance(state, str):
                carrier["tracestate"] = state
    return propagate.extract(carrier)


class _NoSpan:
    """The context manager of a span nobody records: enters as the invalid span."""

    __slots__ = ()

    def __enter__(self) -> trace.Span:
        return trace.INVALID_SPAN

    def __exit__(self, *exc_info: object) -> None:
        return None


_NO_SPAN: Final = _NoSpan()


def producer_span(job: Job, exchange: str) -> AbstractContextManager[trace.Span]:
    if not _recording():
        return _NO_SPAN  # no generator, no span: this runs once per push
    return tracer.start_as_current_span(
        f"{job.queue} publish",
        kind=SpanKind.PRODUCER,
        attributes={
            "messaging.system": "rabbitmq",
            "messaging.operation.type": "publish",
            "messaging.operation.name": "publish",
            "messaging.destination.name": exchange,
            "messaging.rabbitmq.destination.routing_key": job.queue,
            "messaging.message.id": job.id,
            "ojs.job.type": job.type,
            "ojs.job.queue": job.queue,
        },
    )


def consumer_span(
    headers: Mapping[str, Any] | None, *, queue: str, job_id: str | None, job_type: str | None, attempt: int
) -> AbstractContextManager[trace.Span]:
    if not _recording():
        return _NO_SPAN
    ctx = extract_context(headers)
    attributes: dict[str, Any] = {
        "messaging.system": "rabbitmq",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": queue,
        "ojs.job.queue": queue,
        "ojs.job.attempt": attempt,
    }
    if job_id:
        attributes["messaging.message.id"] = job_id
    if job_type:
        attributes["ojs.job.type"] = job_type
    return tracer.start_as_current_span(
        f"{queue} process", context=ctx, kind=SpanKind.CONSUMER, attributes=attributes
    )
