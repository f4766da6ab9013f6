"""The OJS worker: FETCH, ACK, FAIL (001 §5.2-5.5), with retry and dead letters.

This module holds the :class:`Worker` itself: configuration, the handler registry, run
and stop.  The pull tasks and one delivery's run are ``_runner.py``; each queue's pull
tasks and their grace period on stop are a consume pool (``ojs_anyio/_consume_pool.py``,
the event bus's too); settling on the broker and reporting outcomes, ``_settle.py``.

Per queue: one channel with publisher confirms, ``Basic.Qos(prefetch=concurrency)`` then
``Basic.Consume(no_ack=False)`` (AMQP-006/007), and ``concurrency`` long-lived tasks
pulling from the bounded delivery stream (no task per job).  Each job runs under its
``timeout`` (default 1800 s), the deadline of its pull task's cancel scope.

Outcomes:

* success → ``Basic.Ack`` (AMQP-008);
* retryable failure → publish to ``ojs.exchange.retry`` (routing key ``{q}.{delay}``,
  delay on the bounded ladder) with ``x-ojs-attempt`` + 1 and the error headers, wait for
  the confirm, then ``Basic.Ack`` the original (OJS AMQP binding §5.4; confirm first): a crash in between
  duplicates the job, never loses it;
* exhausted, non-retryable, discarded or bad input → dead letter (see below);
* the worker is stopping and the grace period ran out → the job is left unacked; the
  broker redelivers it when the channel closes.  Nothing is acked that did not complete.

Dead letters (see ``_dead_letter.py``): ``Basic.Nack(requeue=false)`` on the original
delivery (AMQP-009); the broker moves it into ``ojs.queue.dlx.{q}``.  No copy ever goes
back to the job queue.  The final reason goes to the log, a metric and a span; the opt-in
``annotate_dead_letters=True`` instead publishes an annotated copy to the DLX (confirmed)
and acks the original, a documented departure from AMQP-009.
"""

from __future__ import annotations

import builtins
import functools
import logging
import random
import uuid
import warnings
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import anyio.abc

from ojs_anyio.amqp import UsageError

from .. import amqp
from .._common import current_backend
from ._args import check_queue_names
from ._client import Client
from ._context import JobContext, JobOutcome
from ._control import WorkerControl
from ._durations import DurationLike, duration_seconds
from ._errors import ArgumentTypeError
from ._field_rules import check_job_type
from ._handlers import HandlerSpec, inspect_handler
from ._middleware import Middleware, check_middleware
from ._presence import announce, worker_presence
from ._retry import RetryPolicy
from ._runner import JobRunner
from ._settle import Settler
from ._startup import through_cuts
from ._typed import JobDecorator, JobHandle, validate_options

__all__ = ["Handler", "JobContext", "JobOutcome", "Worker"]

log = logging.getLogger("ojs_anyio.worker")

#: ``async def handler(ctx, *args)`` or ``def handler(ctx, *args)`` (run in a worker thread).
Handler = Callable[..., Awaitable[Any]] | Callable[..., Any]

DEFAULT_TIMEOUT = 1800.0
#: RabbitMQ's default consumer_timeout (30 min): an unacked delivery older than this gets
#: its channel closed with 406 PRECONDITION_FAILED: RabbitMQ has no visibility timeout.
BROKER_CONSUMER_TIMEOUT = 1800.0
#: A rolling deploy's window: a job of a type this worker does not know is retried (not
#: counted as an attempt) for this long before it is dead-lettered as INVALID_JOB_TYPE.
DEFAULT_UNKNOWN_TYPE_GRACE = 600.0
#: A job whose worker died (or lost its connection) this many times running it is
#: dead-lettered as WORKER_LOST instead of being delivered again (a job that kills its
#: process would otherwise take down every worker in turn, for ever).
DEFAULT_MAX_DELIVERIES = 5


