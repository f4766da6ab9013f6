"""Building a job, and what push accepts: pure checks, no I/O (``Client.build``,
``push_job``, ``connect()``'s options)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from ojs_anyio.amqp import UsageError

from ._args import check_json_args
from ._durations import DurationLike, duration_seconds
from ._envelope import Job, new_job
from ._errors import ArgumentTypeError, DelayOutOfRangeError
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
    if not isinstance(job.unique, msgspec.UnsetType):
        unique_lock(job)  # refuses, with the reason, a policy a broker cannot enforce
    check_json_args(job.args, job.type)
    if isinstance(job.retry, RetryPolicy):
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
