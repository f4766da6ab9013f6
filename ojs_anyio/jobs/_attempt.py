"""One delivery of a job, from receipt to settlement: the worker's unit of work.

The worker builds an :class:`Attempt` when a delivery arrives and hands it, instead of a
list of positional parameters, to every step that settles it (ack, retry, dead letter,
requeue, the result reply).  It knows the client and channel the delivery came through,
the OJS queue, the message, when it started, and, once decoded, the job and its attempt
number; :meth:`Attempt.outcome` turns it into the :class:`JobOutcome` every step reports.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .. import amqp
from ._context import JobOutcome, Outcome
from ._envelope import Job
from ._failures import log_extra

if TYPE_CHECKING:
    from ._client import Client

__all__ = ["JOB_LINE", "Attempt"]

#: How a log line names a job attempt (``%``-mapping style: one argument, :meth:`Attempt.fields`).
JOB_LINE = "job %(job_id)s type=%(job_type)s queue=%(queue)s attempt=%(attempt)d"


class Attempt:
    """One delivery (see the module docstring)."""

    __slots__ = ("ch", "client", "job", "msg", "number", "queue", "started")

    def __init__(self, client: Client, ch: amqp.Channel, queue: str, msg: amqp.IncomingMessage) -> None:
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
