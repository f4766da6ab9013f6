"""Handler verdicts: exceptions a handler raises to decide its job's fate explicitly.

Not errors (a handler raises them on purpose), so they live apart from ``_errors``.
"""

from __future__ import annotations

from datetime import timedelta

from ._durations import duration_seconds

__all__ = ["DeadLetter", "Discard", "Retry"]


class _Verdict(Exception):
    """Raised by a handler to decide the job's fate explicitly."""

    def __init__(self, reason: str = "") -> None:
        self.reason = reason
        super().__init__(reason)


class Retry(_Verdict):
    """``raise ojs.Retry("busy", delay=30)``: retry now-ish (``delay``: seconds, a timedelta or
    an ISO 8601 duration, put on the ladder), if the policy still allows an attempt;
    otherwise dead-letter.  ``delay`` is kept in seconds."""

    def __init__(self, reason: str = "", *, delay: float | timedelta | str | None = None) -> None:
        self.delay = None if delay is None else duration_seconds(delay, "Retry(delay=...)")
        super().__init__(reason)


class Discard(_Verdict):
    """``raise ojs.Discard("spam")``: give up on the job; it goes to the DLQ with code DISCARDED."""


class DeadLetter(_Verdict):
    """``raise ojs.DeadLetter("needs a human")``: send the job to the DLQ now."""
