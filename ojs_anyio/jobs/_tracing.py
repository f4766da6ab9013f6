"""W3C trace context and OpenTelemetry spans for jobs (OJS AMQP binding §12.2).

The summary page's ``x-ojs-traceparent`` header is written too, and either is read.

Only ``opentelemetry-api`` is used: with no SDK configured every span is a cheap no-op.

* PUSH opens a PRODUCER span ``send job {type}`` (OpenTelemetry's messaging conventions:
  ``messaging.operation.type`` ``send``; the job type in the name, so one queue's jobs are
  told apart in a waterfall, and "job" tells them from the event bus's spans) and writes
  the W3C ``traceparent`` into
  ``x-ojs-trace-id`` (001) and ``x-ojs-traceparent`` (000), and ``tracestate`` into
  ``x-ojs-trace-state``.
* The worker reads either header and runs the handler in a CONSUMER span
  ``process job {type}`` whose parent is the producer's span.  That is the :class:`Tracing`
  middleware, which the worker puts first (outermost) at ``run()`` when a tracer provider
  is installed (``Worker(tracing=False)`` leaves it out).  The PRODUCER span stays in the
  client's publish path: its headers are written while the message is built, inside the
  span, and ``push_batch`` publishes after its ``around_push`` hooks have run.
* A retry republishes the original headers, so every attempt links to the original trace.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from .._common import tracing_recording
from .._trace_context import NO_SPAN, context_from, current_traceparent, start_settle_span
from ._envelope import Job
from ._middleware import HandlerNext, Middleware
from ._wire import H_TRACE_ID, H_TRACE_STATE, H_TRACEPARENT

if TYPE_CHECKING:
    from ._context import JobContext

__all__ = [
    "Tracing", "consumer_span", "extract_context", "inject_headers", "producer_span", "recording",
    "settle_span", "tracer",
]  # fmt: skip

tracer = trace.get_tracer("ojs_anyio.jobs", "0.1.0")


def recording() -> bool:
    """Whether spans are recorded (see ``_common.tracing_recording``); without a recording
    tracer, spans are skipped entirely, which saves tens of microseconds per push and per job."""
    return tracing_recording(tracer)


#: The former name (tests ask it).
_recording = recording


def inject_headers() -> dict[str, str]:
    """The current trace context as ``x-ojs-*`` headers ({} when there is no active span).

    A valid context is propagated even when nothing records spans here (for example a
    remote parent set by a web framework with the API alone)."""
    current = current_traceparent()
    if current is None:
        return {}
    parent, state = current
    headers = {H_TRACE_ID: parent, H_TRACEPARENT: parent}
    if state:
        headers[H_TRACE_STATE] = state
    return headers


def extract_context(headers: Mapping[str, Any] | None) -> otel_context.Context:
    """The producer's context from ``x-ojs-trace-id`` or ``x-ojs-traceparent``."""
    if not headers:
        return context_from(None)
    return context_from(headers.get(H_TRACE_ID) or headers.get(H_TRACEPARENT), headers.get(H_TRACE_STATE))


def producer_span(job: Job, exchange: str) -> AbstractContextManager[trace.Span]:
    if not tracing_recording(tracer):  # recording(), inline
        return NO_SPAN  # no generator, no span: this runs once per push
    return tracer.start_as_current_span(
        f"send job {job.type}",
        kind=SpanKind.PRODUCER,
        attributes={
            "messaging.system": "rabbitmq",
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
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
    if not recording():
        return NO_SPAN
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
        f"process job {job_type or '-'}", context=ctx, kind=SpanKind.CONSUMER, attributes=attributes
    )


def settle_span(
    headers: Mapping[str, Any] | None,
    *,
    queue: str,
    job_id: str | None,
    job_type: str | None,
    operation: str,
    outcome: str,
) -> AbstractContextManager[trace.Span]:
    """The CLIENT span ``{ack|nack|reject} job {type}`` around one settlement, in the
    producer's trace, with ``ojs.outcome`` (``completed``, ``retried``, ``dead_lettered``,
    ``cancelled``...); nothing when spans are not recorded."""
    if not recording():
        return NO_SPAN
    return start_settle_span(
        tracer, extract_context(headers), f"{operation} job {job_type or '-'}", operation=operation,
        destination=queue, message_id=job_id, outcome=outcome,
        extra={"ojs.job.queue": queue, "ojs.job.type": job_type or ""},
    )  # fmt: skip


class Tracing(Middleware):
    """Runs each handler call in a CONSUMER span ``process job {type}``, a child of the span
    whose context the job's headers carry, so jobs pushed from the handler join the trace.

    The worker adds one itself, first in the chain, when a tracer provider is installed as
    ``run()`` starts (``Worker(tracing=False)`` leaves it out).  Give one explicitly, in the
    place you want, to trace a worker whose provider is installed after it started: with
    no provider it costs a check per job and records nothing.
    """

    async def around_handler(self, ctx: JobContext, call_next: HandlerNext) -> Any:
        job = ctx.job
        headers = ctx.message.properties.headers
        with consumer_span(headers, queue=ctx.queue, job_id=job.id, job_type=job.type, attempt=ctx.attempt):
            return await call_next()
