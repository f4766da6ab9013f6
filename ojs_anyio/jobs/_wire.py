"""Mapping a job to an AMQP message and back (001 §6).

Properties: ``message_id`` = id, ``type`` = job type, ``content_type``
``application/openjobspec+json``, ``content_encoding`` ``utf-8``, ``timestamp`` =
``created_at`` (whole seconds), ``delivery_mode`` 2, ``app_id`` ``ojs``, ``priority``
only when the job has one (0..9 kept, others clamped), ``correlation_id`` from
``meta.correlation_id`` when present.

Headers (``x-ojs-*``): queue, attempt and max-attempts (int32), created-at, enqueued-at,
scheduled-at, tags, idempotency-key, and the trace context.  ``x-ojs-attempt`` is the
1-based number of the attempt the message will run as.  Every message the library writes
carries the two attempt headers as int32 (type ``I``): a decoded header is a plain
``int``, which the codec would re-encode in the smallest type, so republishing goes
through :func:`with_headers`, which re-types them.
"""

from __future__ import annotations

import math
import time
from datetime import datetime
from typing import Any, Final

import msgspec
from msgspec import UNSET

from ojs_anyio.amqp import BasicProperties, Int32

from .._attempts import header_number, parse_attempt
from .._common import utc_second
from ._envelope import Job, encode_job, parse_timestamp
from ._errors import InvalidJobError
from ._retry import RetryPolicy
from ._route import Route
from ._topology import priority_to_amqp

__all__ = [
    "job_message",
    "CONTENT_TYPE",
    "H_ATTEMPT",
    "H_CREATED_AT",
    "H_DEAD_LETTER",
    "H_DEAD_LETTERED_AT",
    "H_ENQUEUED_AT",
    "H_ERROR_CODE",
    "H_ERROR_MESSAGE",
    "H_IDEMPOTENCY_KEY",
    "H_MAX_ATTEMPTS",
    "H_ORIGINAL_PRIORITY",
    "H_QUEUE",
    "H_SCHEDULED_AT",
    "H_TAGS",
    "H_TRACEPARENT",
    "H_TRACE_ID",
    "H_TRACE_STATE",
    "H_DELIVERY_COUNT",
    "H_UNKNOWN_TYPE_SINCE",
    "H_UNSETTLED",
    "unsettled_deliveries",
    "header_attempt",
    "header_int",
    "header_max_attempts",
    "H_ERRORS",
    "header_since",
    "with_headers",
]

CONTENT_TYPE: Final = "application/openjobspec+json"
H_QUEUE: Final = "x-ojs-queue"
H_ATTEMPT: Final = "x-ojs-attempt"
H_MAX_ATTEMPTS: Final = "x-ojs-max-attempts"
H_CREATED_AT: Final = "x-ojs-created-at"
H_ENQUEUED_AT: Final = "x-ojs-enqueued-at"
H_SCHEDULED_AT: Final = "x-ojs-scheduled-at"
H_TAGS: Final = "x-ojs-tags"
H_TRACE_ID: Final = "x-ojs-trace-id"  # 001 §6.2: the traceparent value
H_TRACEPARENT: Final = "x-ojs-traceparent"  # the summary page's name, written too
H_TRACE_STATE: Final = "x-ojs-trace-state"
H_IDEMPOTENCY_KEY: Final = "x-ojs-idempotency-key"
H_ERROR_CODE: Final = "x-ojs-error-code"
H_ERROR_MESSAGE: Final = "x-ojs-error-message"
#: The job's error history (OJS retry spec: at least the last 10): a JSON array of
#: ``{"code", "message", "type", "attempt", "at"}``, oldest first, written by each retry.
H_ERRORS: Final = "x-ojs-errors"
#: Written by earlier versions on a dead job's copy put back on the job queue (no longer
#: done); still stripped by ``DeadLetters.requeue`` and rejected unrun by the worker.
H_DEAD_LETTER: Final = "x-ojs-dead-letter"
H_ORIGINAL_PRIORITY: Final = "x-ojs-original-priority"
#: When the worker dead-lettered a job in the opt-in annotated mode (ISO 8601).
H_DEAD_LETTERED_AT: Final = "x-ojs-dead-lettered-at"
#: How many deliveries of the job ended without a settlement before this copy was published
#: (the worker's own count: Worker(max_deliveries=...)).
H_UNSETTLED: Final = "x-ojs-unsettled-deliveries"
#: RabbitMQ's count of a quorum queue message's earlier deliveries (dropped from copies).
H_DELIVERY_COUNT: Final = "x-delivery-count"
#: When a worker first met a job whose type it had no handler for (epoch milliseconds,
#: int64): the start of the unknown-type grace window (Worker(unknown_type_grace=...)).
H_UNKNOWN_TYPE_SINCE: Final = "x-ojs-unknown-type-since"


