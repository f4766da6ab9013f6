"""Dead letters, in one place: how the worker dead-letters a job, and the dead-letter
queue's administration (:class:`DeadLetters`: peek, requeue, republish, purge, prune).

**Settlement** (FAIL, discard; OJS AMQP binding §5.5, AMQP-009).  Default:
``Basic.Nack(requeue=false)`` on the original delivery.  The broker dead-letters the
message through the job queue's ``x-dead-letter-exchange`` into ``ojs.queue.dlx.{q}``,
unchanged but for RabbitMQ's ``x-death`` headers (reason ``rejected``) and the
``x-first-death-*`` / ``x-last-death-*`` ones.  No copy is ever put back on the job queue,
so a consumer that shares the queue (any client following the binding) never sees the job
again.  A Nack cannot add headers, so the reason of the *final* failure is not on the
message: before the Nack the worker publishes a confirmed **death note** keyed by job id to
``ojs.dlx-notes.{q}`` (``_death_notes.py``), which :meth:`DeadLetters.peek` joins with.  It
also goes to the log line (``outcome=dead_lettered code=... : message``), to the
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

**Administration** goes through the client's public API only (:class:`DeadLetterClient`);
the pure message helpers (requeue properties, death times) are ``_dlq.py``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from opentelemetry.trace import SpanKind, Status, StatusCode

from .. import amqp
from .._dead_letter_queue import DeadLetterQueue, return_to_queue
from . import _tracing
from ._death_notes import DeathNote, Publish, read_notes, write_note
from ._declarer import Declarer
from ._dlq import death_reason, died_at, requeue_properties
from ._durations import DurationLike, duration_seconds
from ._envelope import format_timestamp
from ._errors import ArgumentTypeError
from ._failures import error_history
from ._renamed import warn_renamed
from ._topology import DLQ_MAX_AGE_MS, DLQ_MAX_LENGTH, Names
from ._wire import H_ATTEMPT, H_DEAD_LETTERED_AT, H_ERROR_CODE, H_ERROR_MESSAGE, header_int, with_headers

__all__ = ["DeadJob", "DeadLetterClient", "DeadLetters", "dead_letter", "return_to_queue"]


class DeadLetterClient(Protocol):
    """What the administration uses of a client (``Client`` is one)."""

    conn: amqp.Connection
    names: Names

    async def channel(self) -> amqp.Channel: ...

    async def declare_queue(self, queue: str) -> None: ...


class _DyingClient(Protocol):
    names: Names
    declarer: Declarer


class Dying(Protocol):
    """What settling a dead job uses of the worker's ``Attempt`` (``_attempt.py``)."""

    ch: amqp.Channel
    msg: amqp.IncomingMessage
    queue: str
    number: int

    @property
    def client(self) -> _DyingClient: ...

    @property
    def job_id(self) -> str | None: ...

    @property
    def job_type(self) -> str | None: ...


log = logging.getLogger("ojs_anyio.worker")


async def dead_letter(a: Dying, *, code: str, message: str, publish: Publish, annotate: bool) -> None:
    """Settle the delivery of ``a`` as dead (see the module docstring); record the final
    reason: on the annotated copy (``annotate``), else in a death note (``_death_notes.py``)
    published with ``publish`` before the Nack."""
    ch, msg, queue, job_id = a.ch, a.msg, a.queue, a.job_id
    names = a.client.names
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
    if annotate:
        copy = with_headers(
            msg.properties,
            {
                H_ERROR_CODE: code,
                H_ERROR_MESSAGE: message[:1000],
                H_DEAD_LETTERED_AT: format_timestamp(datetime.now(UTC)),
            },
        )
        published = await publish(
            ch, msg.body, exchange=names.dlx_exchange, routing_key=queue, properties=copy, mandatory=True
        )
        if published is None:
            return  # the worker's grace period ran out: left for the broker to redeliver
        if published.confirmed:
            await msg.ack()
            return
        # Refused (for good, or through every retry): the job is dead all the same, so the
        # original goes the default way, with a death note instead of the annotation.
        log.warning(
            "job %s: annotated dead-letter copy refused by %r (%s); rejecting the original instead",
            job_id, names.dlx_exchange, published.reason,
        )  # fmt: skip
    if job_id:
        noted = await write_note(
            ch, publish, declarer=a.client.declarer, names=names, queue=queue, job_id=job_id,
            job_type=a.job_type, attempt=a.number, code=code, message=message,
        )  # fmt: skip
        if noted is None:
            return  # the worker's grace period ran out: left for the broker to redeliver
    await msg.nack(requeue=False)


# ------------------------------------------------------------ administration


