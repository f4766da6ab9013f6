"""The OJS job envelope (``job.schema.json``) as msgspec Structs, with JSON decode and encode.

Pure: no I/O, no clock.  Building a new job (:func:`new_job`, the memo in front of the one
validator here) is ``_build.py``; RFC 3339 timestamps are ``_timestamps.py``; the rules of
one field (patterns, the memoized checks of timestamps, types and queue names, the id and
type checks) are ``_field_rules.py``.

Absent is not the same as default
    Every optional attribute defaults to ``UNSET`` and is left out on encode, so a decoded
    envelope re-encodes to the same JSON (as parsed values): ``"meta": {}`` stays, a missing
    ``meta`` stays missing.  The ``effective_*`` methods give the value with the OJS default.

Unknown attributes are kept (OJS JSON format §9.2, §14.3)
    Top-level keys the schema does not define land in :attr:`Job.extensions` and are written
    back at the top level by :func:`encode_job`; likewise for extra keys of an ``errors[]``
    entry (the schema allows them).  ``retry``, ``unique`` and ``error`` forbid extra keys,
    as their schemas do (``additionalProperties: false``); ``retry`` additionally accepts
    the ``backoff_strategy`` extension of OJS retry §3.

Explicit nulls
    An optional attribute set to ``null`` is treated as absent (OJS JSON format §14.2), so
    it is dropped on re-encode.  ``result: null`` is a value and is kept.  ``args: null`` is
    invalid.

Errors
    Anything invalid raises :class:`InvalidJobError` whose ``field`` is the path of the
    offending attribute: ``type``, ``retry.backoff_coefficient``, ``unique.meta_keys``,
    ``errors[1].occurred_at``; ``"<body>"`` when the bytes are not a JSON object.

Beyond the schemas we also check: timestamps are real calendar instants; durations are
usable (see :func:`parse_duration_ms`); the effective retry policy has
``max_interval >= initial_interval`` after merging with the defaults (OJS retry §11.1);
``priority`` may be any integer, as the schema allows (the AMQP mapping clamps it to 0..9).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal, get_args

import msgspec
from msgspec import UNSET, Meta, UnsetType

from .._common import new_id
from ._errors import InvalidDurationError, InvalidJobError
from ._field_rules import (
    ID_PATTERN,
    PATTERN_HINTS,
    QUEUE_PATTERN,
    TYPE_PATTERN,
    URI_PATTERN,
    check_job_id,
    check_timestamp,
    known_queue,
    known_type,
    valid_timestamps,
)
from ._retry import Duration, EffectiveRetryPolicy, RetryPolicy, resolve_retry, validate_duration_syntax
from ._timestamps import format_timestamp, parse_timestamp

__all__ = [
    "ID_PATTERN",
    "JOB_FIELDS",
    "QUEUE_PATTERN",
    "TYPE_PATTERN",
    "JOB_STATES",
    "SPEC_VERSION",
    "ErrorInfo",
    "ErrorRecord",
    "Job",
    "JobState",
    "UniquePolicy",
    "check_job_id",
    "decode_job",
    "encode_job",
    "format_timestamp",
    "job_from_dict",
    "job_to_dict",
    "parse_timestamp",
    "validate_job",
]

SPEC_VERSION: Final = "1.0"

JobState = Literal[
    "scheduled", "available", "pending", "active", "completed", "retryable", "cancelled", "discarded"
]
JOB_STATES: Final[tuple[str, ...]] = get_args(JobState)

NonEmptyStr = Annotated[str, Meta(min_length=1)]
JobId = Annotated[str, Meta(pattern=ID_PATTERN)]
Uri = Annotated[str, Meta(pattern=URI_PATTERN)]
# Timestamps, job types and queue names are checked by the structs' __post_init__, not by
# the decoder: a few distinct values recur on every job, and a memo of the ones already
# seen valid spares the regex (the decoder would run three to four per job: about 3 µs,
# most of a job's decoding).  Job ids are unique, so the decoder checks them.
Timestamp = str
JobType = str
QueueName = str

def _check_unique_items(field: str, items: tuple[Any, ...] | UnsetType) -> None:
    if isinstance(items, tuple) and len(set(items)) != len(items):
        raise InvalidJobError(field, "items must be unique")


class ErrorInfo(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """The job's last error (``error.schema.json``)."""

    type: NonEmptyStr
    message: NonEmptyStr
    backtrace: Annotated[tuple[str, ...], Meta(max_length=50)] | UnsetType = UNSET


class ErrorRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    """One entry of the job's ``errors`` history; unknown keys go to ``extensions``."""

    code: NonEmptyStr
    message: NonEmptyStr
    attempt: Annotated[int, Meta(ge=1)]
    occurred_at: Timestamp
    type: str | UnsetType = UNSET
    #: Keys the schema does not define; written back beside the others.
    extensions: dict[str, Any] = {}

    def __post_init__(self) -> None:
        check_timestamp("occurred_at", self.occurred_at)
        _check_extensions(self.extensions, _RECORD_FIELDS)


UniqueKey = Literal["type", "queue", "args", "meta"]
OnConflict = Literal["reject", "replace", "replace_except_schedule", "ignore"]


class UniquePolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """A uniqueness policy (``unique-policy.schema.json``); every field may be absent."""

    keys: tuple[UniqueKey, ...] | UnsetType = UNSET
    args_keys: tuple[NonEmptyStr, ...] | UnsetType = UNSET
    meta_keys: Annotated[tuple[NonEmptyStr, ...], Meta(min_length=1)] | UnsetType = UNSET
    period: Duration | UnsetType = UNSET
    states: tuple[JobState, ...] | UnsetType = UNSET
    on_conflict: OnConflict | UnsetType = UNSET

    def __post_init__(self) -> None:
        for name in ("keys", "args_keys", "meta_keys", "states"):
            _check_unique_items(name, getattr(self, name))
        if isinstance(self.keys, tuple) and "meta" in self.keys and self.meta_keys is UNSET:
            raise InvalidJobError("meta_keys", "is required when keys contains 'meta'")
        if isinstance(self.period, str):
            try:
                validate_duration_syntax(self.period)
            except InvalidDurationError as exc:
                raise InvalidJobError("period", str(exc)) from None


