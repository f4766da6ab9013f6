"""Errors of the pure OJS job layer, and the OJS error codes the AMQP binding sends.

Everything here is local misuse or bad input, so every exception is a :class:`ValueError`:

* :class:`InvalidJobError` — a job envelope (or part of one) breaks the OJS schemas.
  ``field`` names the offending attribute as a path (``type``, ``retry.backoff_coefficient``,
  ``errors[2].attempt``); ``"<body>"`` means the bytes were not a JSON object at all.
* :class:`InvalidDurationError` — an ISO 8601 duration that we cannot use.
* :class:`TopologyError` — a topology request the broker would refuse or that would break
  the OJS naming scheme (quorum queue with priorities, a name longer than 255 bytes…).
* :class:`DelayOutOfRangeError` — a scheduling delay beyond what the delay levels cover.

:class:`ErrorCode` holds the codes that travel in ``x-ojs-error-code`` and in the
``errors[].code`` entries of the envelope.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "DelayOutOfRangeError",
    "ErrorCode",
    "InvalidDurationError",
    "InvalidJobError",
    "TopologyError",
]


class InvalidJobError(ValueError):
    """A job envelope is invalid; ``field`` is the path of the offending attribute."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)

    @property
    def code(self) -> ErrorCode:
        """The OJS error code a worker reports for such a body (``INVALID_PAYLOAD``)."""
        return ErrorCode.INVALID_PAYLOAD


class InvalidDurationError(ValueError):
    """An ISO 8601 duration string is malformed or has no fixed length (years, months)."""


class TopologyError(ValueError):
    """A queue, exchange or binding request that the broker or the OJS naming would refuse."""


class DelayOutOfRangeError(TopologyError):
    """A delay is negative or longer than the binary delay levels can express."""


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
    canonical OJS name: ``UNROUTABLE``, ``EXPIRED``, ``DISCARDED``, ``MAX_ATTEMPTS_EXCEEDED``.
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
    MAX_ATTEMPTS_EXCEEDED = "MAX_ATTEMPTS_EXCEEDED"