@dataclass(frozen=True, slots=True)
class DeadJob:
    """A job in a dead-letter queue, with why it died.

    ``error_code`` / ``error_message`` are why it died: in the default mode from the death
    note the worker published before its Nack (``noted``), in the opt-in annotated mode from
    the copy's ``x-ojs-error-*`` headers; without either (a job Nacked by another consumer,
    or a note since dropped) the headers the last retry wrote, if any.  ``death_reason`` is
    RabbitMQ's (``rejected`` for a discard, ``expired``, ``maxlen``) and ``died_at`` when it
    died.  ``malformed`` says why its content header is malformed
    (``IncomingMessage.malformed``; ``job_id`` and ``type`` are then shown with backslash
    escapes, and ``requeue`` leaves it where it is).
    """

    #: The job's id (``job_id`` is a deprecated alias).
    id: str | None
    type: str | None
    error_code: str | None
    error_message: str | None
    attempt: int
    body: bytes
    headers: dict[str, Any]
    death_reason: str | None = None
    died_at: datetime | None = None
    malformed: str | None = None
    #: The job's error history (``x-ojs-errors``: the failed attempts that were retried,
    #: oldest first, at most 10); the final attempt's error is ``error_code`` /
    #: ``error_message`` in the annotated mode, else in the worker's log.
    errors: tuple[dict[str, Any], ...] = ()
    #: ``error_code`` / ``error_message`` come from the death note the worker wrote when it
    #: Nacked the job (the default mode; ``_death_notes.py``), not from the message's headers.
    noted: bool = False

    @property
    def job_id(self) -> str | None:
        """Deprecated alias of :attr:`id`."""
        warn_renamed("DeadJob", "job_id", "id")
        return self.id

    @property
    def reason(self) -> str:
        """Why it died, in one line (``ojs-anyio dlq peek``'s REASON, the dashboard's)."""
        if self.malformed is not None:
            return f"malformed message: {self.malformed}"
        final = (self.error_code or "", self.error_message or "") if self.noted else None
        return death_reason(amqp.BasicProperties(headers=self.headers), final=final)


