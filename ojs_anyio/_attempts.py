"""The attempt-number rule shared by the job worker and the event subscriber.  Pure.

A consumer reads the attempt a delivery runs as from a header that any client of the vhost
can write (``x-ojs-attempt``, ``x-event-attempt``), so the header is validated, never
trusted: absent or 0 means 1 (the OJS envelope counts attempts from 0, so another
implementation may send 0 for a first attempt); an integer of any AMQP type, or a string
of at most ten decimal digits, from 1 to :data:`MAX_ATTEMPT` is taken as it is; anything
else is refused with :class:`HeaderValueError` (a ``ValueError``: remote input, not a
local misuse), and the consumer dead-letters the delivery as
invalid without running it.  :data:`MAX_ATTEMPT` leaves room for the next attempt's
number in an int32 header.

Also the one wording of an attempt that ran past its timeout (:func:`timeout_reason`), the
job layer's ``HANDLER_TIMEOUT`` message and the event bus's ``HandlerTimeoutError``: here
rather than in ``_pipeline`` (which runs handlers, so imports anyio) because the job
layer's pure ``decide()`` words it too.
"""

from __future__ import annotations

from typing import Final

__all__ = ["MAX_ATTEMPT", "HeaderValueError", "header_number", "parse_attempt", "timeout_reason"]

#: The highest attempt a delivery may carry: a retry writes attempt + 1 as int32.
MAX_ATTEMPT: Final = 2**31 - 2


class HeaderValueError(ValueError):
    """A header that a peer wrote holds no valid number (the delivery is dead-lettered)."""


def header_number(value: object) -> int | None:
    """A header's integer value: ``None`` if absent (``None``); an int of any AMQP type,
    or a string (or bytes) of at most ten decimal digits; else :class:`HeaderValueError`."""
    if value is None:
        return None
    if value.__class__ is int:  # the usual case, told without a call
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 10:
        return int(value)
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    raise HeaderValueError(f"{shown} ({type(value).__name__}) is not an integer")


def parse_attempt(value: object) -> int:
    """The attempt number a header value stands for (see the module docstring)."""
    if value is None:  # absent (most first attempts): told without a call
        return 1
    if value.__class__ is int and 1 <= value <= MAX_ATTEMPT:  # likewise, the usual int
        return value
    number = header_number(value)
    if number is None or number == 0:
        return 1
    if not 1 <= number <= MAX_ATTEMPT:
        raise HeaderValueError(f"{number} is not an attempt number (0 or 1 to {MAX_ATTEMPT})")
    return number


def timeout_reason(seconds: float) -> str:
    """Why an attempt failed when it ran past its timeout of ``seconds``."""
    return f"handler exceeded its timeout of {seconds:g}s"
