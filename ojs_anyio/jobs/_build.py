"""Building a job, and what push accepts: pure, no I/O.  :func:`new_job` (the envelope's
one validator, ``_envelope.job_from_dict``, with a memo in front of it for the hot path),
``Client.build``'s options, the checks of ``push_job`` and of ``connect()``'s options."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
from msgspec import UNSET

from ojs_anyio.amqp import UsageError

from .._common import new_id
from ._args import check_json_args
from ._durations import DurationLike, duration_seconds
from ._envelope import (
    JOB_FIELDS,
    SPEC_VERSION,
    Job,
    UniquePolicy,
    format_timestamp,
    job_from_dict,
    parse_timestamp,
)
from ._errors import ArgumentTypeError, DelayOutOfRangeError, InvalidJobError
from ._field_rules import id_shaped, known_queue, known_type
from ._retry import RetryPolicy, merge
from ._topology import MAX_DELAY_MS, QueueOptions
from ._unique import unique_lock

__all__ = [
    "CLASSES_ON_THE_WIRE",
    "SCHEDULERS",
    "build_job",
    "check_client_options",
    "check_job_policy",
    "check_pushable",
    "new_job",
]

CLASSES_ON_THE_WIRE = (
    "{where}: non_retryable_errors holds exception classes, which cannot travel in a job's message; "
    "give their OJS error types as strings ('mypkg.errors.PaymentDeclined', or 'mypkg.errors.*'), "
    "or put the classes in the worker's policy: Worker(retry=RetryPolicy(non_retryable_errors=(...)))"
)


def check_job_policy(policy: RetryPolicy, *, stacklevel: int = 4) -> None:
    """Refuse what a job's own policy cannot carry; warn of what the binding ignores."""
    if policy.carries_classes():
        raise ArgumentTypeError(CLASSES_ON_THE_WIRE.format(where="the job's retry policy"))
    if policy.on_exhaustion == "discard":
        warnings.warn(
            "on_exhaustion='discard' is not honoured by the OJS AMQP binding: an exhausted job is "
            "rejected (Basic.Nack, requeue=false) and the broker moves it to its dead-letter queue "
            "ojs.queue.dlx.{queue} (OJS AMQP binding §5.5); purge that queue to drop them",
            UserWarning,
            stacklevel=stacklevel,
        )


def check_pushable(job: Job) -> None:
    """What push refuses in a job built elsewhere: unique policies, non-JSON args, classes."""
    if not isinstance(job, Job):
        raise ArgumentTypeError(
            f"push_job takes an ojs_anyio.Job (from client.build), not {type(job).__name__}"
        )
    if job.unique is not UNSET:
        unique_lock(job)  # refuses, with the reason, a policy a broker cannot enforce
    check_json_args(job.args, job.type)
    if job.retry is not UNSET and isinstance(job.retry, RetryPolicy):
        check_job_policy(job.retry)


def build_job(
    defaults: RetryPolicy | None,
    type: str,
    args: Sequence[Any],
    *,
    queue: str,
    priority: int | None,
    timeout: DurationLike | None,
    retry: RetryPolicy | None,
    meta: dict[str, Any] | None,
    scheduled_at: datetime | None,
    delay: DurationLike | None,
    expires_at: datetime | None,
    id: str | None,
) -> Job:
    """``Client.build``: a validated job, ``retry`` merged over the client's ``defaults``."""
    check_json_args(args, type)
    now = datetime.now(UTC)
    if delay is not None:
        if scheduled_at is not None:
            raise UsageError("give scheduled_at or delay, not both")
        seconds = duration_seconds(delay, "delay")
        try:
            scheduled_at = now + timedelta(seconds=seconds)
        except OverflowError:  # past year 9999
            raise DelayOutOfRangeError(
                f"delay of {seconds:g} s is beyond the longest delay RabbitMQ can hold, "
                f"{MAX_DELAY_MS} ms (about 49.7 days); nothing was published"
            ) from None
    if timeout is not None and not isinstance(timeout, int):
        seconds = duration_seconds(timeout, "timeout")
        if seconds != int(seconds):
            raise UsageError(f"timeout is whole seconds in OJS, got {timeout!r} ({seconds} s)")
        timeout = int(seconds)
    if retry is not None:
        if not isinstance(retry, RetryPolicy):
            # (``type`` is the job type here: the class name comes from ``__class__``)
            raise ArgumentTypeError(
                f"retry must be an ojs_anyio.RetryPolicy or None, not {retry.__class__.__name__}"
            )
        check_job_policy(retry, stacklevel=5)
    if defaults is not None:
        retry = defaults if retry is None else merge(retry, defaults)
    return new_job(
        type,
        args,
        queue=queue,
        meta=meta,
        priority=priority,
        timeout=timeout,
        scheduled_at=scheduled_at,
        expires_at=expires_at,
        retry=retry,
        id=id,
        now=now,
    )


#: How scheduled jobs are delayed: the binary delay levels (no plugin), the
#: delayed-message-exchange plugin, or the plugin when the broker has it (detected, never assumed).
SCHEDULERS = ("levels", "plugin", "auto")