class DeadLetters:
    """List, requeue and purge ``ojs.queue.dlx.{q}``."""

    def __init__(self, client: DeadLetterClient, queue: str) -> None:
        self.client = client
        self.queue = queue
        self.name = client.names.dlx_queue(queue)

    async def count(self) -> int:
        ch = await self.client.channel()
        info = await ch.queue_declare(self.name, passive=True)
        return info.message_count

    def _dlq(self) -> DeadLetterQueue:
        return DeadLetterQueue(self.client.conn, self.name)

    async def peek(self, limit: int = 100) -> list[DeadJob]:
        """Up to ``limit`` dead jobs, oldest first, left in the queue.

        Implemented with Basic.Get + one Basic.Reject(requeue) per message on a private
        channel, so it sets ``redelivered`` on them but never removes one.
        """
        jobs = await self._dlq().peek(limit, _dead_job)
        # Jobs Nacked by a worker carry no final reason: join them to their death notes.
        bare = {j.id for j in jobs if j.id and j.malformed is None and H_DEAD_LETTERED_AT not in j.headers}
        notes = await read_notes(self.client.conn, self.client.names, self.queue, bare)
        return [_with_note(j, notes[j.id]) if j.id in notes else j for j in jobs]

    async def requeue(
        self,
        limit: int | None = None,
        *,
        ids: Collection[str] | None = None,
        reset_attempts: bool = True,
        on_moved: Callable[[int], object] | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> int:
        """Move dead jobs back to ``ojs.queue.{q}`` with the id kept and (``reset_attempts``)
        the attempt reset to 1; only the jobs whose id is in ``ids``, when given.

        Each move publishes with a confirm, then acks the dead copy: a failure in between
        leaves a duplicate, never a loss.  A malformed message (``DeadJob.malformed``)
        cannot be published again as it is, and a worker would only dead-letter it
        again: it is held while the queue is scanned and put back, and not counted; so
        are the jobs ``ids`` leaves out, in their order.  At most the messages present at
        the start are looked at.  ``on_moved(n)`` reports progress; ``stop()`` ends early.
        The scan is ``ojs_anyio/_dead_letter_queue.py``'s, shared with the event bus.
        """
        if isinstance(ids, str):
            raise ArgumentTypeError("ids must be a collection of job ids, not one str: write ids=[job_id]")
        await self.client.declare_queue(self.queue)

        async def move(ch: amqp.Channel, msg: amqp.IncomingMessage) -> None:
            await self.republish(ch, msg, reset_attempts=reset_attempts)

        return await self._dlq().move(
            move,
            key=lambda msg: amqp.property_text(msg.properties.message_id) or "",
            limit=limit,
            ids=ids,
            on_moved=on_moved,
            stop=stop,
        )

    async def republish(
        self, ch: amqp.Channel, msg: amqp.IncomingMessage, *, reset_attempts: bool = True
    ) -> None:
        """Publish one dead job (``msg``, got from this DLQ on ``ch``, a channel with
        confirms) back to ``ojs.queue.{q}``: its body, with :func:`requeue_properties`,
        through ``ojs.exchange.direct``, mandatory, and return once the broker confirmed
        it.  The caller then acks ``msg`` (publish, confirm, then ack: never lost); if this
        raises, ``msg`` is still unsettled.  A refusal by the broker is retried first
        (:func:`amqp.republish`: a nack or a publish not written in time), and the copy
        carries neither ``user_id`` nor ``expiration``; the last refusal is raised."""
        published = await amqp.republish(
            ch,
            msg.body,
            exchange=self.client.names.direct_exchange,
            routing_key=self.queue,
            properties=requeue_properties(msg.properties, reset_attempts=reset_attempts),
            mandatory=True,
        )
        if not published.confirmed:
            assert published.error is not None  # no refused_for_good check: an error each time
            raise published.error

    async def purge(self) -> int:
        ch = await self.client.channel()
        return await ch.queue_purge(self.name)

    async def prune(
        self,
        older_than: DurationLike | None = timedelta(milliseconds=DLQ_MAX_AGE_MS),
        *,
        max_jobs: int | None = DLQ_MAX_LENGTH,
        limit: int = 100_000,
        on_dropped: Callable[[int], object] | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> int:
        """Enforce dead-letter retention: drop jobs that died more than ``older_than`` ago,
        then the oldest beyond ``max_jobs``.  Defaults: the OJS 180 days and 10,000 jobs.

        The dead-letter queue is declared without arguments, as the spec declares it, so
        the broker bounds nothing: run this periodically (``ojs-anyio dlq prune``
        or a task of your own).  The queue is FIFO by death, so it stops at the first job
        young enough to keep while the count is within bounds; at most ``limit`` are
        dropped per call.  A job's death time is :func:`died_at`'s: ``x-ojs-dead-lettered-at``
        (annotated mode), or RabbitMQ's ``x-death`` time, or its ``timestamp``; a job whose
        death time is unknown (none of them, or an unusable one) is never dropped for its
        age, so the age rule stops there too.  ``on_dropped(n)`` is called after each drop
        with the count so far (a progress report); ``stop()`` is asked before each job and
        ends the call early when true.  Returns how many were dropped.

        ``max_jobs`` and ``limit`` must be whole numbers, zero or more (a negative one is
        refused before anything is touched: it would otherwise drop every job).
        """
        cutoff = None
        if older_than is not None:
            seconds = duration_seconds(older_than, "older_than")
            try:
                cutoff = datetime.now(UTC) - timedelta(seconds=seconds)
            except OverflowError:  # before year 1: no job is that old
                cutoff = None
        return await self._dlq().prune(
            cutoff=cutoff,
            max_count=max_jobs,
            limit=limit,
            died=lambda props, now: died_at(props, now=now),
            on_dropped=on_dropped,
            stop=stop,
            count_name="max_jobs",
        )


def _with_note(job: DeadJob, note: DeathNote) -> DeadJob:
    """``job`` with the final reason its worker's death note gives (``_death_notes.py``)."""
    return dataclasses.replace(job, error_code=note.code, error_message=note.message, noted=True)


def _dead_job(msg: amqp.IncomingMessage) -> DeadJob:
    headers = dict(msg.properties.headers or {})
    code = headers.get(H_ERROR_CODE)
    message = headers.get(H_ERROR_MESSAGE)
    # The broker's latest dead-lettering of it (x-death is most recent first); none for an
    # annotated copy, which was published, not dead-lettered.
    deaths = headers.get("x-death")
    latest = deaths[0] if isinstance(deaths, list) and deaths else None
    reason = None
    if H_DEAD_LETTERED_AT not in headers and isinstance(latest, dict):
        reason = latest.get("reason")
    return DeadJob(
        id=amqp.property_text(msg.properties.message_id),
        type=amqp.property_text(msg.properties.type),
        error_code=code if isinstance(code, str) else None,
        error_message=message if isinstance(message, str) else None,
        attempt=header_int(headers, H_ATTEMPT, 1),
        body=msg.body,
        headers=headers,
        death_reason=reason if isinstance(reason, str) else None,
        died_at=died_at(msg.properties),
        malformed=msg.malformed,
        errors=tuple(error_history(headers)),
    )
