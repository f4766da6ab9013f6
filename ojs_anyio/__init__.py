"""ojs-anyio: background jobs over RabbitMQ for asyncio and Trio (Open Job Spec AMQP binding).

::

    import ojs_anyio as ojs

    async with ojs.connect("amqp://guest:guest@localhost/") as client:
        job = await client.push("email.send", ["user@example.com", "welcome"], queue="email")

    worker = ojs.Worker(queues=["email"], concurrency=10)

    @worker.handler("email.send")
    async def send_email(ctx: ojs.JobContext, to: str, template: str) -> None: ...

    async with ojs.connect() as client:
        await worker.run(client)

The AMQP client underneath is :mod:`ojs_anyio.amqp`; the sans-IO protocol is :mod:`ojs_codec`.
The event bus (topic pub/sub with redelivery) is :mod:`ojs_anyio.events`.
"""

from . import amqp, events
from .amqp import RepublishPolicy, UsageError
from .jobs._build import new_job
from .jobs._client import Client, JobInfo, PushResult
from .jobs._connect import connect
from .jobs._context import JobContext, JobOutcome, Outcome
from .jobs._cron import Scheduler
from .jobs._dead_letters import DeadJob, DeadLetters
from .jobs._dedup import DuplicateJobError
from .jobs._envelope import ErrorInfo, ErrorRecord, Job, UniquePolicy, decode_job, encode_job
from .jobs._errors import (
    ArgumentTypeError,
    DelayOutOfRangeError,
    ErrorCode,
    InvalidJobError,
    JobError,
    PushError,
    PushNotSentError,
    PushOutcomeUnknownError,
    QueueFullError,
    QueueNotFoundError,
    SchedulerUnavailableError,
    TopologyConflictError,
    TopologyError,
    UnroutableJobError,
)
from .jobs._job_metrics import JobMetrics
from .jobs._middleware import Middleware
from .jobs._results import JobFailedError, PendingResult
from .jobs._retry import RetryPolicy
from .jobs._schedule import Fired, LeadershipChanged, Schedule, SchedulerEvent, SchedulerStatistics
from .jobs._sync import SyncClient, SyncPendingResult
from .jobs._topology import Names, QueueOptions
from .jobs._tracing import Tracing
from .jobs._typed import JobHandle
from .jobs._verdicts import DeadLetter, Discard, Retry
from .jobs._worker import Worker
from .jobs._workflows import (
    Batch,
    Chain,
    Group,
    Step,
    WorkflowHandle,
    WorkflowMiddleware,
    WorkflowState,
    batch,
    chain,
    group,
    step,
    workflow_from_dict,
)

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "Chain",
    "Group",
    "Step",
    "WorkflowHandle",
    "WorkflowMiddleware",
    "WorkflowState",
    "batch",
    "chain",
    "group",
    "step",
    "workflow_from_dict",
    "ArgumentTypeError",
    "Client",
    "DeadJob",
    "DeadLetter",
    "DeadLetters",
    "DelayOutOfRangeError",
    "Discard",
    "DuplicateJobError",
    "ErrorCode",
    "ErrorInfo",
    "ErrorRecord",
    "Fired",
    "InvalidJobError",
    "Job",
    "JobContext",
    "JobError",
    "JobFailedError",
    "JobHandle",
    "JobInfo",
    "JobMetrics",
    "JobOutcome",
    "LeadershipChanged",
    "Middleware",
    "Names",
    "Outcome",
    "PendingResult",
    "PushError",
    "PushNotSentError",
    "PushOutcomeUnknownError",
    "PushResult",
    "QueueFullError",
    "QueueNotFoundError",
    "QueueOptions",
    "Retry",
    "RepublishPolicy",
    "RetryPolicy",
    "Schedule",
    "Scheduler",
    "SchedulerEvent",
    "SchedulerStatistics",
    "SchedulerUnavailableError",
    "SyncClient",
    "SyncPendingResult",
    "TopologyConflictError",
    "TopologyError",
    "Tracing",
    "UniquePolicy",
    "UnroutableJobError",
    "UsageError",
    "Worker",
    "amqp",
    "connect",
    "events",
    "decode_job",
    "encode_job",
    "new_job",
]