def check_client_options(
    *,
    declare: str,
    scheduler: str,
    retry: RetryPolicy | None,
    queue_options: QueueOptions | dict[str, QueueOptions] | None,
) -> None:
    """The checks of ``Client(...)`` / ``connect(...)``'s push options."""
    if declare not in ("eager", "lazy"):
        raise UsageError("declare must be 'eager' or 'lazy'")
    if scheduler not in SCHEDULERS:
        raise UsageError(f"scheduler must be one of {', '.join(SCHEDULERS)}, got {scheduler!r}")
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise ArgumentTypeError(f"retry must be an ojs_anyio.RetryPolicy or None, not {type(retry).__name__}")
    if retry is not None and retry.carries_classes():
        raise ArgumentTypeError(CLASSES_ON_THE_WIRE.format(where="connect(retry=...)"))
    if queue_options is not None and not isinstance(queue_options, QueueOptions | dict):
        raise ArgumentTypeError(
            "queue_options must be a QueueOptions, a dict of queue name -> QueueOptions, or None, "
            f"not {type(queue_options).__name__}"
        )


# ---------------------------------------------------------------- new_job: the memo in front of the validator

def _timestamp_text(field: str, value: datetime | str) -> str:
    if isinstance(value, datetime):
        try:
            return format_timestamp(value)
        except ValueError as exc:
            raise InvalidJobError(field, str(exc)) from None
    return value


def _plain(
    type: object, queue: object, id: object, created: datetime, *,
    meta: dict[str, Any] | None, priority: object, timeout: object,
) -> bool:  # fmt: skip
    """Whether :func:`new_job` may build the struct directly from these (every other option
    absent): the memo in front of the one validator (``job_from_dict``).  Only values that
    validator has passed before, or whose type alone settles them, qualify; anything else
    goes the long way.  (Kept in step with the Job struct's field rules by
    ``test_new_job_fast_and_slow_paths_agree``.)"""
    return (
        (priority is None or priority.__class__ is int)
        and (timeout is None or (timeout.__class__ is int and timeout >= 0))
        and (meta is None or all(key.__class__ is str for key in meta))
        and known_type(type)
        and known_queue(queue)
        and (id is None or (id.__class__ is str and id_shaped(id)))
        and (created.tzinfo is UTC or created.utcoffset() is not None)
    )


def new_job(
    type: str,
    args: Sequence[Any],
    *,
    queue: str = "default",
    meta: Mapping[str, Any] | None = None,
    priority: int | None = None,
    timeout: int | None = None,
    scheduled_at: datetime | str | None = None,
    expires_at: datetime | str | None = None,
    retry: RetryPolicy | None = None,
    unique: UniquePolicy | None = None,
    schema: str | None = None,
    extensions: Mapping[str, Any] | None = None,
    id: str | None = None,
    now: datetime | None = None,
) -> Job:
    """A new, validated job: fresh UUIDv7 ``id``, ``created_at`` = ``now``, ``attempt`` 0.

    ``state`` is ``scheduled`` when ``scheduled_at`` is after ``now``, else ``available``.
    ``now`` defaults to the current UTC time (the only clock read of this module) and must
    be timezone-aware.  Options left as ``None`` are absent from the envelope.
    """
    if (
        args.__class__ is not list
        and args.__class__ is not tuple
        and (isinstance(args, str | bytes | bytearray | Mapping) or not isinstance(args, Sequence))
    ):
        raise InvalidJobError("args", f"must be a sequence (a JSON array), not {args.__class__.__name__}")
    created = datetime.now(UTC) if now is None else now
    meta_copy = None if meta is None else dict(meta)
    if (
        scheduled_at is None
        and expires_at is None
        and retry is None
        and unique is None
        and schema is None
        and not extensions
        and _plain(type, queue, id, created, meta=meta_copy, priority=priority, timeout=timeout)
    ):
        # (``type`` is a parameter here, hence ``__class__``.)
        # The common case, every input already known valid: build the struct directly
        # (what job_from_dict would give, without the dict round trip and per-field checks).
        return Job(
            specversion=SPEC_VERSION,
            id=new_id() if id is None else id,
            type=type,
            queue=queue,
            args=list(args),
            meta=UNSET if meta_copy is None else meta_copy,
            priority=UNSET if priority is None else priority,
            timeout=UNSET if timeout is None else timeout,
            state="available",
            attempt=0,
            created_at=format_timestamp(created),
        )
    options: dict[str, Any] = {
        "meta": meta_copy,
        "priority": priority,
        "timeout": timeout,
        "scheduled_at": None if scheduled_at is None else _timestamp_text("scheduled_at", scheduled_at),
        "expires_at": None if expires_at is None else _timestamp_text("expires_at", expires_at),
        "retry": None if retry is None else msgspec.to_builtins(retry),
        "unique": None if unique is None else msgspec.to_builtins(unique),
        "schema": schema,
    }
    data: dict[str, Any] = {
        "specversion": SPEC_VERSION,
        "id": new_id() if id is None else id,
        "type": type,
        "queue": queue,
        "args": list(args),
        "state": "available",
        "attempt": 0,
        "created_at": _timestamp_text("created_at", created),
    }
    data.update((key, value) for key, value in options.items() if value is not None)
    if extensions:
        clash = sorted(set(extensions) & JOB_FIELDS)
        if clash:
            raise InvalidJobError(f"extensions.{clash[0]}", f"{clash[0]!r} is a defined attribute")
        data.update(extensions)
    job = job_from_dict(data)
    if isinstance(job.scheduled_at, str) and parse_timestamp(job.scheduled_at) > created:
        job = msgspec.structs.replace(job, state="scheduled")
    return job