def _tags(meta: dict[str, Any]) -> str | None:
    tags = meta.get("tags")
    if isinstance(tags, list | tuple) and tags:
        return ",".join(str(t) for t in tags)
    if isinstance(tags, str) and tags:
        return tags
    return None


def job_message(
    job: Job,
    route: Route,
    *,
    enqueued_at: str,
    idempotency_key: str | None,
    reply_to: str | None,
    trace_headers: dict[str, str] | None,
) -> tuple[BasicProperties, bytes]:
    """The properties (001 §6.1, §6.2) and body a job is published with along ``route``.  No I/O.

    ``enqueued_at`` is the moment's text (``format_timestamp``): a push formats it once,
    for the job it returns and for this header.  ``x-ojs-max-attempts`` only when the job
    itself set it: a job without its own ``max_attempts`` carries none, and the worker's
    policy decides (docs/jobs.md)."""
    # (Hot: every push.  An unset attribute is told by ``is UNSET``, without a call.)
    created = job.created_at
    if created is UNSET or not isinstance(created, str):
        created = enqueued_at
    headers: dict[str, Any] = {
        H_QUEUE: job.queue,
        H_ATTEMPT: _FIRST_ATTEMPT,
        H_CREATED_AT: created,
        H_ENQUEUED_AT: enqueued_at,
    }
    retry = job.retry
    if retry is not UNSET and isinstance(retry, RetryPolicy) and isinstance(retry.max_attempts, int):
        headers[H_MAX_ATTEMPTS] = _int32(retry.max_attempts)
    if job.scheduled_at is not UNSET and isinstance(job.scheduled_at, str):
        headers[H_SCHEDULED_AT] = job.scheduled_at
    meta = job.meta
    correlation_id = None
    if meta is not UNSET and isinstance(meta, dict):
        tags = _tags(meta)
        if tags is not None:
            headers[H_TAGS] = tags
        correlation_id = meta.get("correlation_id")
    if idempotency_key is not None:
        headers[H_IDEMPOTENCY_KEY] = idempotency_key
    if trace_headers:
        headers.update(trace_headers)
    if route.headers:  # x-delay (the plugin's)
        headers.update(route.headers)
    props = BasicProperties(
        message_id=job.id,
        type=job.type,
        content_type=CONTENT_TYPE,
        content_encoding="utf-8",
        timestamp=_whole_second_of(created),
        delivery_mode=2,
        app_id="ojs",
        # Only when the job has one (001 §6.1 "if specified"): unprioritised jobs stay FIFO
        # with each other, whoever published them.
        priority=None if job.priority is UNSET else priority_to_amqp(job.priority),
        correlation_id=correlation_id if isinstance(correlation_id, str) and correlation_id else None,
        reply_to=reply_to,
        headers=headers,
    )
    return props, encode_job(job)


# Int32 values are immutable: the few attempt counts in use are built once.
_INT32: dict[int, Int32] = {}


def _int32(value: int) -> Int32:
    found = _INT32.get(value)
    if found is None:
        found = Int32(value)
        if len(_INT32) < 256:
            _INT32[value] = found
    return found


#: ``x-ojs-attempt`` of a job's first message (every push's).
_FIRST_ATTEMPT: Final = _int32(1)


class _CreatedSecond:
    """The last canonical ``created_at`` second ("2026-02-15T10:30:00" of a ".mmmZ" text)
    and its datetime: pushes in the same second share it, so the text is parsed once a
    second."""

    __slots__ = ("text", "value")

    def __init__(self) -> None:
        self.text = ""
        self.value = utc_second(0)


_created_second: Final = _CreatedSecond()


