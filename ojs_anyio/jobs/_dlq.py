"""Dead-letter message helpers: how a dead job is put back, when and why it died.

Used by ``ojs-anyio dlq`` (``ojs_anyio/_cli``), which moves dead jobs one at a time so an
interrupted requeue neither loses nor doubles one.  Pure functions, no I/O.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec

from .._dead_letter_queue import DEATH_CLOCK_SKEW, latest_death
from .._dead_letter_queue import died_at as shared_died_at
from ..amqp import BasicProperties, Int32
from ._envelope import format_timestamp, parse_timestamp
from ._failures import H_ERROR_BACKTRACE, H_ERROR_TYPE
from ._topology import strip_dead_letter_headers
from ._wire import (
    H_ATTEMPT,
    H_DEAD_LETTER,
    H_ENQUEUED_AT,
    H_ERROR_CODE,
    H_ERROR_MESSAGE,
    H_MAX_ATTEMPTS,
    H_ORIGINAL_PRIORITY,
    H_SCHEDULED_AT,
    header_int,
    with_headers,
)

__all__ = ["DEATH_CLOCK_SKEW", "death_reason", "died_at", "requeue_properties"]

_DEAD_LETTERED_AT = "x-ojs-dead-lettered-at"


def requeue_properties(
    props: BasicProperties, *, reset_attempts: bool = True, now: datetime | None = None
) -> BasicProperties:
    """The properties to republish a dead job with, to its job queue.

    The job keeps its id and body.  RabbitMQ's ``x-death`` family, the death reason and
    our dead-letter markers are dropped (a republished message that still carries
    ``x-death`` may be dropped as a dead-letter cycle), ``x-ojs-enqueued-at`` is now, and a
    priority raised for the dead-letter hop is given back.  ``reset_attempts``: the job
    starts again at attempt 1; otherwise it keeps its attempt (so an exhausted job gets
    one more try before it is dead-lettered again).
    """
    headers = props.headers or {}
    attempt = 1 if reset_attempts else max(1, header_int(headers, H_ATTEMPT, 1))
    updates: dict[str, Any] = {
        H_ATTEMPT: Int32(attempt),
        H_ENQUEUED_AT: format_timestamp(now or datetime.now(UTC)),
    }
    if H_MAX_ATTEMPTS in headers:
        updates[H_MAX_ATTEMPTS] = Int32(header_int(headers, H_MAX_ATTEMPTS, 1))
    out = with_headers(
        props,
        updates,
        drop=(
            H_DEAD_LETTER, H_ERROR_CODE, H_ERROR_MESSAGE, H_SCHEDULED_AT,
            H_ORIGINAL_PRIORITY, _DEAD_LETTERED_AT, H_ERROR_TYPE, H_ERROR_BACKTRACE,
        ),
        base=strip_dead_letter_headers(headers),
    )  # fmt: skip
    original = headers.get(H_ORIGINAL_PRIORITY)
    if isinstance(original, int) and not isinstance(original, bool) and 0 <= original <= 255:
        out = msgspec.structs.replace(out, priority=original)
    return out


def died_at(props: BasicProperties, *, now: datetime | None = None) -> datetime | None:
    """When the job was dead-lettered, in UTC, or None when that is unknown.

    Our ``x-ojs-dead-lettered-at`` (an annotated copy: the worker's time; any ``x-death``
    it carries is from an earlier hop, such as a retry queue), else RabbitMQ's latest
    ``x-death`` time, else the message's ``timestamp`` (when it was created).

    A time is unusable when it does not parse, when a ``datetime`` cannot hold it
    (``9999-12-31T23:59:60Z`` is in year 10000), or when it is more than
    :data:`DEATH_CLOCK_SKEW` ahead of ``now`` (default: the current time).  An unusable
    ``x-ojs-dead-lettered-at`` falls back to the ``x-death`` time only, never to the
    creation time, so a bad stamp never makes a job look older than it is: with no
    ``x-death`` the time is unknown (None), and ``prune`` keeps the job."""
    return shared_died_at(props, _DEAD_LETTERED_AT, parse_timestamp, now=now)


def death_reason(props: BasicProperties, *, final: tuple[str, str] | None = None) -> str:
    """Why the job died: the OJS error code and message when the message carries them (or
    ``final``, the code and message of the worker's death note), else RabbitMQ's reason
    (``rejected``, ``expired``, ``maxlen``...)."""
    headers = props.headers or {}
    code, message = final or (headers.get(H_ERROR_CODE), headers.get(H_ERROR_MESSAGE))
    death = latest_death(headers)
    broker = f"{death.get('reason')}" if death is not None and death.get("reason") else None
    parts = [p for p in (code, message) if isinstance(p, str) and p]
    if parts:
        text = ": ".join(parts)
        return f"{text} ({broker})" if broker and broker != "rejected" else text
    return broker or "-"
