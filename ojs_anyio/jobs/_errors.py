"""Every error of the job layer, grouped by meaning, and the OJS error codes.

* **Misuse and bad input** (local; nothing was sent): each is an
  :class:`ojs_anyio.amqp.UsageError`, which is also a :class:`ValueError`.

  * :class:`InvalidJobError` — a job envelope (or part of one) breaks the OJS schemas.
    ``field`` names the offending attribute as a path (``type``,
    ``retry.backoff_coefficient``, ``errors[2].attempt``); ``"<body>"`` means the bytes
    were not a JSON object at all.
  * :class:`InvalidDurationError` — an ISO 8601 duration that we cannot use.
  * :class:`TopologyError` — a topology request the broker would refuse or that would
    break the OJS naming scheme (quorum queue with priorities, a name longer than 255
    bytes…); :class:`DelayOutOfRangeError` — a scheduling delay beyond the delay levels.
  * :class:`ArgumentTypeError` — an argument of the wrong type (also a ``TypeError``).

* **Runtime failures** (the broker or the connection said no): :class:`JobError` and its
  subclasses, :class:`PushError` (:class:`QueueFullError`, :class:`UnroutableJobError`,
  :class:`PushNotSentError`, :class:`PushOutcomeUnknownError`), :class:`QueueNotFoundError`,
  :class:`TopologyConflictError`,
  :class:`SchedulerUnavailableError`.  Each is an :class:`ojs_anyio.amqp.AMQPError`.

* **Handler verdicts**, not errors: :class:`Retry`, :class:`Discard`, :class:`DeadLetter`.

:class:`ErrorCode` holds the codes that travel in ``x-ojs-error-code`` and in the
``errors[].code`` entries of the envelope.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from ojs_anyio.amqp import AMQPError, UsageError

from .._misuse import ArgumentTypeError
from .._queue_options import TopologyError

__all__ = [
    "ArgumentTypeError",
    "DelayOutOfRangeError",
    "ErrorCode",
    "InvalidDurationError",
    "InvalidJobError",
    "JobError",
    "PushError",
    "PushNotSentError",
    "PushOutcomeUnknownError",
    "QueueFullError",
    "QueueNotFoundError",
    "SchedulerUnavailableError",
    "TopologyConflictError",
    "TopologyError",
    "UnroutableJobError",
]

# ------------------------------------------------------------ misuse and bad input


class InvalidJobError(UsageError):
    """A job envelope is invalid; ``field`` is the path of the offending attribute."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)

    @property
    def code(self) -> ErrorCode:
        """The OJS error code a worker reports for such a body (``INVALID_PAYLOAD``)."""
        return ErrorCode.INVALID_PAYLOAD


class InvalidDurationError(UsageError):
    """An ISO 8601 duration string is malformed or has no fixed length (years, months)."""




class DelayOutOfRangeError(TopologyError):
    """A delay is negative or longer than the binary delay levels can express."""


# ---------------------------------------------------------------- runtime failures


class JobError(AMQPError):
    """Base of the job layer's errors (also an :class:`ojs_codec.AMQPError`)."""


class PushError(JobError):
    """A push failed; ``code`` is the OJS error code."""

    code = "PUSH_FAILED"

    def __init__(self, message: str, *, job_id: str, queue: str) -> None:
        self.job_id = job_id
        self.queue = queue
        super().__init__(message)


class QueueFullError(PushError):
    """QUEUE_FULL: the queue is at ``x-max-length`` with ``x-overflow=reject-publish``."""

    code = "QUEUE_FULL"


class UnroutableJobError(PushError):
    """The job's queue does not exist (or is not bound): the broker returned the message."""

    code = "UNROUTABLE"


class PushNotSentError(PushError):
    """The job was never written to the broker: it is certainly not enqueued.

    The connection could not be used in time (it was recovering, or the broker blocked
    publishers, for longer than ``publish_timeout``), or it failed before the job was
    sent.  Pushing the same job again cannot duplicate it; a web handler can answer "not
    queued" (503).  ``__cause__`` is the connection's error.
    """

    code = "NOT_SENT"