class Worker:
    """Consumes jobs from ``queues`` and runs their handlers.

    ::

        worker = ojs_anyio.Worker(queues=["email"], concurrency=10)

        @worker.handler("email.send")
        async def send_email(ctx: ojs_anyio.JobContext, to: str, template: str) -> None: ...

        async with ojs_anyio.connect() as client:
            await worker.run(client)   # until cancelled, or worker.stop()
    """

    def __init__(
        self,
        queues: list[str] | tuple[str, ...] = ("default",),
        *,
        concurrency: int = 10,
        prefetch: int | None = None,
        retry: RetryPolicy | None = None,
        grace_period: DurationLike = 25.0,
        default_timeout: DurationLike = DEFAULT_TIMEOUT,
        worker_id: str | None = None,
        rng: random.Random | None = None,
        broker_consumer_timeout: DurationLike = BROKER_CONSUMER_TIMEOUT,
        heartbeat_interval: DurationLike = 5.0,
        cancel_memory: DurationLike = 3600.0,
        annotate_dead_letters: bool = False,
        middleware: Sequence[Middleware] | None = None,
        metrics: bool = True,
        tracing: bool = True,
        republish: amqp.RepublishPolicy = amqp.DEFAULT_REPUBLISH_POLICY,
        unknown_type_grace: DurationLike = DEFAULT_UNKNOWN_TYPE_GRACE,
        info_details: bool = True,
        max_deliveries: int = DEFAULT_MAX_DELIVERIES,
    ) -> None:
        self.queues = check_queue_names(queues, "Worker(queues=...)")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise UsageError(f"concurrency must be an int >= 1 (jobs at once per queue), got {concurrency!r}")
        if prefetch is not None and (
            isinstance(prefetch, bool) or not isinstance(prefetch, int) or not concurrency <= prefetch < 2**16
        ):
            raise UsageError(
                f"prefetch must be None (= concurrency) or an int from concurrency ({concurrency}) to 65535, "
                f"got {prefetch!r}: a prefetch below the concurrency would leave pull tasks idle"
            )
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ArgumentTypeError(
                f"retry must be an ojs_anyio.RetryPolicy or None, not {type(retry).__name__}"
            )
        if worker_id is not None and (not isinstance(worker_id, str) or not worker_id):
            raise ArgumentTypeError(f"worker_id must be a non-empty str or None, got {worker_id!r}")
        if isinstance(max_deliveries, bool) or not isinstance(max_deliveries, int) or max_deliveries < 1:
            raise UsageError(f"max_deliveries must be an int >= 1, got {max_deliveries!r}")
        if not isinstance(republish, amqp.RepublishPolicy):
            raise ArgumentTypeError(
                f"republish must be an ojs_anyio.RepublishPolicy, not {type(republish).__name__}"
            )
        if rng is not None and not isinstance(rng, random.Random):
            raise ArgumentTypeError(f"rng must be a random.Random or None, not {type(rng).__name__}")
        _warn_policy(retry, "Worker(retry=...)")
        self.concurrency = concurrency
        self._prefetch = prefetch
        self.retry = retry
        self.grace_period = duration_seconds(grace_period, "grace_period")
        self.default_timeout = duration_seconds(default_timeout, "default_timeout", allow_zero=False)
        self.worker_id = worker_id or f"worker-{uuid.uuid4().hex[:12]}"
        self.broker_consumer_timeout = duration_seconds(
            broker_consumer_timeout, "broker_consumer_timeout", allow_zero=False
        )
        self._rng = rng or random.Random()
        #: How settling publishes (retries, annotated dead letters, relayed control
        #: messages) ride out transient refusals before the delivery goes back to the broker.
        self.republish = republish
        #: How long a job of a type no handler here knows keeps coming back before it is
        #: dead-lettered as INVALID_JOB_TYPE (0: at once); see _unknown_type.
        self.unknown_type_grace = duration_seconds(unknown_type_grace, "unknown_type_grace")
        #: job type -> the handler, inspected at registration
        self._handlers: dict[str, HandlerSpec] = {}
        self._stopping = False
        #: Set once run() is consuming.  Made in the event loop that uses it (wait_ready or
        #: run), and dropped when run() ends, so a Worker made at import time runs on asyncio,
        #: then Trio, then asyncio again.
        self._ready: anyio.Event | None = None
        self.heartbeat_interval = duration_seconds(heartbeat_interval, "heartbeat_interval", allow_zero=False)
        self.cancel_memory = duration_seconds(cancel_memory, "cancel_memory")
        #: Opt-in departure from AMQP-009: dead letters are annotated copies (see _dead_letter).
        self.annotate_dead_letters = annotate_dead_letters
        #: Around-hooks for every handler call and outcome (first = outermost); see Middleware.
        self.middleware: list[Middleware] = list(check_middleware(middleware))
        #: Add a JobMetrics middleware at run() when an OpenTelemetry SDK is installed.
        self.metrics = metrics
        #: Put a Tracing middleware first at run() when a tracer provider is installed.
        self.tracing = tracing
        #: Whether INFO answers carry the job's result and its errors' backtraces.
        self.info_details = info_details
        #: After this many deliveries that ended without a settlement (its worker died or
        #: lost its connection each time), a job is dead-lettered as WORKER_LOST.
        self.max_deliveries = max_deliveries
        #: CANCEL, BEAT and INFO (``_control.py``): its task, and what it remembers.
        self.control = WorkerControl(self, self._rng)
        #: Settling on the broker and reporting outcomes; running jobs (_settle.py, _runner.py).
        self._settler = Settler(self, self._rng)
        self._runner = JobRunner(self, self._settler, self._handlers, self._rng)
        #: Outcomes so far, by outcome.
        self.counts = self._settler.counts
        #: The jobs running now (see JobRunner.running).
        self._running = self._runner.running

    def handler(self, job_type: str) -> Callable[[Handler], Handler]:
        """Decorator registering ``fn(ctx, *args)`` for ``job_type``.

        ``fn`` is an ``async def`` function, or a plain ``def`` function that then runs in a
        worker thread (see :meth:`register`)."""

        def register(fn: Handler) -> Handler:
            self.register(job_type, fn)
            return fn

        return register

    def job(
        self,
        job_type: str,
        *,
        queue: str | None = None,
        **push_options: Any,
    ) -> JobDecorator:
        """Decorator: register ``fn(ctx, ...)`` for ``job_type`` and return a typed handle.

        ``await handle.push(client, *args, **kwargs)`` is checked by mypy against ``fn``'s
        parameters (less the context).  ``queue`` defaults to this worker's queue when it
        consumes exactly one; ``push_options`` are :meth:`Client.push`'s keyword arguments.
        """
        if queue is None:
            if len(self.queues) != 1:
                raise ArgumentTypeError(
                    f"job {job_type!r}: this worker consumes {len(self.queues)} queues; "
                    "say which one the job goes to with queue=..."
                )
            queue = self.queues[0]
        options = validate_options({**push_options, "queue": queue})

        def register(fn: Callable[..., Any]) -> JobHandle[..., Any]:
            handle: JobHandle[..., Any] = JobHandle(job_type, fn, options)
            self.register(job_type, fn)
            return handle

        return register  # type: ignore[return-value]  # the overloads of JobDecorator

    def register(self, job_type: str, fn: Handler) -> None:
        """Register ``fn(ctx, *args)`` for ``job_type``.

        An ``async def`` handler runs in the worker's task.  A plain ``def`` handler runs in
        a worker thread (``anyio.to_thread.run_sync``), at most ``concurrency`` per queue at
        once; a timeout, a CANCEL or the end of the grace period cannot stop a thread: the
        worker waits for the function to return, and its return or exception decides the
        job, with a warning (a thread can look at ``ctx.cancel_requested`` /
        ``ctx.abandoned`` to stop early).  Anything else is refused with ``TypeError``, and
        so are parameter annotations that JSON arguments cannot be converted to.
        """
        if not isinstance(job_type, str) or not job_type:
            raise ArgumentTypeError(f"job_type must be a non-empty str, got {job_type!r}")
        check_job_type(job_type)  # the envelope's rule: a push of any other would be refused
        spec = inspect_handler(job_type, fn)
        existing = self._handlers.get(job_type)
        if existing is not None:
            raise UsageError(
                f"a handler for {job_type!r} is already registered ({existing.name}); a job type has "
                "one handler per worker: give the second one its own job type"
            )
        self._handlers[job_type] = spec

    def add_listener(self, callback: Callable[[JobOutcome], None]) -> Callable[[], None]:
        """Call ``callback`` with every :class:`JobOutcome` (synchronously)."""
        listeners = self._settler.listeners
        listeners.append(callback)
        return lambda: listeners.remove(callback) if callback in listeners else None

    async def wait_ready(self) -> None:
        """Wait until every queue's consumer is registered."""
        await self._ready_event().wait()

    def _ready_event(self) -> anyio.Event:
        if self._ready is None:
            self._ready = anyio.Event()
        return self._ready

    async def _declare_queues(self, client: Client) -> None:
        """Declare the worker's queues (idempotent), again when the connection is cut on the
        way (a worker started as its connection drops waits for the recovery instead of
        failing): a start-up step (``_startup.py``)."""

        async def declare() -> None:
            for queue in self.queues:
                await client.declare_queue(queue)
                await client.declare_redelivered_queue(queue)

        await through_cuts(declare, _never, "declaring its queues", self.worker_id)

    async def run(self, client: Client) -> None:
        """Consume until cancelled or :meth:`stop`; returns after a graceful stop."""
        # Not reset here: a stop() that came before this task got going (a signal during
        # startup) must still count.  Reset on the way out, so the worker can run again.
        try:
            await self._declare_queues(client)
            self._runner.start(len(self.queues))
            log.info(
                "worker %(worker)s starting: queues=%(queues)s concurrency=%(concurrency)d "
                "backend=%(backend)s broker=%(broker)s",
                {
                    "worker": self.worker_id, "queues": ",".join(self.queues),
                    "concurrency": self.concurrency, "backend": current_backend(),
                    "broker": client.conn.url.redacted(),
                },
                extra={"worker_id": self.worker_id, "queues": list(self.queues)},
            )  # fmt: skip
            async with anyio.create_task_group() as tg:
                control_started = anyio.Event()
                control_scope = self.control.scope = anyio.CancelScope()
                watch_scope = anyio.CancelScope()
                tg.start_soon(self._runner.watch_timeouts, watch_scope)
                tg.start_soon(self.control.serve, client, control_started)
                await control_started.wait()
                started = [anyio.Event() for _ in self.queues]
                for queue, ev in zip(self.queues, started, strict=True):
                    tg.start_soon(self._runner.serve_queue, client, queue, ev)
                for ev in started:
                    await ev.wait()
                beat_scope = anyio.CancelScope()
                tg.start_soon(self.control.beat_loop, client, beat_scope)
                presence_scope = anyio.CancelScope()  # for observers: docs/jobs.md "Presence"
                presence = functools.partial(worker_presence, self)
                tg.start_soon(announce, client, presence, self.heartbeat_interval, presence_scope)
                self._ready_event().set()
                await self._runner.queues_done()
                beat_scope.cancel()
                presence_scope.cancel()
                control_scope.cancel()
                watch_scope.cancel()
        finally:
            # Reset also when run() fails, so the worker can run again.
            self._stopping = False
            self._ready = None

    def interruptible(self, ctx: JobContext) -> bool:
        """Whether CANCEL stops the job's handler: not a plain ``def``, which runs in a thread."""
        spec = self._handlers.get(ctx.job.type)
        return spec is None or spec.is_async

    @property
    def liveness(self) -> OrderedDict[str, tuple[str, float]]:
        """Liveness seen through BEAT messages: job id -> (worker id, monotonic time)."""
        return self.control.liveness

    @property
    def active(self) -> dict[str, JobContext]:
        """The jobs running now: job id -> context (the first, if one id runs twice)."""
        return {job_id: entries[0][1] for job_id, entries in self._running.items()}

    @property
    def prefetch(self) -> int:
        """``Basic.Qos(prefetch_count)`` of each job queue's consumer: the concurrency by
        default (001's FETCH mapping), else ``Worker(prefetch=...)`` (a documented
        departure, docs/jobs.md), never below the concurrency (which the command line may
        set after construction)."""
        return self.concurrency if self._prefetch is None else max(self._prefetch, self.concurrency)

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was called (until the next :meth:`run` starts)."""
        return self._stopping

    def stop(self) -> None:
        """Graceful stop: take no new jobs; let running ones finish within ``grace_period``;
        cancel (and leave unacked) what still runs after it.  Called before :meth:`run` got
        going, it makes that run return without taking a job."""
        if self._stopping:
            return
        self._stopping = True
        log.info("worker %s stopping (grace period %.1fs)", self.worker_id, self.grace_period)
        self._runner.stop()

    def cancel_job(self, job_id: str) -> bool:
        """Cancel a running job (CANCEL): it is acked and reported as cancelled."""
        entries = self._running.get(job_id)
        if not entries:
            return False
        for scope, ctx in entries:  # every delivery of that id
            ctx.cancel_requested = True
            scope.cancel()
        return True


def _never() -> bool:
    return False


def _warn_policy(policy: RetryPolicy | None, where: str) -> None:
    """Warn about a retry option that this binding cannot honour as written."""
    errors = policy.non_retryable_errors if policy is not None else ()
    for entry in errors if isinstance(errors, tuple) else ():
        builtin = isinstance(getattr(builtins, str(entry), None), type)
        if isinstance(entry, str) and "." not in entry and not builtin:
            warnings.warn(
                f"{where}: non_retryable_errors entry {entry!r} has no module, so it matches only an "
                f"exception class named so in builtins or __main__; write its qualified name "
                f"('mypkg.errors.{entry}') or pass the class itself",
                UserWarning,
                stacklevel=3,
            )
    if policy is not None and policy.on_exhaustion == "discard":
        warnings.warn(
            f"{where}: on_exhaustion='discard' is not honoured by the OJS AMQP binding: an exhausted job "
            "is rejected (Basic.Nack, requeue=false) and the broker moves it to its dead-letter queue "
            "ojs.queue.dlx.{queue} (OJS AMQP binding §5.5); purge that queue to drop them",
            UserWarning,
            stacklevel=3,
        )
