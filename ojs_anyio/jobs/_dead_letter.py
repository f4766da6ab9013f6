"""FAIL (discard): how the worker dead-letters a job (OJS AMQP binding §5.5, AMQP-009).

Default: ``Basic.Nack(requeue=false)`` on the original delivery.  The broker dead-letters
the message through the job queue's ``x-dead-letter-exchange`` into ``ojs.queue.dlx.{q}``,
unchanged but for RabbitMQ's ``x-death`` headers (reason ``rejected``) and the
``x-first-death-*`` / ``x-last-death-*`` ones.  No copy is ever put back on the job queue,
so a consumer that shares the queue (any client following the binding) never sees the job
again.  A Nack cannot add headers, so the reason of the *final* failure is not on the
message: it goes to the log line (``outcome=dead_lettered code=... : message``), to the
per-job-type metrics (:class:`JobMetrics`: ``ojs_jobs_dead_lettered_total`` and
``ojs_jobs_failed_total`` with ``error.type``) and to a
``{queue} dead_letter`` span (``ojs.error.code``, ``ojs.error.message``, status ERROR).  The
``x-ojs-error-code`` / ``x-ojs-error-message`` headers an earlier retry wrote stay on it.

Opt-in annotation (``Worker(annotate_dead_letters=True)``: ``republish`` given), a departure from
AMQP-009: publish a copy carrying ``x-ojs-error-code``, ``x-ojs-error-message`` and
``x-ojs-dead-lettered-at`` straight to ``ojs.exchange.dlx`` (routing key = the queue,
mandatory, confirmed, through transient refusals: see ``amqp.republish``), then
``Basic.Ack`` the original.  A crash in between leaves a duplicate in the DLQ and the job
redelivered, never a loss.  If the DLX refuses the copy for good, or through every retry,
the worker falls back to the Nack: the job is dead either way.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from opentelemetry.trace import SpanKind, Status, StatusCode

from .. import amqp
from . import _tracing
from ._envelope import format_timestamp
from ._wire import H_DEAD_LETTERED_AT, H_ERROR_CODE, H_ERROR_MESSAGE, with_headers

__all__ = ["dead_letter"]

log = logging.getLogger("ojs_anyio.worker")

async def dead_letter(
    ch: amqp.Channel,
    msg: amqp.IncomingMessage,
    *,
    dlx_exchange: str,
    queue: str,
    job_id: str | None,
    code: str,
    message: str,
    republish: Callable[..., Awaitable[amqp.Republished | None]] | None,
) -> None:
    """Settle ``msg`` as dead (see the module docstring); record the final reason."""
    if _tracing.recording():
        with _tracing.tracer.start_as_current_span(
            f"{queue} dead_letter",
            context=_tracing.extract_context(msg.properties.headers),
            kind=SpanKind.INTERNAL,
            attributes={
                "messaging.system": "rabbitmq",
                "ojs.job.queue": queue,
                "messaging.message.id": job_id or "",
                "ojs.error.code": code,
                "ojs.error.message": message[:1000],
            },
        ) as span:
            span.set_status(Status(StatusCode.ERROR, f"{code}: {message[:200]}"))
    if republish is not None:
        copy = with_headers(
            msg.properties,
            {
                H_ERROR_CODE: code,
                H_ERROR_MESSAGE: message[:1000],
                H_DEAD_LETTERED_AT: format_timestamp(datetime.now(UTC)),
            },
        )
        published = await republish(
            ch, msg.body, exchange=dlx_exchange, routing_key=queue, properties=copy, mandatory=True
        )
        if published is None:
            return  # the worker's grace period ran out: left for the broker to redeliver
        if published.confirmed:
            await msg.ack()
            return
        # Refused (for good, or through every retry): the job is dead all the same, so the
        # original goes the default way, without the annotation.
        log.warning(
            "job %s: annotated dead-letter copy refused by %r (%s); rejecting the original instead",
            job_id, dlx_exchange, published.reason,
        )  # fmt: skip
    await msg.nack(requeue=False)
