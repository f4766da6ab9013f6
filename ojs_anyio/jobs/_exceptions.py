"""The job runtime's errors and the handler's verdicts: kept importable from here.

They live in :mod:`ojs_anyio.jobs._errors`, with the rest of the job layer's errors.
"""

from __future__ import annotations

from ._errors import (
    DeadLetter,
    Discard,
    JobError,
    PushError,
    PushOutcomeUnknownError,
    QueueFullError,
    Retry,
    SchedulerUnavailableError,
    TopologyConflictError,
    UnroutableJobError,
)

__all__ = [
    "DeadLetter",
    "Discard",
    "JobError",
    "PushError",
    "PushOutcomeUnknownError",
    "QueueFullError",
    "Retry",
    "SchedulerUnavailableError",
    "TopologyConflictError",
    "UnroutableJobError",
]