class Job(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """An OJS job envelope.  Build one with :func:`new_job` or :func:`decode_job`.

    A direct ``Job(...)`` runs the cross-field checks and those of the timestamps, ``type``
    and ``queue``, but not the other per-field patterns and ranges (``id``'s among them);
    pass it through :func:`validate_job` when it comes from untrusted code.
    """

    specversion: Literal["1.0"]
    id: JobId
    type: JobType
    queue: QueueName
    args: list[Any]
    meta: dict[str, Any] | UnsetType = UNSET
    priority: int | UnsetType = UNSET
    timeout: Annotated[int, Meta(ge=0)] | UnsetType = UNSET
    scheduled_at: Timestamp | UnsetType = UNSET
    expires_at: Timestamp | UnsetType = UNSET
    retry: RetryPolicy | UnsetType = UNSET
    unique: UniquePolicy | UnsetType = UNSET
    schema: Uri | UnsetType = UNSET
    state: JobState | UnsetType = UNSET
    attempt: Annotated[int, Meta(ge=0)] | UnsetType = UNSET
    created_at: Timestamp | UnsetType = UNSET
    enqueued_at: Timestamp | UnsetType = UNSET
    started_at: Timestamp | UnsetType = UNSET
    completed_at: Timestamp | UnsetType = UNSET
    error: ErrorInfo | UnsetType = UNSET
    errors: tuple[ErrorRecord, ...] | UnsetType = UNSET
    result: Any | UnsetType = UNSET
    #: Top-level attributes the schema does not define; re-emitted at the top level.
    extensions: dict[str, Any] = {}

    def __post_init__(self) -> None:
        # Once per job received or built (twice per push): attribute reads and identity
        # tests; no call for an absent field (most are) nor for a text that passed lately.
        valid = valid_timestamps
        for i, value in enumerate((
            self.scheduled_at, self.expires_at, self.created_at, self.enqueued_at, self.started_at,
            self.completed_at,
        )):  # fmt: skip
            if value is not UNSET and (value.__class__ is not str or value not in valid):
                check_timestamp(_TIMESTAMP_FIELDS[i], value)
        if not known_type(self.type):
            raise InvalidJobError("type", f"must be {PATTERN_HINTS[TYPE_PATTERN]}, at most 255 characters")
        if not known_queue(self.queue):
            raise InvalidJobError("queue", f"must be {PATTERN_HINTS[QUEUE_PATTERN]}, at most 128 characters")
        if self.retry is not UNSET and isinstance(self.retry, RetryPolicy):
            try:
                resolve_retry(self.retry)
            except InvalidJobError as exc:
                raise InvalidJobError(f"retry.{exc.field}", exc.message) from None
        if self.extensions:
            _check_extensions(self.extensions, _JOB_FIELDS)

    def effective_meta(self) -> dict[str, Any]:
        """``meta``, or ``{}`` when absent."""
        return {} if isinstance(self.meta, UnsetType) else self.meta

    def effective_priority(self) -> int:
        """``priority``, or the OJS default 0 when absent."""
        return 0 if isinstance(self.priority, UnsetType) else self.priority

    def effective_attempt(self) -> int:
        """``attempt``, or 0 (never executed) when absent."""
        return 0 if isinstance(self.attempt, UnsetType) else self.attempt

    def effective_retry(self) -> EffectiveRetryPolicy:
        """The retry policy merged with the OJS defaults (OJS retry §8.1)."""
        return resolve_retry(self.retry)


#: The timestamps of :class:`Job`, in the order its ``__post_init__`` reads them.
_TIMESTAMP_FIELDS: Final = (
    "scheduled_at", "expires_at", "created_at", "enqueued_at", "started_at", "completed_at",
)  # fmt: skip
_JOB_FIELDS: Final = frozenset(Job.__struct_fields__) - {"extensions"}
#: The envelope's defined attributes (what an extension may not be called).
JOB_FIELDS: Final = _JOB_FIELDS
_RECORD_FIELDS: Final = frozenset(ErrorRecord.__struct_fields__) - {"extensions"}
_REQUIRED_FIELDS: Final = frozenset({"specversion", "id", "type", "queue", "args"})
# An explicit null means "absent" (OJS JSON §14.2) except here: kept for result, rejected for the rest.
_NULL_IS_VALUE: Final = frozenset({"result"}) | _REQUIRED_FIELDS
_NESTED_OBJECTS: Final = ("retry", "unique", "error")
# Keys that job_from_dict passes to msgspec as they are (no nested nulls or extensions).
_PLAIN_FIELDS: Final = _JOB_FIELDS - {*_NESTED_OBJECTS, "errors"}


def _check_extensions(extensions: Mapping[str, Any], known: frozenset[str]) -> None:
    for key in extensions:
        if key in known:
            raise InvalidJobError(f"extensions.{key}", f"{key!r} is a defined attribute, not an extension")


def _drop_nulls(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: v for k, v in obj.items() if v is not None}
    return obj


def _split_record(record: Any) -> Any:
    if not isinstance(record, dict):
        return record
    known = {k: v for k, v in record.items() if k in _RECORD_FIELDS and v is not None}
    extra = {k: v for k, v in record.items() if k not in _RECORD_FIELDS}
    if extra:
        known["extensions"] = extra
    return known


_MSGSPEC_ERROR_RE: Final = re.compile(r"(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?", re.DOTALL)
_NAMED_FIELD_RE: Final = re.compile(r"Object (?:missing required|contains unknown) field `(?P<name>[^`]+)`")


def _invalid(exc: msgspec.ValidationError) -> InvalidJobError:
    """Turn msgspec's ``"<message> - at `$.a.b[0]`"`` into ``InvalidJobError("a.b[0]", ...)``."""
    match = _MSGSPEC_ERROR_RE.fullmatch(str(exc))
    assert match is not None  # the pattern matches any string
    message, path = match["msg"], (match["path"] or "").lstrip(".")
    leaf = ""
    cause = exc.__cause__
    if isinstance(cause, InvalidJobError):  # raised by a __post_init__ at that path
        leaf, message = cause.field, cause.message
    elif (named := _NAMED_FIELD_RE.match(message)) is not None:
        leaf = named["name"]
    else:
        for pattern, hint in PATTERN_HINTS.items():
            if message.endswith(f"matching regex {pattern!r}"):
                message = f"must be {hint}"
    return InvalidJobError(".".join(part for part in (path, leaf) if part), message)


def job_from_dict(data: Mapping[str, Any]) -> Job:
    """Validate a parsed JSON object as a job envelope; unknown keys go to ``extensions``."""
    if not isinstance(data, Mapping):
        raise InvalidJobError("<body>", f"a job envelope must be a JSON object, not {type(data).__name__}")
    if type(data) is dict and _PLAIN_FIELDS.issuperset(data) and None not in data.values():
        # The usual envelope: no extensions, no nulls, no nested objects to clean up.
        try:
            return msgspec.convert(data, Job)
        except msgspec.ValidationError as exc:
            raise _invalid(exc) from exc
    known: dict[str, Any] = {}
    extensions: dict[str, Any] = {}
    for key, value in data.items():
        if key not in _JOB_FIELDS:
            extensions[key] = value
        elif value is not None or key in _NULL_IS_VALUE:
            known[key] = value
    for key in _NESTED_OBJECTS:
        if key in known:
            known[key] = _drop_nulls(known[key])
    if isinstance(known.get("errors"), list):
        known["errors"] = [_split_record(record) for record in known["errors"]]
    if extensions:
        known["extensions"] = extensions
    try:
        return msgspec.convert(known, Job)
    except msgspec.ValidationError as exc:
        raise _invalid(exc) from exc


def error_info(value: Any) -> ErrorInfo | None:
    """``value`` as an :class:`ErrorInfo` (an INFO answer's or a dead job's error), else None."""
    if not isinstance(value, dict):
        return None
    try:
        return msgspec.convert(value, ErrorInfo)
    except msgspec.ValidationError:
        return None


def job_to_dict(job: Job) -> dict[str, Any]:
    """The envelope as plain JSON values, extensions back at their place."""
    out: dict[str, Any] = msgspec.to_builtins(job)
    out.pop("extensions", None)
    if isinstance(job.errors, tuple):
        for record_out, record in zip(out["errors"], job.errors, strict=True):
            record_out.pop("extensions", None)
            record_out.update(record.extensions)
    out.update(job.extensions)
    return out


_decoder: Final = msgspec.json.Decoder()
_encoder: Final = msgspec.json.Encoder()


_job_decoder: Final = msgspec.json.Decoder(Job)


def decode_job(data: bytes | bytearray | memoryview | str, *, delivered: bool = False) -> Job:
    """Parse and validate a JSON job envelope; raise :class:`InvalidJobError` on any fault.

    ``delivered``: the envelope came in a message, where one without ``specversion`` is read
    as version 1.0.  The binding's own publishing example (001 §15.1) sends ``{"id", "type",
    "queue", "args", "created_at"}`` without it; jobs from that example must run too.
    Everything else stays strict, and the body is never rewritten (retries and dead letters
    carry the bytes the producer sent)."""
    if isinstance(data, bytes) and b'"extensions"' not in data and b'"errors"' not in data:
        # Straight into the struct.  Anything this path does not take as it is (an unknown
        # attribute, a null, an invalid value) fails here and goes the long way below,
        # which keeps extensions, drops nulls and words the error.
        try:
            return _job_decoder.decode(data)
        except msgspec.ValidationError:
            pass
        except msgspec.DecodeError as exc:
            raise InvalidJobError("<body>", f"not valid JSON: {exc}") from exc
        except (UnicodeDecodeError, RecursionError):
            pass  # worded below
    try:
        parsed = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise InvalidJobError("<body>", f"not valid JSON: {exc}") from exc
    except UnicodeDecodeError as exc:  # a string that is not UTF-8
        raise InvalidJobError("<body>", f"not valid JSON: {exc}") from exc
    except RecursionError:  # nested deeper than the decoder goes
        raise InvalidJobError("<body>", "not valid JSON: nested too deeply") from None
    if delivered and isinstance(parsed, dict) and "specversion" not in parsed:
        parsed = {"specversion": SPEC_VERSION, **parsed}
    return job_from_dict(parsed)


def encode_job(job: Job) -> bytes:
    """Serialize a job envelope as compact UTF-8 JSON (the AMQP message body, 001 §6.3)."""
    if not job.extensions and (job.errors is UNSET or not any(record.extensions for record in job.errors)):
        return _encoder.encode(job)
    return _encoder.encode(job_to_dict(job))


def validate_job(job: Job) -> Job:
    """Check every schema rule on a job built in code (``Job(...)`` skips the field rules)."""
    return job_from_dict(job_to_dict(job))


#: The job ids' generator under its former name (tests and tools import it from here).
_uuid7 = new_id