class PushOutcomeUnknownError(PushError):
    """The job was sent, and the connection or channel failed (or ``confirm_timeout``
    passed) before the broker confirmed it.

    The job may or may not be enqueued; pushing it again may duplicate it.
    """

    code = "OUTCOME_UNKNOWN"


class QueueNotFoundError(JobError):
    """The job queue ``ojs.queue.{q}`` does not exist on the broker (a passive declare said
    404).  Raised by the calls that address a queue's workers (``cancel``, ``info``,
    ``heartbeat``, ``declare_control_queue``) instead of declaring a control queue for a
    name that no job queue has, and by ``use_existing_queue``."""

    def __init__(self, message: str, *, queue: str) -> None:
        self.queue = queue
        super().__init__(message)


class TopologyConflictError(JobError):
    """A queue exists with other arguments than ours (PRECONDITION_FAILED on declare)."""

    def __init__(self, message: str, *, queue: str, ours: dict[str, Any], broker_text: str) -> None:
        self.queue = queue
        self.ours = ours
        self.broker_text = broker_text
        super().__init__(message)


class SchedulerUnavailableError(JobError):
    """``scheduler="plugin"`` was asked for, and the broker has no delayed-message-exchange plugin."""


# ------------------------------------------------------------------- error codes


class ErrorCode(StrEnum):
    """OJS error and reason codes used by the AMQP binding.

    Canonical names come from the OJS error taxonomy (``ojs-errors.md`` §4): the execution
    errors ``HANDLER_ERROR``, ``HANDLER_TIMEOUT``, ``HANDLER_PANIC``, ``NON_RETRYABLE_ERROR``,
    ``JOB_CANCELLED``; the validation errors ``INVALID_PAYLOAD``, ``INVALID_JOB_TYPE``,
    ``INVALID_ARGS``; the resource error ``QUEUE_FULL``.

    ``CANCELLED`` and ``UNKNOWN_JOB_TYPE`` are aliases of the canonical ``JOB_CANCELLED`` and
    ``INVALID_JOB_TYPE`` (same member, same wire value), so either spelling works in code
    and only the canonical one goes on the wire.

    The remaining codes are this binding's own reasons for dead-lettering, with no
    canonical OJS name: ``UNROUTABLE``, ``EXPIRED``, ``DISCARDED``, ``MAX_ATTEMPTS_EXCEEDED``,
    ``WORKER_LOST``.
    """

    # Execution errors (retryability per the job's retry policy, unless stated).
    HANDLER_ERROR = "HANDLER_ERROR"
    HANDLER_TIMEOUT = "HANDLER_TIMEOUT"
    HANDLER_PANIC = "HANDLER_PANIC"
    NON_RETRYABLE_ERROR = "NON_RETRYABLE_ERROR"
    JOB_CANCELLED = "JOB_CANCELLED"
    CANCELLED = "JOB_CANCELLED"  # alias

    # Validation errors (never retryable).
    INVALID_PAYLOAD = "INVALID_PAYLOAD"
    INVALID_JOB_TYPE = "INVALID_JOB_TYPE"
    UNKNOWN_JOB_TYPE = "INVALID_JOB_TYPE"  # alias: no handler registered for the type
    INVALID_ARGS = "INVALID_ARGS"

    # Resource errors.
    QUEUE_FULL = "QUEUE_FULL"

    # Binding-specific reasons (no canonical OJS code).
    UNROUTABLE = "UNROUTABLE"
    EXPIRED = "EXPIRED"
    DISCARDED = "DISCARDED"
    #: The handler raised :class:`DeadLetter`.
    DEAD_LETTER = "DEAD_LETTER"
    MAX_ATTEMPTS_EXCEEDED = "MAX_ATTEMPTS_EXCEEDED"
    #: Delivered ``Worker(max_deliveries=...)`` times without ever being settled: a worker
    #: died (or lost its connection) running it each time.
    WORKER_LOST = "WORKER_LOST"
