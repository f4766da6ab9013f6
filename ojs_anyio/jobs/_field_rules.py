"""The job envelope's field rules that are plain functions of one value: the patterns of
job.schema.json (ids, types, queue names, URIs), the words of their errors, and the checks
of the values that recur on every job (timestamps, types, queue names), memoized.

Pure: no I/O, no clock.  ``_envelope.py`` applies them (its structs' ``__post_init__``);
``_build.py`` and ``_topology.py`` ask the same questions here.
"""

from __future__ import annotations

import re
from typing import Final

from msgspec import UnsetType

from ._errors import ArgumentTypeError, InvalidJobError
from ._timestamps import TIMESTAMP_PATTERN, match_timestamp

__all__ = [
    "ID_PATTERN",
    "PATTERN_HINTS",
    "QUEUE_PATTERN",
    "TYPE_PATTERN",
    "URI_PATTERN",
    "check_job_id",
    "check_job_type",
    "check_timestamp",
    "id_shaped",
    "known_queue",
    "known_type",
    "valid_timestamps",
]

# Patterns from job.schema.json, anchored with \Z (``$`` would let a trailing newline through).
ID_PATTERN: Final = r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\Z"
TYPE_PATTERN: Final = r"^[a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)*\Z"
QUEUE_PATTERN: Final = r"^[a-z0-9][a-z0-9\-\.]*\Z"
URI_PATTERN: Final = r"^[A-Za-z][A-Za-z0-9+.\-]*:\S*\Z"

PATTERN_HINTS: Final = {
    ID_PATTERN: "a lowercase UUIDv7 (8-4-4-4-12 hex, version 7, variant 8/9/a/b)",
    TYPE_PATTERN: "dot-separated segments of [a-z][a-z0-9_]* (e.g. 'email.send')",
    QUEUE_PATTERN: "lowercase [a-z0-9][a-z0-9.-]* (e.g. 'email', 'billing.invoices')",
    TIMESTAMP_PATTERN: "an RFC 3339 timestamp with a timezone (e.g. '2026-02-15T10:30:00.000Z')",
    URI_PATTERN: "a URI (e.g. 'urn:ojs:schema:email.send:v1')",
}


# Timestamp texts that passed the check (a pure function of the text): jobs built in the
# same millisecond carry equal ``created_at`` and ``enqueued_at`` strings, so under load the
# regex runs about twice a millisecond, not twice a job.  Bounded: emptied when full.
valid_timestamps: set[str] = set()
_VALID_TIMESTAMPS_MAX: Final = 256


def check_timestamp(field: str, value: str | UnsetType) -> None:
    if (value.__class__ is str and value in valid_timestamps) or not isinstance(value, str):
        return
    try:
        match_timestamp(value)
    except ValueError as exc:
        raise InvalidJobError(field, str(exc)) from None
    if len(valid_timestamps) >= _VALID_TIMESTAMPS_MAX:
        valid_timestamps.clear()
    valid_timestamps.add(value)


_ID_RE: Final = re.compile(ID_PATTERN)
_TYPE_RE: Final = re.compile(TYPE_PATTERN)
_QUEUE_RE: Final = re.compile(QUEUE_PATTERN)
# Job types and queue names seen valid (a few per application): checked once each.
_GOOD_TYPES: Final[set[str]] = set()
_GOOD_QUEUES: Final[set[str]] = set()
_GOOD_MAX: Final = 4096


def _known(value: object, seen: set[str], pattern: re.Pattern[str], max_length: int) -> bool:
    """Whether ``value`` is a str of 1 to ``max_length`` characters matching ``pattern``
    (remembered in ``seen`` once it was)."""
    if value in seen:
        return True
    if type(value) is not str or not 0 < len(value) <= max_length or pattern.fullmatch(value) is None:
        return False
    if len(seen) >= _GOOD_MAX:
        seen.clear()
    seen.add(value)
    return True


def known_type(value: object) -> bool:
    """Whether ``value`` is a valid job type: a str of dot-separated lowercase segments, at
    most 255 characters (remembered once seen)."""
    return _known(value, _GOOD_TYPES, _TYPE_RE, 255)


def known_queue(value: object) -> bool:
    """Whether ``value`` is a valid queue name: a str of lowercase ``[a-z0-9][a-z0-9.-]*``,
    at most 128 characters (remembered once seen)."""
    return _known(value, _GOOD_QUEUES, _QUEUE_RE, 128)


def id_shaped(value: object) -> bool:
    """Whether ``value`` is a str of a job id's form (a lowercase UUIDv7); not memoized:
    every job has its own."""
    return isinstance(value, str) and _ID_RE.fullmatch(value) is not None


def check_job_id(job_id: object, what: str = "job_id") -> str:
    """``job_id`` when it can be an OJS job id, which job.schema.json makes a lowercase
    UUIDv7: every id a conforming producer sends, and no other (a worker of ours
    dead-letters a job with any other id as ``INVALID_PAYLOAD``, so it never runs).
    Raises :class:`InvalidJobError` naming ``what``, or :class:`ArgumentTypeError` for a
    non-str."""
    if not isinstance(job_id, str):
        raise ArgumentTypeError(f"{what} must be a str, not {type(job_id).__name__}")
    if not id_shaped(job_id):
        raise InvalidJobError(what, f"{job_id!r} cannot be a job id: it must be {PATTERN_HINTS[ID_PATTERN]}")
    return job_id


def check_job_type(job_type: str) -> None:
    """Refuse a job type the envelope would refuse (lowercase dotted segments, at most 255
    characters), with the envelope's error: at registration, not at the first push."""
    if not known_type(job_type):
        raise InvalidJobError(
            "type",
            f"{job_type!r} is not an OJS job type (lowercase dot-separated segments such as "
            f"'email.send', at most 255 characters; pattern {TYPE_PATTERN})",
        )
