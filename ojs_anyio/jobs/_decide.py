"""What to do with a delivered job once its handler has run: a pure, synchronous decision.

The worker runs a handler, then asks :func:`decide` what its result means (acknowledge,
retry after a delay, dead-letter with an error code, or the job was cancelled / abandoned),
and only then talks to the broker (:meth:`Worker._settle`).  Keeping the decision free of
I/O makes every branch testable as a table, without a broker (``tests/jobs/test_decide.py``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Final, Literal

from .._attempts import timeout_reason
from ._errors import ErrorCode
from ._retry import (
    EffectiveRetryPolicy,
    compute_delay_ms,
    error_type_name,
    is_retryable_error,
    ladder_delay_ms,
)
from ._verdicts import DeadLetter, Discard, Retry

__all__ = ["ABANDONED", "ACK", "CANCELLED", "Action", "Verdict", "decide", "dead_letter", "error_type"]

Action = Literal["ack", "retry", "dead_letter", "cancelled", "abandoned"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of one attempt, before anything is sent to the broker.

    * ``ack``: completed; acknowledge it.
    * ``retry``: republish it to the retry ladder with ``delay_ms`` (a ladder rung),
      ``code`` and ``message``, then acknowledge the original.
    * ``dead_letter``: dead-letter it with ``code`` and ``message``.
    * ``cancelled``: a CANCEL stopped it (or came before it started); acknowledge it.
    * ``abandoned``: the worker's grace period ran out; leave it unacknowledged.
    """

    action: Action
    code: ErrorCode | None = None
    message: str = ""
    delay_ms: int = 0
    #: The exception behind a failure (for the log's traceback and the OJS error object),
    #: its OJS error type and its message alone (``message`` is ``"{type}: {detail}"``).
    #: (Not part of the verdict's identity: two verdicts that act alike compare equal.)
    failure: BaseException | None = field(default=None, compare=False)
    error_type: str | None = field(default=None, compare=False)
    detail: str = field(default="", compare=False)


ACK: Final = Verdict("ack")
CANCELLED: Final = Verdict("cancelled")
ABANDONED: Final = Verdict("abandoned")


def dead_letter(code: ErrorCode, message: str) -> Verdict:
    return Verdict("dead_letter", code, message)


def decide(
    raised: BaseException | None,
    *,
    cancelled_caught: bool,
    cancel_requested: bool,
    abandoned: bool,
    timeout: float,
    policy: EffectiveRetryPolicy,
    attempt: int,
    max_attempts: int,
    rng: random.Random,
) -> Verdict:
    """The verdict on one handler run.

    ``raised`` is what the handler raised (``None`` when it returned; the worker's own
    cancellation never gets here).  ``cancelled_caught`` says the job's own scope was
    cancelled: by CANCEL when ``cancel_requested``, by the grace period when
    ``abandoned``, else by its deadline (a timeout).  ``rng`` draws the retry jitter.
    """
    if raised is None and not cancelled_caught:
        return ACK  # the common case first: a handler that returned in time
    if isinstance(raised, Discard):
        return dead_letter(ErrorCode.DISCARDED, raised.reason)
    if isinstance(raised, DeadLetter):
        return dead_letter(ErrorCode.DEAD_LETTER, raised.reason)
    failure: BaseException | None = raised
    if isinstance(raised, Retry):
        code, etype, message = ErrorCode.HANDLER_ERROR, "Retry", raised.reason or "handler asked for a retry"
        failure = None
    elif raised is None:  # the scope was cancelled (a returned handler was decided above)
        if cancel_requested:
            return CANCELLED
        if abandoned:
            return ABANDONED
        code, etype, message = (
            ErrorCode.HANDLER_TIMEOUT,
            "TimeoutError",
            timeout_reason(timeout),
        )
        # So that non_retryable_errors can name it (TimeoutError or "TimeoutError").
        failure = TimeoutError(message)
    elif isinstance(raised, Exception):
        code, etype, message = (
            ErrorCode.HANDLER_ERROR,
            error_type(raised),
            str(raised) or type(raised).__name__,
        )
    else:  # SystemExit, KeyboardInterrupt, GeneratorExit… from a handler
        code, etype, message = ErrorCode.HANDLER_PANIC, error_type(raised), repr(raised)
    retryable = code != ErrorCode.HANDLER_PANIC and (failure is None or is_retryable_error(policy, failure))
    if not retryable:
        code = ErrorCode.NON_RETRYABLE_ERROR if code == ErrorCode.HANDLER_ERROR else code
        return Verdict(
            "dead_letter", code, f"{etype}: {message}", failure=failure, error_type=etype, detail=message
        )
    if attempt >= max_attempts:
        text = f"{etype}: {message} (attempt {attempt} of {max_attempts}, retries exhausted)"
        return Verdict("dead_letter", code, text, failure=failure, error_type=etype, detail=message)
    if isinstance(raised, Retry) and raised.delay is not None:
        delay_ms = max(1, int(raised.delay * 1000))
    else:
        delay_ms = compute_delay_ms(policy, attempt, rng)
    ladder_ms = ladder_delay_ms(delay_ms, max_ms=max(policy.max_interval_ms, delay_ms))
    return Verdict(
        "retry",
        code,
        f"{etype}: {message}",
        delay_ms=ladder_ms,
        failure=failure,
        error_type=etype,
        detail=message,
    )


def error_type(exc: BaseException) -> str:
    """The error type OJS reports and ``non_retryable_errors`` matches: the qualified class
    name, without the module for builtins and ``__main__``."""
    return error_type_name(type(exc))
