"""One delivery of a job, from receipt to settlement: the worker's unit of work.

The worker builds an :class:`Attempt` when a delivery arrives and hands it, instead of a
list of positional parameters, to every step that settles it (ack, retry, dead letter,
requeue, the result reply).  It knows the client and channel the delivery came through,
the OJS queue, the message, when it started, and, once decoded, the job and its attempt
number; :meth:`Attempt.outcome` turns it into the :class:`JobOutcome` every step reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio

from .. import amqp
from .._common import current_backend
from ._context import JobContext, JobOutcome, Outcome
from ._decide import Verdict, dead_letter
from ._envelope import Job
from ._errors import ErrorCode
from ._failures import log_extra
from ._handlers import ArgumentsError, HandlerSpec
from ._timeouts import JobScope

if TYPE_CHECKING:
    from ._client import Client

__all__ = ["JOB_LINE", "Attempt", "Backend", "fault", "handler_arguments"]

log = logging.getLogger("ojs_anyio.worker")

#: How a log line names a job attempt (``%``-mapping style: one argument, :meth:`Attempt.fields`).
JOB_LINE = "job %(job_id)s type=%(job_type)s queue=%(queue)s attempt=%(attempt)d"


class Attempt:
    """One delivery (see the module docstring)."""

    __slots__ = (
        "ch", "client", "ctx", "job", "msg", "number", "queue", "result", "scope", "started", "timeout",
        "verdict",
    )  # fmt: skip

    def __init__(
        self,
        client: Client,
        ch: amqp.Channel,
        queue: str,
        msg: amqp.IncomingMessage,
        scope: JobScope,
    ) -> None:
        self.client = client
        self.ch = ch
        #: The OJS queue the delivery came from.
        self.queue = queue
        self.msg = msg
        #: ``time.monotonic()`` at receipt.
        self.started = time.monotonic()
        #: The decoded job (None until decoded, or when it could not be).
        self.job: Job | None = None
        #: The attempt number the delivery runs as (``x-ojs-attempt``; 1 until read).
        self.number = 1
        #: The pulling task's scope: while the handler runs, its deadline is the job's, and
        #: CANCEL and the grace period cancel it (the worker's ``_pull_loop``).
        self.scope = scope
        #: The handler's context and timeout, once it is about to run.
        self.ctx: JobContext | None = None
        self.timeout = 0.0
        #: The verdict on a handler that returned as its scope was cancelled, and its result:
        #: settled outside that scope.
        self.verdict: Verdict | None = None
        self.result: Any = None

    @property
    def job_id(self) -> str | None:
        return self.job.id if self.job is not None else self.msg.properties.message_id

    @property
    def job_type(self) -> str | None:
        return self.job.type if self.job is not None else self.msg.properties.type

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def fields(self) -> dict[str, Any]:
        """The attempt's fields for :data:`JOB_LINE`."""
        return {"job_id": self.job_id, "job_type": self.job_type, "queue": self.queue, "attempt": self.number}

    def log_extra(self) -> dict[str, Any]:
        """The ``extra`` of this attempt's log records."""
        return log_extra(self.job_id, self.job_type, self.queue, self.number)

    def outcome(
        self,
        outcome: Outcome,
        *,
        timed: bool = True,
        error_code: str | None = None,
        error_message: str | None = None,
        delay_ms: int | None = None,
        error: dict[str, Any] | None = None,
        result: Any = None,
    ) -> JobOutcome:
        """What became of this attempt, timed from its receipt (unless not ``timed``: a job
        settled before anything ran)."""
        job = self.job
        msg = self.msg
        return JobOutcome(
            id=job.id if job is not None else msg.properties.message_id,
            type=job.type if job is not None else msg.properties.type,
            queue=self.queue, attempt=self.number, outcome=outcome, error_code=error_code,
            error_message=error_message, delay_ms=delay_ms,
            duration=time.monotonic() - self.started if timed else 0.0, error=error, result=result,
        )  # fmt: skip


async def fault(a: Attempt, exc: Exception) -> None:
    """A fault of ours with one delivery, outside its handler (the worker's pull loop
    catches it so that it cannot stop the worker): logged, and the job dead-lettered unless
    its delivery was lost."""
    msg = a.msg
    if isinstance(exc, amqp.DELIVERY_LOST_ERRORS):
        # The connection or channel died while settling, or stayed away longer than
        # publish_timeout: the job was not acked, so the broker redelivers it
        # (redelivered=True).  At-least-once, never lost.
        log.warning(
            "could not settle job %s (delivery %d) on %s: %s; the broker will redeliver it",
            msg.properties.message_id, msg.delivery_tag, a.queue, exc,
        )  # fmt: skip
        return
    # The backstop (the handler's own errors are decided on in the runner's _handle_one):
    # dead-lettered, so it cannot stop this worker or the next one.
    job_id = msg.properties.message_id
    log.error(
        "job %s on queue %s could not be processed; rejected into the dead-letter queue",
        job_id, a.queue, exc_info=exc, extra=log_extra(job_id, msg.properties.type, a.queue, 0),
    )  # fmt: skip
    with contextlib.suppress(*amqp.DELIVERY_LOST_ERRORS, amqp.DeliveryAlreadySettledError):
        await msg.nack(requeue=False)


def handler_arguments(spec: HandlerSpec, ctx: JobContext) -> list[Any] | Verdict:
    """The job's arguments converted for the handler, or the INVALID_ARGS dead-letter
    verdict when they do not fit its parameters."""
    job = ctx.job
    args = job.args
    try:
        # Checked against the arity worked out at registration; the full bind (which
        # words the error) only for handlers whose parameters need it.
        arity = spec.arity
        if arity is None or not arity[0] <= len(args) + 1 <= arity[1]:
            spec.signature.bind(ctx, *args)
        return spec.convert(args)
    except TypeError as exc:
        why = f"args {job.args!r} do not fit {spec.name}{spec.signature}: {exc}"
    except ArgumentsError as exc:
        why = str(exc)
    return dead_letter(ErrorCode.INVALID_ARGS, why)


class Backend:
    """The running backend's per-job primitives, looked up once per run: anyio finds the
    backend anew on every ``CancelScope()``, ``current_time()`` and
    ``get_cancelled_exc_class()``, which is a measurable share of a no-op job."""

    __slots__ = ("cancelled", "clock", "monotonic", "scope_type")

    def __init__(self) -> None:
        self.scope_type: Callable[..., anyio.CancelScope] = type(anyio.CancelScope())
        self.cancelled: type[BaseException] = anyio.get_cancelled_exc_class()
        self.clock: Callable[[], float]
        if self.cancelled is asyncio.CancelledError:
            loop = asyncio.get_running_loop()
            # What anyio.current_time() reads; asyncio's own loop reads time.monotonic(),
            # called here directly (one call a job fewer), and it is the clock of
            # Attempt.started, so the runner counts a job's deadline from its receipt (a few
            # microseconds before its handler starts) without reading the clock again.
            self.clock = time.monotonic if type(loop).time is asyncio.BaseEventLoop.time else loop.time
        elif current_backend() == "trio":
            import trio

            self.clock = trio.current_time  # likewise
        else:
            self.clock = anyio.current_time
        #: Whether ``clock`` is ``time.monotonic``, the clock of :attr:`Attempt.started`.
        self.monotonic = self.clock is time.monotonic
