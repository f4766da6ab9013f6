"""What a handler receives and what became of an attempt: the job runtime's value types.

A leaf of the job layer: the middleware, tracing, metrics and typed-handle modules name
these types without importing the worker (``_worker.py`` builds them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import msgspec

from .. import amqp
from ._envelope import Job, format_timestamp
from ._renamed import warn_renamed

if TYPE_CHECKING:
    from ._retry import EffectiveRetryPolicy

#: The job ``meta`` key a workflow's jobs carry their place in it under (``docs/workflows.md``).
WORKFLOW_META_KEY = "ojs.workflow"

__all__ = ["JobContext", "JobOutcome", "Outcome"]


class Outcome(StrEnum):
    """What became of one attempt (a ``str``: ``outcome == "completed"`` keeps working)."""

    COMPLETED = "completed"
    RETRIED = "retried"
    DEAD_LETTERED = "dead_lettered"
    CANCELLED = "cancelled"
    ABANDONED = "abandoned"
    REQUEUED = "requeued"
    DEFERRED = "deferred"


@dataclass(slots=True)
class JobContext:
    """What a handler receives first: the job, its attempt, and the worker."""

    job: Job
    attempt: int
    max_attempts: int
    queue: str
    worker_id: str
    message: amqp.IncomingMessage
    started_at: float = field(default_factory=time.monotonic)
    #: Wall-clock start (seconds since the epoch); :attr:`started_wall` formats it.
    started_time: float = field(default_factory=time.time)
    cancel_requested: bool = False
    #: Set by a graceful stop whose grace period ran out: the job is left unacked.
    abandoned: bool = False
    #: The retry policy this attempt runs under (the worker's decision uses it; so does
    #: the workflow middleware, to tell a final failure from one that will be retried).
    policy: EffectiveRetryPolicy | None = None
    #: When the handler's timeout ends (``anyio.current_time()`` terms; set when it starts).
    deadline: float | None = None

    @property
    def started_wall(self) -> str:
        """When the handler started, as an OJS timestamp."""
        return format_timestamp(datetime.fromtimestamp(self.started_time, UTC))

    @property
    def id(self) -> str:
        return self.job.id

    @property
    def workflow_id(self) -> str | None:
        """The id of the workflow this job is part of (``docs/workflows.md``), else None."""
        place = self.job.effective_meta().get(WORKFLOW_META_KEY)
        return place.get("id") if isinstance(place, dict) else None

    @property
    def parent_results(self) -> dict[str, Any]:
        """The results of the upstream jobs of a workflow (OJS workflows §7), keyed by step
        or job index as strings; ``{}`` for a job outside a workflow or without upstream."""
        place = self.job.effective_meta().get(WORKFLOW_META_KEY)
        results = place.get("parent_results") if isinstance(place, dict) else None
        return results if isinstance(results, dict) else {}

    @property
    def args(self) -> list[Any]:
        return self.job.args


class JobOutcome(msgspec.Struct, frozen=True):
    """One line of the worker's story: what happened to a job attempt.

    An immutable record (a frozen ``msgspec.Struct``: built once per job in about 0.35 µs,
    where a frozen dataclass took about 3; ``msgspec.structs.asdict`` and ``replace`` apply)."""

    #: The job's id (``job_id`` is a deprecated alias).
    id: str | None
    type: str | None
    queue: str
    attempt: int
    #: What became of the attempt: an :class:`Outcome` (a ``str``; one built by hand may
    #: carry the plain string, which compares equal).
    outcome: Outcome | str
    error_code: str | None = None
    error_message: str | None = None
    delay_ms: int | None = None
    duration: float = 0.0
    #: The OJS error object of a failed attempt: ``type``, ``message``, ``backtrace``.
    error: dict[str, Any] | None = None
    #: What the handler returned (completed attempts).
    result: Any = None

    @property
    def job_id(self) -> str | None:
        """Deprecated alias of :attr:`id`."""
        warn_renamed("JobOutcome", "job_id", "id")
        return self.id
