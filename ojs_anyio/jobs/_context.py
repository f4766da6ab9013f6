"""What a handler receives and what became of an attempt: the job runtime's value types.

A leaf of the job layer: the middleware, tracing, metrics and typed-handle modules name
these types without importing the worker (``_worker.py`` builds them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from .. import amqp
from ._envelope import Job, format_timestamp

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

    @property
    def started_wall(self) -> str:
        """When the handler started, as an OJS timestamp."""
        return format_timestamp(datetime.fromtimestamp(self.started_time, UTC))

    @property
    def id(self) -> str:
        return self.job.id

    @property
    def args(self) -> list[Any]:
        return self.job.args


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """One line of the worker's story: what happened to a job attempt."""

    job_id: str | None
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