def _whole_second_of(created: str) -> datetime:
    """The AMQP ``timestamp`` of a job: its ``created_at`` second (one datetime object per
    second, ``_common.utc_second``'s); the push's second if the text does not parse."""
    last = _created_second
    canonical = len(created) == 24 and created[19] == "." and created[23] == "Z"
    if canonical and created[:19] == last.text:
        return last.value
    try:
        moment = parse_timestamp(created)
    except ValueError:
        return utc_second(int(time.time()))
    result = utc_second(math.floor(moment.timestamp()))
    if canonical:
        last.text = created[:19]
        last.value = result
    return result


def with_headers(
    props: BasicProperties,
    updates: dict[str, Any],
    *,
    drop: tuple[str, ...] = (),
    base: dict[str, Any] | None = None,
) -> BasicProperties:
    """A copy of ``props`` with headers updated; every other property kept (001 §8.3).

    ``base`` replaces the original headers as the starting point (before ``drop`` and
    ``updates`` apply).  ``x-ojs-attempt`` and ``x-ojs-max-attempts`` come out as int32
    whatever type they had (OJS AMQP binding §6.2), when they hold an integer."""
    headers = dict(base if base is not None else (props.headers or {}))
    for key in drop:
        headers.pop(key, None)
    headers.update(updates)
    for key in _INT32_HEADERS:
        value = headers.get(key)
        if value.__class__ is int and -(2**31) <= value < 2**31:
            headers[key] = _int32(value)
    return msgspec.structs.replace(props, headers=headers)


_INT32_HEADERS: Final = (H_ATTEMPT, H_MAX_ATTEMPTS)


def header_attempt(headers: dict[str, Any] | None) -> int:
    """The attempt a delivery runs as, from ``x-ojs-attempt`` (the rule of
    :mod:`ojs_anyio._attempts`); a value outside it raises :class:`InvalidJobError`: the
    worker dead-letters such a delivery as ``INVALID_PAYLOAD`` without running it."""
    try:
        return parse_attempt(headers.get(H_ATTEMPT) if headers else None)
    except ValueError as exc:
        raise InvalidJobError(H_ATTEMPT, str(exc)) from None


def header_max_attempts(headers: dict[str, Any] | None, default: int) -> int:
    """``x-ojs-max-attempts`` (ruling 17: binding when present), else ``default``.

    1 to 2**31 - 1; anything else raises :class:`InvalidJobError` (``INVALID_PAYLOAD``)."""
    value = headers.get(H_MAX_ATTEMPTS) if headers else None
    if value is None:  # absent (most jobs): told without a call
        return default
    try:
        value = header_number(value)
    except ValueError as exc:
        raise InvalidJobError(H_MAX_ATTEMPTS, str(exc)) from None
    if value is None:
        return default
    if not 1 <= value < 2**31:
        raise InvalidJobError(H_MAX_ATTEMPTS, f"{value} is not a number of attempts (1 to {2**31 - 1})")
    return value


def unsettled_deliveries(headers: dict[str, Any] | None) -> int:
    """How many earlier deliveries of this job ended without a settlement, as counted on
    the copies the worker publishes (``x-ojs-unsettled-deliveries``); 0 if absent or not a
    count.  (RabbitMQ's ``x-delivery-count`` of quorum queues is not used: it also counts
    jobs that merely sat beside the one that killed their worker.)"""
    kept = headers.get(H_UNSETTLED) if headers else None
    return kept if isinstance(kept, int) and not isinstance(kept, bool) and 0 <= kept < 2**31 else 0


def header_since(headers: dict[str, Any] | None, key: str, now_ms: int) -> int:
    """An epoch-milliseconds header, never later than ``now_ms`` (its value if absent or
    not an integer): a time in the future could otherwise hold a window open."""
    value = headers.get(key) if headers else None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= now_ms:
        return value
    return now_ms


def header_int(headers: dict[str, Any] | None, key: str, default: int) -> int:
    """An integer header (any AMQP integer type, or a numeric string); ``default`` if absent."""
    if not headers:
        return default
    value = headers.get(key)
    if isinstance(value, bool) or value is None:
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, bytes | str):
        try:
            return int(value)
        except ValueError:
            return default
    return default
