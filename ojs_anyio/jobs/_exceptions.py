"""Errors of the job runtime (producer, worker, dead letters), and the handler's verdicts."""

from __future__ import annotations

from typing import Any

from ojs_anyio.amqp import AMQPError

__all__ = [
    "DeadLetter",
    "Discard",
    "JobError",
    "PushError",
    "PushOutcomeUnknownError",
    "QueueFullError",
    "Retry",
    "SchedulerUnavailableError",
    "TopologyConflictError",
    "UnroutableJobError",
]


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


class PushOutcomeUnknownError(PushError):
    """The connection or channel failed before the broker confirmed the push.

    The job may or may not be enqueued; pushing it again may duplicate it.
    """

    code = "OUTCOME_UNKNOWN"


class TopologyConflictError(JobError):
    """A queue exists with other arguments than ours (PRECONDITION_FAILED on declare)."""

    def __init__(self, message: str, *, queue: str, ours: dict[str, Any], broker_text: str) -> None:
        self.queue = queue
        self.ours = ours
        self.broker_text = broker_text
        super().__init__(message)


class SchedulerUnavailableError(JobError):
    """``scheduler="plugin"`` was asked for, and the broker has no delayed-message-exchange plugin."""


class _Verdict(Exception):
    """Raised by a handler to decide the job's fate explicitly."""

    def __init__(self, reason: str = "") -> None:
        self.reason = reason
        super().__init__(reason)


class Retry(_Verdict):
    """``raise ojs.Retry("busy", delay=30)``: retry now-ish (``delay`` seconds, on the ladder),
    if the policy still allows an attempt; otherwise dead-letter."""

    def __init__(self, reason: str = "", *, delay: float | None = None) -> None:
        self.delay = delay
        super().__init__(reason)


class Discard(_Verdict):
    """``raise ojs.Discard("spam")``: give up on the job; it goes to the DLQ with code DISCARDED."""


class DeadLetter(_Verdict):
    """``raise ojs.DeadLetter("needs a human")``: send the job to the DLQ now."""
