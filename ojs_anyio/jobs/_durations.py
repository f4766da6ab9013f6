"""One way to give a duration, everywhere the library takes one.

Every option that takes a duration (``Worker(grace_period=…, default_timeout=…,
heartbeat_interval=…)``, ``push(delay=…, timeout=…)``, ``Retry(delay=…)``,
``client.info(timeout=…)``, ``RetryPolicy(initial_interval=…, max_interval=…)``,
``DeadLetters.prune(older_than=…)``, ``push(idempotency_window=…)``,
``Scheduler(misfire_grace=…, token_refresh=…, retry_delay=…)``) accepts the same three forms:

* a number of seconds (``int`` or ``float``; ``2.5`` is two and a half seconds);
* a :class:`datetime.timedelta`;
* an ISO 8601 duration string, as OJS writes them (``"PT2.5S"``, ``"PT5M"``, ``"P1DT2H"``;
  weeks and days allowed, years and months refused because their length varies).

Anything else (``True``, a negative or infinite number, ``"5s"``) raises :class:`TypeError`
or :class:`ValueError` naming the option and the accepted forms.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import TypeAlias

from ojs_anyio.amqp import UsageError

from ._errors import ArgumentTypeError, InvalidDurationError
from ._iso_duration import format_duration_ms, parse_duration_ms

__all__ = ["DurationLike", "duration_ms", "duration_seconds", "duration_text"]

#: What a duration option accepts: seconds, a timedelta, or an ISO 8601 duration string.
DurationLike: TypeAlias = "float | int | timedelta | str"

_FORMS = "a number of seconds (2.5), a datetime.timedelta, or an ISO 8601 duration string ('PT2.5S')"


def duration_seconds(value: object, name: str, *, allow_zero: bool = True) -> float:
    """``value`` (one of the accepted forms) in seconds, as a float.

    ``name`` is the option's name, used in the error.  Negative, infinite and NaN values
    are refused, and so is zero unless ``allow_zero``.
    """
    if isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be {_FORMS}, not a bool ({value!r})")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, str):
        try:
            seconds = parse_duration_ms(value) / 1000
        except InvalidDurationError as exc:
            raise UsageError(f"{name}: {exc}; accepted forms: {_FORMS}") from None
    else:
        raise ArgumentTypeError(f"{name} must be {_FORMS}, not {type(value).__name__} ({value!r})")
    if math.isnan(seconds) or math.isinf(seconds):
        raise UsageError(f"{name} must be a finite duration, got {value!r}")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise UsageError(f"{name} must be {'positive' if not allow_zero else 'zero or more'}, got {value!r}")
    return seconds


def duration_ms(value: object, name: str, *, allow_zero: bool = True) -> int:
    """``value`` in whole milliseconds (rounded to the nearest)."""
    return round(duration_seconds(value, name, allow_zero=allow_zero) * 1000)


def duration_text(value: object, name: str, *, allow_zero: bool = True) -> str:
    """``value`` as a canonical ISO 8601 duration (``2.5`` -> ``"PT2.5S"``).

    An ISO 8601 string comes back unchanged (after checking it), so what a user wrote
    is what travels in a job's envelope.
    """
    ms = duration_ms(value, name, allow_zero=allow_zero)
    return value if isinstance(value, str) else format_duration_ms(ms)
