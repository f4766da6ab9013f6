"""Settling one attempt on the broker, and reporting what became of it.

A :class:`Settler` carries out the verdict on a delivery (:mod:`._decide`): ``Basic.Ack``;
the retry ladder (publish with ``x-ojs-attempt`` + 1, confirmed, then ack: 001 §5.4);
dead letters (``_dead_letters.py``); requeue after a transient refusal; the move of a
redelivered job to ``ojs.queue.redelivered.{q}``; the deferral of a job of an unknown type.
Then it reports the :class:`JobOutcome` to the counts, INFO's memory, the log, the
middleware's outcome hooks and the listeners.  One per worker; the worker's runner
(``_runner.py``) calls it for each delivery.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any, Protocol

import anyio

from ojs_anyio.amqp import Int32

from .. import _pipeline, amqp
from .._trace_context import NO_SPAN
from ._attempt import JOB_LINE, Attempt
from ._context import JobOutcome, Outcome
from ._control import WorkerControl
from ._dead_letters import dead_letter as settle_dead_letter
from ._decide import Verdict, dead_letter
from ._envelope import Job, format_timestamp
from ._errors import ErrorCode
from ._failures import H_ERROR_BACKTRACE, H_ERROR_TYPE, error_headers, error_object, log_extra, with_error
from ._results import encode_reply
from ._retry import error_type_name, ladder_delay_ms
from ._topology import strip_dead_letter_headers
from ._tracing import settle_span
from ._wire import (
    H_ATTEMPT,
    H_DELIVERY_COUNT,
    H_ERROR_CODE,
    H_ERROR_MESSAGE,
    H_ERRORS,
    H_UNKNOWN_TYPE_SINCE,
    H_UNSETTLED,
    header_since,
    with_headers,
)

__all__ = ["Settler"]

log = logging.getLogger("ojs_anyio.worker")


class SettlingWorker(Protocol):
    """What the settler reads of its worker (``Worker`` is one)."""

    worker_id: str
    republish: amqp.RepublishPolicy
    unknown_type_grace: float
    annotate_dead_letters: bool
    control: WorkerControl

    @property
    def stopping(self) -> bool: ...


class Settler:
    """Settles the attempts of one worker (see the module docstring)."""

    def __init__(self, worker: SettlingWorker, rng: random.Random) -> None:
        self._worker = worker
        #: Draws the jitter of transient-refusal retries.
        self.rng = rng
        #: Outcomes so far, by outcome (the worker's ``counts``).
        self.counts: dict[str, int] = {}
        #: ``Worker.add_listener`` callbacks, and the middleware's outcome hooks (set per run).
        self.listeners: list[Callable[[JobOutcome], None]] = []
        self.hooks: tuple[Callable[[JobOutcome], None], ...] = ()
        #: The scopes of settling publishes under way, and the channel of each (the end of
        #: the grace period for that channel's queue cancels them).
        self.settle_scopes: dict[anyio.CancelScope, amqp.Channel] = {}
        #: Redelivered jobs being moved now, and the event their end sets (moves_settled).
        self._moving = 0
        self._moved: anyio.Event | None = None
        self._unknown_logged: set[str] = set()
        #: Whether settlements get spans (``settle_span``): set per run, with the handlers'
        #: Tracing middleware, so an untraced worker pays nothing per job.
        self.traced = False

    def _span(self, a: Attempt, operation: str, outcome: str) -> AbstractContextManager[Any]:
        """The settle span of ``a`` (``{ack|nack} job {type}``), or none when untraced."""
        if not self.traced:
            return NO_SPAN
        job = a.job
        job_type = job.type if job is not None else amqp.property_text(a.msg.properties.type)
        return settle_span(
            a.msg.properties.headers, queue=a.queue, job_id=a.job_id, job_type=job_type,
            operation=operation, outcome=str(outcome),
        )  # fmt: skip

    async def moves_settled(self) -> None:
        """Wait until every redelivered job this worker is moving has its original acked
        on the wire.  The copy can reach this worker's lone consumer as soon as the broker
        routed it, before the original's ack went out: run at once, a job that ends the
        process would take that ack with it, and the original would come back as a second
        copy."""
        while self._moving:
            self._moved = anyio.Event()
            await self._moved.wait()

    async def reject_malformed(self, a: Attempt) -> None:
        """A delivery whose content header the codec let through as malformed
        (``msg.malformed``: a property or header key that is not UTF-8, headers nested too
        deep, a header larger than frame_max...).  Its properties cannot be trusted nor
        published again, so it is dead-lettered unrun with ``Basic.Nack(requeue=false)``:
        the job queue's dead-letter arguments take it to the DLQ as it is."""
        msg = a.msg
        with self._span(a, "nack", Outcome.DEAD_LETTERED):
            await msg.nack(requeue=False)
        job_id = amqp.property_text(msg.properties.message_id)
        job_type = amqp.property_text(msg.properties.type)
        message = f"malformed message: {msg.malformed}"
        log.error(
            "job %(job_id)s type=%(job_type)s queue=%(queue)s outcome=dead_lettered "
            "code=%(code)s: %(message)s",
            {**a.fields(), "job_id": job_id, "job_type": job_type, "code": ErrorCode.INVALID_PAYLOAD,
             "message": message},
        )  # fmt: skip
        self.report(
            JobOutcome(
                id=job_id, type=job_type, queue=a.queue, attempt=1, outcome=Outcome.DEAD_LETTERED,
                error_code=ErrorCode.INVALID_PAYLOAD, error_message=message, duration=a.elapsed(),
            )
        )  # fmt: skip

    async def _reply(self, a: Attempt, job: Job, reply_to: str, verdict: Verdict, result: Any) -> None:
        """The job's final outcome to the pusher's result queue (``reply_to``, OJS AMQP binding
        §6.1).  Not mandatory: if the pusher has gone away its queue is gone and the broker
        drops the reply, so nothing here can hold the worker up beyond one confirm."""
        if verdict.action == "ack":
            body = encode_reply(job.id, "completed", result=result)
        else:
            message = verdict.detail or verdict.message
            error = {"code": verdict.code, "type": verdict.error_type, "message": message}
            body = encode_reply(job.id, "discarded", error=error)
        props = amqp.BasicProperties(
            content_type="application/json",
            message_id=job.id,
            correlation_id=a.msg.properties.correlation_id,
            type="ojs.result",
            app_id="ojs",
        )
        if not await self._worker.control.may_reply_to(a.client, reply_to):
            log.warning(
                "job %s: reply_to %r is not a requester's own queue; the result is not sent there",
                job.id, reply_to,
            )  # fmt: skip
            return
        try:
            await a.ch.publish(body, exchange="", routing_key=reply_to, properties=props)
        except amqp.PublishError as exc:
            log.warning("job %s: the result reply to %r was refused: %s", job.id, reply_to, exc)

    async def settle(self, a: Attempt, verdict: Verdict, result: Any = None) -> None:
        """Carry out ``verdict`` on the broker, then report the outcome."""
        action = verdict.action
        job = a.job
        reply_to = a.msg.properties.reply_to
        if reply_to and job is not None and action in ("ack", "dead_letter"):
            try:
                await self._reply(a, job, reply_to, verdict, result)
            except amqp.DELIVERY_LOST_ERRORS:
                raise
            except Exception:  # a side channel: it never keeps the job from its settlement
                log.exception("job %s: the result reply to %r failed; the job is settled all the same",
                              job.id, reply_to)  # fmt: skip
        if action == "ack" or action == "cancelled":
            outcome = Outcome.COMPLETED if action == "ack" else Outcome.CANCELLED
            if self.traced:
                with self._span(a, "ack", outcome):
                    await a.msg.ack()
            else:
                await a.msg.ack()
            self.report(a.outcome(outcome, result=result))
        elif action == "abandoned":
            # Left unacked: the broker redelivers it when the channel closes.
            self.report(a.outcome(Outcome.ABANDONED))
        elif action == "retry":
            await self._retry(a, verdict)
        else:
            assert verdict.code is not None
            await self._dead_letter(a, verdict.code, verdict.message, verdict.failure)

    async def _retry(self, a: Attempt, verdict: Verdict) -> None:
        """Through the retry ladder with the attempt number + 1 and the error headers
        (confirmed), then ack the original (001 §5.4)."""
        job, code, message, failure = a.job, verdict.code, verdict.message, verdict.failure
        assert job is not None and code is not None
        error = error_object(failure, verdict.error_type or "", verdict.detail)
        headers = {
            H_ATTEMPT: Int32(a.number + 1),
            H_ERROR_CODE: str(code),
            H_ERROR_MESSAGE: message[:1000],
            H_ERRORS: with_error(
                a.msg.properties.headers, code=str(code), message=message,
                error_type=str(error.get("type", "")) if error else "", attempt=a.number,
                at=format_timestamp(datetime.now(UTC)),
            ),
            **(error_headers(error) if error else {}),
        }  # fmt: skip
        # The previous attempt's error type and backtrace go, unless replaced.
        moved = await self._through_retry_queue(
            a, verdict.delay_ms, headers,
            drop=(H_ERROR_TYPE, H_ERROR_BACKTRACE), code=code, message=message, failure=failure,
        )  # fmt: skip
        if not moved:
            return
        _pipeline.log_failed_attempt(
            log, failure, a.log_extra(),
            f"{JOB_LINE} outcome=retried code=%(code)s delay=%(delay)dms: %(message)s",
            {**a.fields(), "code": code, "delay": verdict.delay_ms, "message": message},
        )
        self.report(
            a.outcome(
                Outcome.RETRIED, error_code=str(code), error_message=message, delay_ms=verdict.delay_ms,
                error=error,
            )
        )  # fmt: skip

    async def move_redelivered(self, a: Attempt, lost: int) -> bool:
        """A redelivered job: its earlier delivery ended without a settlement (a worker died
        or lost its connection holding it, or a graceful stop left it).  Which job of those
        a dying worker held killed it, nobody knows, so each goes, as a copy that counts
        the unsettled deliveries (``x-ojs-unsettled-deliveries``), to
        ``ojs.queue.redelivered.{q}``, which every worker consumes one job at a time:
        there, a job that kills its worker is the only one it held, and only its count
        grows, up to ``max_deliveries`` (then WORKER_LOST).  Confirmed, then the original
        is acked.  Only redelivered jobs pay this.  True when done; False (the job then
        runs now, uncounted) if the broker refused the copy."""
        msg = a.msg
        props = with_headers(
            msg.properties, {H_UNSETTLED: lost}, drop=(H_DELIVERY_COUNT,),
            base=strip_dead_letter_headers(msg.properties.headers),
        )  # fmt: skip
        self._moving += 1
        try:
            return await self._move(a, lost, props)
        finally:
            self._moving -= 1
            if not self._moving and self._moved is not None:
                self._moved.set()

    async def _move(self, a: Attempt, lost: int, props: amqp.BasicProperties | None) -> bool:
        client, ch, queue, msg = a.client, a.ch, a.queue, a.msg
        published = await self._republish(
            ch, msg.body, exchange="", routing_key=client.names.redelivered_queue(queue),
            properties=props, mandatory=True,
            redeclare=functools.partial(client.declare_redelivered_queue, queue, again=True),
        )  # fmt: skip
        if published is None:
            return True  # the grace period ran out: left for the broker to redeliver
        if not published.confirmed:
            log.warning(
                "job %s on %s: redelivery %d could not be counted (%s); it runs uncounted",
                msg.properties.message_id, queue, lost, published.reason,
            )  # fmt: skip
            return False
        with self._span(a, "ack", "moved"):
            await msg.ack()
        # On the wire before the copy can run here (and perhaps end this process): a batched
        # ack lost with the process would leave the original to come back as a second copy.
        await client.conn.flush()
        log.info(
            "job %s on %s was delivered before and never settled (%d time%s): it runs again on its own",
            msg.properties.message_id, queue, lost, "" if lost == 1 else "s",
        )  # fmt: skip
        return True

    async def unknown_type(self, a: Attempt) -> None:
        """A job of a type this worker has no handler for (a rolling deploy: pushed by new
        code before every worker runs it).  Within ``unknown_type_grace`` of the first time
        a worker met it, it goes back through the retry ladder, not counted as an attempt,
        so a worker that knows the type takes it once the delay passes; after that it is
        dead-lettered as ``INVALID_JOB_TYPE``."""
        job = a.job
        assert job is not None
        now_ms = int(time.time() * 1000)
        grace_ms = int(self._worker.unknown_type_grace * 1000)
        since = header_since(a.msg.properties.headers, H_UNKNOWN_TYPE_SINCE, now_ms)
        waited_ms = now_ms - since
        reason = f"no handler registered for job type {job.type!r} on worker {self._worker.worker_id}"
        if waited_ms >= grace_ms:
            if grace_ms:
                grace = self._worker.unknown_type_grace
                reason += f" (for {waited_ms / 1000:.0f}s, past the {grace:g}s grace window)"
            await self.settle(a, dead_letter(ErrorCode.INVALID_JOB_TYPE, reason))
            return
        # Waits of about the time waited so far (1 s, 2 s, 5 s… at most a minute), on the
        # rungs of the retry ladder, never past the end of the window.
        ladder_ms = ladder_delay_ms(min(max(waited_ms, 1000), 60_000), max_ms=max(grace_ms - waited_ms, 1))
        headers = {H_UNKNOWN_TYPE_SINCE: since, H_ATTEMPT: Int32(a.number)}
        moved = await self._through_retry_queue(
            a, ladder_ms, headers, code=ErrorCode.INVALID_JOB_TYPE, message=reason
        )
        if not moved:
            return
        if job.type not in self._unknown_logged and len(self._unknown_logged) < 1000:
            self._unknown_logged.add(job.type)
            log.warning(
                "job type %r on queue %s has no handler on worker %s: its jobs go back through the "
                "retry queues for up to %gs (a worker that knows the type takes them), then to the "
                "dead-letter queue (logged once per type)",
                job.type, a.queue, self._worker.worker_id, self._worker.unknown_type_grace,
            )  # fmt: skip
        self.report(
            a.outcome(
                Outcome.DEFERRED, error_code=str(ErrorCode.INVALID_JOB_TYPE), error_message=reason,
                delay_ms=ladder_ms,
            )
        )  # fmt: skip

    async def _through_retry_queue(
        self,
        a: Attempt,
        ladder_ms: int,
        headers: dict[str, Any],
        *,
        drop: tuple[str, ...] = (),
        code: ErrorCode,
        message: str,
        failure: BaseException | None = None,
    ) -> bool:
        """Publish the job again through ``ojs.queue.retry.{q}.{ladder_ms}`` with ``headers``
        (confirmed), then ack the original.  True when that happened; otherwise the
        delivery was settled by the rule for refusals (docs/failure-handling.md)."""
        client, ch, queue, msg = a.client, a.ch, a.queue, a.msg
        await client.declare_retry_queue(queue, ladder_ms)
        props = with_headers(
            msg.properties, headers, drop=drop, base=strip_dead_letter_headers(msg.properties.headers)
        )
        published = await self._republish(
            ch,
            msg.body,
            exchange=client.names.retry_exchange,
            routing_key=client.names.retry_routing_key(queue, ladder_ms),
            properties=props,
            mandatory=True,
            redeclare=functools.partial(client.declare_retry_queue, queue, ladder_ms, again=True),
        )
        if published is None:
            return False  # the grace period ran out first: left for the broker to redeliver
        if published.final:
            why = f"{message} (the retry cannot be published: {published.reason})"
            await self._dead_letter(a, code, why, failure)
            return False
        if published.gave_up:
            await self._requeue(a, f"the retry was not confirmed: {published.reason}")
            return False
        with self._span(a, "ack", Outcome.RETRIED):
            await msg.ack()
        return True

    async def _dead_letter(
        self, a: Attempt, code: ErrorCode, message: str, failure: BaseException | None = None
    ) -> None:
        """``Basic.Nack(requeue=false)`` (or the opt-in annotated copy; ``_dead_letter.py``),
        an ERROR line with the failure's traceback, and the outcome."""
        annotated = self._worker.annotate_dead_letters
        with self._span(a, "ack" if annotated else "nack", Outcome.DEAD_LETTERED):
            # With a death note unless annotated (_death_notes.py).
            await settle_dead_letter(
                a, code=str(code), message=message, publish=self._republish, annotate=annotated
            )
        _pipeline.log_dead_letter(
            log, failure, a.log_extra(),
            f"{JOB_LINE} outcome=dead_lettered code=%(code)s: %(message)s",
            {**a.fields(), "code": code, "message": message},
        )
        self.report(
            a.outcome(
                Outcome.DEAD_LETTERED, error_code=str(code), error_message=message,
                error=error_object(failure, _error_type(failure) if failure else str(code), message),
            )
        )  # fmt: skip

    async def _requeue(self, a: Attempt, why: str) -> None:
        """Give the delivery back to the broker unchanged (``Basic.Nack``, requeue): a
        transient refusal of a settling publish must not change the job's fate."""
        with self._span(a, "nack", Outcome.REQUEUED):
            await a.msg.nack(requeue=True)
        log.warning(
            f"{JOB_LINE} outcome=requeued: %(why)s; the broker delivers it again",
            {**a.fields(), "why": why}, extra=a.log_extra(),
        )  # fmt: skip
        self.report(a.outcome(Outcome.REQUEUED, error_message=why))

    async def _republish(self, ch: amqp.Channel, body: bytes, **publish: Any) -> amqp.Republished | None:
        """:func:`amqp.republish` under this worker's policy (``republish=``).

        ``None`` when a graceful stop's grace period ran out first: the delivery is left
        unsettled, and the broker redelivers it when the channel closes."""
        with anyio.CancelScope() as scope:
            self.settle_scopes[scope] = ch
            try:
                return await amqp.republish(ch, body, policy=self._worker.republish, rng=self.rng, **publish)
            finally:
                del self.settle_scopes[scope]
        return None

    def report(self, outcome: JobOutcome) -> None:
        try:
            self.counts[outcome.outcome] += 1  # no call once an outcome was counted
        except KeyError:
            self.counts[outcome.outcome] = 1
        self._worker.control.finished(outcome)
        if outcome.outcome in ("completed", "cancelled", "abandoned") and log.isEnabledFor(logging.INFO):
            fields = {
                "job_id": outcome.id, "job_type": outcome.type, "queue": outcome.queue,
                "attempt": outcome.attempt, "outcome": str(outcome.outcome), "duration": outcome.duration,
            }
            log.info(
                f"{JOB_LINE} outcome=%(outcome)s duration=%(duration).3fs", fields,
                extra=log_extra(outcome.id, outcome.type, outcome.queue, outcome.attempt),
            )  # fmt: skip
        if not (self.hooks or self.listeners):
            return
        for cb in (*self.hooks, *self.listeners):
            try:
                cb(outcome)
            except Exception:  # a listener's bug must not stop the worker
                log.exception(
                    "worker %s: outcome listener %r failed; carrying on", self._worker.worker_id, cb
                )


def _error_type(exc: BaseException) -> str:
    return error_type_name(type(exc))
