"""The OJS worker: FETCH, ACK, FAIL (001 §5.2-5.5), with retry and dead letters.

Per queue: one channel with publisher confirms, ``Basic.Qos(prefetch=concurrency)`` then
``Basic.Consume(no_ack=False)`` (AMQP-006/007), and ``concurrency`` long-lived tasks
pulling from the bounded delivery stream (no task per job).  Each job runs in its own
cancel scope under its ``timeout`` (default 1800 s).

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

import asyncio
import builtins
import contextlib
import functools
import logging
import random
import time
import uuid
import warnings
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import msgspec
import sniffio

from ojs_anyio.amqp import Int32, UsageError

from .. import _pipeline, amqp
from . import _tracing
from ._args import check_queue_names
from ._attempt import JOB_LINE, Attempt
from ._client import Client
from ._context import JobContext, JobOutcome, Outcome
from ._control import WorkerControl
from ._dead_letters import dead_letter as settle_dead_letter
from ._decide import Verdict, dead_letter, decide
from ._durations import DurationLike, duration_seconds
from ._envelope import (
    SPEC_VERSION,
    Job,
    check_job_type,
    decode_job,
    format_timestamp,
    job_from_dict,
    parse_timestamp,
)
from ._errors import ArgumentTypeError, ErrorCode, InvalidJobError
from ._failures import (
    H_ERROR_BACKTRACE,
    H_ERROR_TYPE,
    error_headers,
    error_object,
    log_extra,
    with_error,
)
from ._handlers import ArgumentsError, HandlerSpec, inspect_handler
from ._job_metrics import JobMetrics
from ._middleware import HandlerChain, Middleware, build_handler_chain, check_middleware, outcome_hooks
from ._presence import announce, worker_presence
from ._results import encode_reply
from ._retry import (
    DEFAULT_RETRY_POLICY,
    EffectiveRetryPolicy,
    RetryPolicy,
    error_type_name,
    ladder_delay_ms,
    merge,
    resolve_retry,
)
from ._topology import strip_dead_letter_headers
from ._typed import JobDecorator, JobHandle, validate_options
from ._wire import (
    H_ATTEMPT,
    H_DELIVERY_COUNT,
    H_ERROR_CODE,
    H_ERROR_MESSAGE,
    H_ERRORS,
    H_UNKNOWN_TYPE_SINCE,
    H_UNSETTLED,
    header_attempt,
    header_max_attempts,
    header_since,
    unsettled_deliveries,
    with_headers,
)

__all__ = ["Handler", "JobContext", "JobOutcome", "Worker"]

log = logging.getLogger("ojs_anyio.worker")

_json = msgspec.json.Encoder()
_json_decode = msgspec.json.Decoder()

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
        self._unknown_logged: set[str] = set()
        #: The scopes of settling publishes under way (the end of the grace period cancels them).
        self._settle_scopes: set[anyio.CancelScope] = set()
        #: Redelivered jobs being moved now, and the event their end sets (_moves_settled).
        self._moving = 0
        self._moved: anyio.Event | None = None
        #: (worker policy, it merged over the OJS defaults): see _policy.
        self._defaults: tuple[RetryPolicy | None, RetryPolicy] | None = None
        #: job type -> the handler, inspected at registration
        self._handlers: dict[str, HandlerSpec] = {}
        #: Bounds the threads of sync handlers (created in run(): one per event loop).
        self._thread_limiter: anyio.CapacityLimiter | None = None
        self._listeners: list[Callable[[JobOutcome], None]] = []
        self._stopping = False
        #: The scopes of the job tasks now waiting for a delivery (stop() cancels them).
        self._fetch_scopes: set[anyio.CancelScope] = set()
        self._backend: _Backend | None = None
        #: Every delivery running now, by job id: (its scope, its context).  Usually one a
        #: job; two deliveries of one id (a re-push after an unknown outcome) are both here,
        #: so CANCEL and the grace period reach each.
        self._running: dict[str, list[tuple[anyio.CancelScope, JobContext]]] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        #: Set once run() is consuming.  Made in the event loop that uses it (wait_ready or
        #: run), and dropped when run() ends, so a Worker made at import time runs on asyncio,
        #: then Trio, then asyncio again.
        self._ready: anyio.Event | None = None
        self.counts: dict[str, int] = {}
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
        self._handler_chain: HandlerChain | None = None
        self._outcome_hooks: tuple[Callable[[JobOutcome], None], ...] = ()
        #: Whether INFO answers carry the job's result and its errors' backtraces.
        self.info_details = info_details
        #: After this many deliveries that ended without a settlement (its worker died or
        #: lost its connection each time), a job is dead-lettered as WORKER_LOST.
        self.max_deliveries = max_deliveries
        #: CANCEL, BEAT and INFO (``_control.py``): its task, and what it remembers.
        self.control = WorkerControl(self, self._rng)
        #: Set whenever a job finishes (the grace-period wait in stop() listens to it);
        #: made by that wait, in its event loop.
        self._jobs_changed: anyio.Event | None = None

    # ------------------------------------------------------------- config

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

    def _policy(self, job: Job, client: Client) -> EffectiveRetryPolicy:
        """The job's own retry policy, over the worker's ``retry=``, over the OJS defaults.

        The client that the worker consumes with plays no part: a producer's defaults
        (``connect(retry=...)``) were written into each job's envelope when it was built.
        """
        cached = self._defaults
        if cached is None or cached[0] is not self.retry:
            cached = self._defaults = (self.retry, merge(self.retry, DEFAULT_RETRY_POLICY))
        return resolve_retry(job.retry, cached[1])

    def add_listener(self, callback: Callable[[JobOutcome], None]) -> Callable[[], None]:
        """Call ``callback`` with every :class:`JobOutcome` (synchronously)."""
        self._listeners.append(callback)
        return lambda: self._listeners.remove(callback) if callback in self._listeners else None

    async def wait_ready(self) -> None:
        """Wait until every queue's consumer is registered."""
        await self._ready_event().wait()

    def _wake_stop_wait(self) -> None:
        if self._jobs_changed is not None:
            self._jobs_changed.set()

    def _ready_event(self) -> anyio.Event:
        if self._ready is None:
            self._ready = anyio.Event()
        return self._ready

    # ---------------------------------------------------------------- run

    async def run(self, client: Client) -> None:
        """Consume until cancelled or :meth:`stop`; returns after a graceful stop."""
        # Not reset here: a stop() that came before this task got going (a signal during
        # startup) must still count.  Reset on the way out, so the worker can run again.
        try:
            self._backend = _Backend()
            for queue in self.queues:
                await client.declare_queue(queue)
                await client.declare_redelivered_queue(queue)
            self._thread_limiter = anyio.CapacityLimiter(self.concurrency * len(self.queues))
            self._prepare_middleware()
            log.info(
                "worker %(worker)s starting: queues=%(queues)s concurrency=%(concurrency)d "
                "backend=%(backend)s broker=%(broker)s",
                {
                    "worker": self.worker_id, "queues": ",".join(self.queues),
                    "concurrency": self.concurrency, "backend": sniffio.current_async_library(),
                    "broker": client.conn.url.redacted(),
                },
                extra={"worker_id": self.worker_id, "queues": list(self.queues)},
            )  # fmt: skip
            async with anyio.create_task_group() as tg:
                self._tg = tg
                control_started = anyio.Event()
                control_scope = self.control.scope = anyio.CancelScope()
                tg.start_soon(self.control.serve, client, control_started)
                await control_started.wait()
                started = [anyio.Event() for _ in self.queues]
                self._queues_done = anyio.Event()
                self._queues_running = len(self.queues)
                for queue, ev in zip(self.queues, started, strict=True):
                    tg.start_soon(self._serve_queue, client, queue, ev)
                for ev in started:
                    await ev.wait()
                beat_scope = anyio.CancelScope()
                tg.start_soon(self.control.beat_loop, client, beat_scope)
                presence_scope = anyio.CancelScope()  # for observers: docs/jobs.md "Presence"
                presence = functools.partial(worker_presence, self)
                tg.start_soon(announce, client, presence, self.heartbeat_interval, presence_scope)
                self._ready_event().set()
                await self._wait_queues_done(started)
                beat_scope.cancel()
                presence_scope.cancel()
                control_scope.cancel()
        finally:
            # Also when run() fails: a later stop() must not start a task in a dead group.
            self._tg = None
            self._stopping = False
            self._ready = None
            self._jobs_changed = None

    async def _wait_queues_done(self, started: list[anyio.Event]) -> None:
        await self._queues_done.wait()

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
        for scope in list(self._fetch_scopes):
            scope.cancel()
        if self._tg is not None:
            self._tg.start_soon(self._enforce_grace)

    async def _enforce_grace(self) -> None:
        with anyio.move_on_after(self.grace_period):
            while self._running or self._settle_scopes:
                self._jobs_changed = anyio.Event()
                await self._jobs_changed.wait()
            return
        for scope, ctx in [entry for entries in self._running.values() for entry in entries]:
            log.warning("job %s still running after the grace period: cancelled, left unacked", ctx.id)
            ctx.abandoned = True
            scope.cancel()
        for scope in list(self._settle_scopes):
            scope.cancel()  # a settling publish still refused: left unacked as well

    async def _serve_queue(self, client: Client, queue: str, started: anyio.Event) -> None:
        names = client.names
        try:
            async with (
                client.conn.channel(confirms=True) as ch,
                ch.consume(names.job_queue(queue), prefetch=self.concurrency) as deliveries,
                client.conn.channel(confirms=True) as lone_ch,
                # Jobs whose delivery ended unsettled run one at a time, so a job that kills
                # its worker is the only one in flight when it does (see _move_redelivered).
                lone_ch.consume(names.redelivered_queue(queue), prefetch=1) as redelivered,
            ):
                started.set()
                async with anyio.create_task_group() as tg:
                    for _ in range(self.concurrency):
                        tg.start_soon(self._pull_loop, client, ch, queue, deliveries)
                    lone_loop = functools.partial(self._pull_loop, lone=True)
                    tg.start_soon(lone_loop, client, lone_ch, queue, redelivered)
        finally:
            self._queues_running -= 1
            if self._queues_running <= 0:
                self._queues_done.set()

    async def _pull_loop(
        self, client: Client, ch: amqp.Channel, queue: str, deliveries: amqp.Consumer, *, lone: bool = False
    ) -> None:
        # One scope for the task's whole life, not one per fetch: it is in _fetch_scopes
        # (where stop() cancels it) only while the task waits for a delivery, never while
        # it runs a job.
        backend = self._backend or _Backend()
        scope = backend.scope_type()
        idle = self._fetch_scopes
        with scope:
            while not self._stopping:
                idle.add(scope)
                try:
                    msg = await deliveries.__anext__()
                except StopAsyncIteration:
                    return
                finally:
                    idle.discard(scope)
                if lone:
                    await self._moves_settled()
                await self._handle(client, ch, queue, msg)

    async def _moves_settled(self) -> None:
        """Wait until every redelivered job this worker is moving has its original acked
        on the wire.  The copy can reach this worker's lone consumer as soon as the broker
        routed it, before the original's ack went out: run at once, a job that ends the
        process would take that ack with it, and the original would come back as a second
        copy."""
        while self._moving:
            self._moved = anyio.Event()
            await self._moved.wait()

    # ---------------------------------------------------------- one job

    async def _handle(self, client: Client, ch: amqp.Channel, queue: str, msg: amqp.IncomingMessage) -> None:
        a = Attempt(client, ch, queue, msg)
        try:
            await self._handle_one(a)
        except amqp.DELIVERY_LOST_ERRORS as exc:
            # The connection or channel died while settling, or stayed away longer than
            # publish_timeout: the job was not acked, so the broker redelivers it
            # (redelivered=True).  At-least-once, never lost.
            log.warning(
                "could not settle job %s (delivery %d) on %s: %s; the broker will redeliver it",
                msg.properties.message_id, msg.delivery_tag, queue, exc,
            )  # fmt: skip
        except Exception:
            # The backstop: a fault of ours with this one delivery (the handler's own errors
            # are decided on in _handle_one).  Dead-lettered, so it cannot stop this worker
            # or the next one; the worker carries on.
            job_id = msg.properties.message_id
            log.exception(
                "job %s on queue %s could not be processed; rejected into the dead-letter queue",
                job_id, queue, extra=log_extra(job_id, msg.properties.type, queue, 0),
            )  # fmt: skip
            with contextlib.suppress(*amqp.DELIVERY_LOST_ERRORS, amqp.DeliveryAlreadySettledError):
                await msg.nack(requeue=False)

    async def _handle_one(self, a: Attempt) -> None:
        """Admit the delivery (decode, checks), then run its handler and settle it."""
        admitted = await self._admit(a)
        if admitted is None:
            return
        spec, policy, max_attempts = admitted
        job = a.job
        assert job is not None
        ctx = JobContext(
            job=job, attempt=a.number, max_attempts=max_attempts, queue=a.queue, worker_id=self.worker_id,
            message=a.msg, policy=policy,
        )  # fmt: skip
        args = self._arguments(spec, ctx)
        if isinstance(args, Verdict):
            await self._settle(a, args)
            return
        timeout = self._timeout(job)
        # One scope per job serves as its timeout (the deadline) and as the handle that
        # CANCEL and the grace period use (they set a flag on ctx before cancelling it).
        backend = self._backend or _Backend()
        scope = backend.scope_type(deadline=backend.clock() + timeout)
        ctx.deadline = scope.deadline
        entry = (scope, ctx)
        same_id = self._running.get(job.id)
        if same_id is None:
            self._running[job.id] = [entry]
        else:
            same_id.append(entry)
        raised: BaseException | None = None
        result: Any = None
        try:
            with scope:  # tracing is middleware (_tracing.Tracing, added by _prepare_middleware)
                chain = self._handler_chain
                if chain is not None:
                    result = await chain(ctx, functools.partial(self._call_handler, spec, ctx, args, scope))
                elif spec.is_async:
                    result = await spec.fn(ctx, *args)
                else:
                    result = await self._run_sync(spec, ctx, args, scope)
        except backend.cancelled:
            raise  # the worker itself is being cancelled: leave the job unacked
        except KeyboardInterrupt:
            raise  # Ctrl-C reached the handler: the process is stopping, the job stays unacked
        except BaseException as exc:  # whatever the handler raised, decided on below
            # SystemExit included: a handler's sys.exit() (argparse inside a job) is the
            # handler's failure (HANDLER_PANIC), not a request to end the worker.  A signal
            # stops the worker gracefully through stop(), never through SystemExit.
            raised = exc
        finally:
            entries = self._running[job.id]
            if len(entries) == 1:
                del self._running[job.id]
            else:
                entries[:] = [e for e in entries if e is not entry]
            if self._stopping:  # only _enforce_grace (started by stop()) waits on it
                self._wake_stop_wait()
        verdict = decide(
            raised,
            cancelled_caught=scope.cancelled_caught,
            cancel_requested=ctx.cancel_requested,
            abandoned=ctx.abandoned,
            timeout=timeout,
            policy=policy,
            attempt=a.number,
            max_attempts=max_attempts,
            rng=self._rng,
        )
        await self._settle(a, verdict, result)

    async def _admit(self, a: Attempt) -> tuple[HandlerSpec, EffectiveRetryPolicy, int] | None:
        """Everything before the handler runs: decode the job, count unsettled deliveries,
        skip a cancelled job, find its handler and policy, refuse an expired one.  None when
        the delivery was settled here (or moved)."""
        msg = a.msg
        if msg.malformed is not None:
            await self._reject_malformed(a)
            return None
        headers = msg.properties.headers or {}
        # (A header once made the worker reject a job unrun, with no log line and no outcome:
        # any vhost client could set it.  It means nothing now; `dlq requeue` still strips it.)
        try:
            a.number = header_attempt(headers)
            job = a.job = _decode_delivered(msg.body)
        except InvalidJobError as exc:
            a.number = 1
            await self._settle(a, dead_letter(ErrorCode.INVALID_PAYLOAD, str(exc)))
            return None
        if msg.redelivered and await self._redelivered(a, headers):
            return None
        if self.control.was_cancelled(job.id):
            await msg.ack()
            log.info(
                "job %s type=%s queue=%s outcome=cancelled (cancelled before it started)",
                job.id, job.type, a.queue,
            )  # fmt: skip
            self._report(a.outcome(Outcome.CANCELLED, timed=False))
            return None
        spec = self._handlers.get(job.type)
        if spec is None:
            await self._unknown_type(a)
            return None
        try:
            policy = self._policy(job, a.client)
            max_attempts = header_max_attempts(headers, policy.max_attempts)
        except InvalidJobError as exc:
            await self._settle(a, dead_letter(ErrorCode.INVALID_PAYLOAD, str(exc)))
            return None
        if isinstance(job.expires_at, str) and parse_timestamp(job.expires_at) <= datetime.now(UTC):
            await self._settle(a, dead_letter(ErrorCode.EXPIRED, f"job expired at {job.expires_at}"))
            return None
        return spec, policy, max_attempts

    async def _redelivered(self, a: Attempt, headers: dict[str, Any]) -> bool:
        """A redelivered job: dead-lettered as WORKER_LOST past ``max_deliveries``, else
        moved to the redelivered queue.  True when the delivery was settled here."""
        lost = unsettled_deliveries(headers) + 1
        if lost >= self.max_deliveries:
            verdict = dead_letter(
                ErrorCode.WORKER_LOST,
                f"delivered {lost} times, and each delivery ended without a settlement (a worker "
                f"died or lost its connection holding it); max_deliveries is {self.max_deliveries}",
            )
            await self._settle(a, verdict)
            return True
        return await self._move_redelivered(a, lost)  # the copy carries the count

    @staticmethod
    def _arguments(spec: HandlerSpec, ctx: JobContext) -> list[Any] | Verdict:
        """The job's arguments converted for the handler, or the INVALID_ARGS dead-letter
        verdict when they do not fit its parameters."""
        job = ctx.job
        args = job.args
        try:
            # Checked against the arity worked out at registration; the full bind (which
            # words the error) only for handlers whose parameters need it.
            arity = spec.arity
            if arity is None or not arity[0] <= len(args) + 1 <= arity[1]:
                spec.signature.bind(ctx, *args)
            return spec.convert(args)
        except TypeError as exc:
            why = f"args {job.args!r} do not fit {spec.name}{spec.signature}: {exc}"
        except ArgumentsError as exc:
            why = str(exc)
        return dead_letter(ErrorCode.INVALID_ARGS, why)

    def _timeout(self, job: Job) -> float:
        """The job's timeout in seconds, below the broker's consumer timeout."""
        own_timeout = isinstance(job.timeout, int) and job.timeout > 0
        timeout = float(job.timeout) if own_timeout else self.default_timeout  # type: ignore[arg-type]
        # The broker's clock starts at delivery, and a job may wait prefetched before its
        # handler starts: keep a 10% margin below the consumer timeout.  The worker's own
        # default is capped silently; a job that asks for more is warned about.
        cap = self.broker_consumer_timeout * 0.9
        if timeout > cap and own_timeout:
            log.warning(
                "job %s has timeout %.0fs, longer than the broker's consumer timeout (%.0fs): "
                "the broker would close the channel and redeliver it; it is capped at %.0fs",
                job.id, timeout, self.broker_consumer_timeout, cap,
            )  # fmt: skip
        return min(timeout, cap)

    async def _reject_malformed(self, a: Attempt) -> None:
        """A delivery whose content header the codec let through as malformed
        (``msg.malformed``: a property or header key that is not UTF-8, headers nested too
        deep, a header larger than frame_max...).  Its properties cannot be trusted nor
        published again, so it is dead-lettered unrun with ``Basic.Nack(requeue=false)``:
        the job queue's dead-letter arguments take it to the DLQ as it is."""
        msg = a.msg
        await msg.nack(requeue=False)
        job_id = amqp.property_text(msg.properties.message_id)
        job_type = amqp.property_text(msg.properties.type)
        message = f"malformed message: {msg.malformed}"
        log.error(
            "job %(job_id)s type=%(job_type)s queue=%(queue)s outcome=dead_lettered "
            "code=%(code)s: %(message)s",
            {**a.fields(), "job_id": job_id, "job_type": job_type, "code": ErrorCode.INVALID_PAYLOAD,
             "message": message},
        )  # fmt: skip
        self._report(
            JobOutcome(
                id=job_id, type=job_type, queue=a.queue, attempt=1, outcome=Outcome.DEAD_LETTERED,
                error_code=ErrorCode.INVALID_PAYLOAD, error_message=message, duration=a.elapsed(),
            )
        )  # fmt: skip

    async def _reply(self, a: Attempt, job: Job, reply_to: str, verdict: Verdict, result: Any) -> None:
        """The job's final outcome to the pusher's result queue (``reply_to``, OJS AMQP binding
        §6.1).  Not mandatory: if the pusher has gone away its queue is gone and the broker
        drops the reply, so nothing here can hold the worker up beyond one confirm."""
        if verdict.action == "ack":
            body = encode_reply(job.id, "completed", result=result)
        else:
            message = verdict.detail or verdict.message
            error = {"code": verdict.code, "type": verdict.error_type, "message": message}
            body = encode_reply(job.id, "discarded", error=error)
        props = amqp.BasicProperties(
            content_type="application/json",
            message_id=job.id,
            correlation_id=a.msg.properties.correlation_id,
            type="ojs.result",
            app_id="ojs",
        )
        if not await self.control.may_reply_to(a.client, reply_to):
            log.warning(
                "job %s: reply_to %r is not a requester's own queue; the result is not sent there",
                job.id, reply_to,
            )  # fmt: skip
            return
        try:
            await a.ch.publish(body, exchange="", routing_key=reply_to, properties=props)
        except amqp.PublishError as exc:
            log.warning("job %s: the result reply to %r was refused: %s", job.id, reply_to, exc)

    async def _call_handler(
        self, spec: HandlerSpec, ctx: JobContext, args: list[Any], scope: anyio.CancelScope
    ) -> Any:
        if spec.is_async:
            return await spec.fn(ctx, *args)
        return await self._run_sync(spec, ctx, args, scope)

    def _prepare_middleware(self) -> None:
        """Build the handler chain and outcome hooks once per run (see Middleware)."""
        middleware = list(self.middleware)
        # Tracing goes first, so its span covers every other hook, as it covered the whole
        # handler call when it was built in; without a tracer provider it is left out.
        has_tracing = any(isinstance(m, _tracing.Tracing) for m in middleware)
        if self.tracing and not has_tracing and _tracing.recording():
            middleware.insert(0, _tracing.Tracing())
        has_metrics = any(isinstance(m, JobMetrics) for m in middleware)
        if self.metrics and not has_metrics and amqp.sdk_meter_provider_installed():
            middleware.append(JobMetrics())
        for m in middleware:
            if isinstance(m, JobMetrics):
                m.registered = frozenset(self._handlers)
        self._handler_chain = build_handler_chain(middleware)
        self._outcome_hooks = outcome_hooks(middleware)

    async def _settle(self, a: Attempt, verdict: Verdict, result: Any = None) -> None:
        """Carry out ``verdict`` on the broker, then report the outcome."""
        action = verdict.action
        job = a.job
        reply_to = a.msg.properties.reply_to
        if reply_to and job is not None and action in ("ack", "dead_letter"):
            try:
                await self._reply(a, job, reply_to, verdict, result)
            except amqp.DELIVERY_LOST_ERRORS:
                raise
            except Exception:  # a side channel: it never keeps the job from its settlement
                log.exception("job %s: the result reply to %r failed; the job is settled all the same",
                              job.id, reply_to)  # fmt: skip
        if action == "ack" or action == "cancelled":
            await a.msg.ack()
            outcome = Outcome.COMPLETED if action == "ack" else Outcome.CANCELLED
            self._report(a.outcome(outcome, result=result))
        elif action == "abandoned":
            # Left unacked: the broker redelivers it when the channel closes.
            self._report(a.outcome(Outcome.ABANDONED))
        elif action == "retry":
            await self._retry(a, verdict)
        else:
            assert verdict.code is not None
            await self._dead_letter(a, verdict.code, verdict.message, verdict.failure)

    async def _run_sync(
        self, spec: HandlerSpec, ctx: JobContext, args: list[Any], scope: anyio.CancelScope
    ) -> Any:
        """A plain ``def`` handler, in a worker thread bounded by the worker's concurrency.

        Not abandoned on cancel: a thread cannot be interrupted, so a timeout, CANCEL or
        the grace period waits for it to return (no thread outlives the worker), and what
        it returned or raised decides the job, as for a handler that finished in time."""
        result = await _pipeline.call(spec.fn, False, (ctx, *args), self._thread_limiter)
        late = anyio.current_time() >= scope.deadline
        if late or ctx.cancel_requested or ctx.abandoned:
            why = "its timeout" if late else "a CANCEL" if ctx.cancel_requested else "the grace period"
            log.warning(
                "job %s: sync handler %s ran past %s (a thread cannot be interrupted); its outcome counts",
                ctx.id, spec.name, why, extra=log_extra(ctx.id, ctx.job.type, ctx.queue, ctx.attempt),
            )  # fmt: skip
        return result

    async def _retry(self, a: Attempt, verdict: Verdict) -> None:
        """Through the retry ladder with the attempt number + 1 and the error headers
        (confirmed), then ack the original (001 §5.4)."""
        job, code, message, failure = a.job, verdict.code, verdict.message, verdict.failure
        assert job is not None and code is not None
        error = error_object(failure, verdict.error_type or "", verdict.detail)
        headers = {
            H_ATTEMPT: Int32(a.number + 1),
            H_ERROR_CODE: str(code),
            H_ERROR_MESSAGE: message[:1000],
            H_ERRORS: with_error(
                a.msg.properties.headers, code=str(code), message=message,
                error_type=str(error.get("type", "")) if error else "", attempt=a.number,
                at=format_timestamp(datetime.now(UTC)),
            ),
            **(error_headers(error) if error else {}),
        }  # fmt: skip
        # The previous attempt's error type and backtrace go, unless replaced.
        moved = await self._through_retry_queue(
            a, verdict.delay_ms, headers,
            drop=(H_ERROR_TYPE, H_ERROR_BACKTRACE), code=code, message=message, failure=failure,
        )  # fmt: skip
        if not moved:
            return
        _pipeline.log_failed_attempt(
            log, failure, a.log_extra(),
            f"{JOB_LINE} outcome=retried code=%(code)s delay=%(delay)dms: %(message)s",
            {**a.fields(), "code": code, "delay": verdict.delay_ms, "message": message},
        )
        self._report(
            a.outcome(
                Outcome.RETRIED, error_code=str(code), error_message=message, delay_ms=verdict.delay_ms,
                error=error,
            )
        )  # fmt: skip

    async def _move_redelivered(self, a: Attempt, lost: int) -> bool:
        """A redelivered job: its earlier delivery ended without a settlement (a worker died
        or lost its connection holding it, or a graceful stop left it).  Which job of those
        a dying worker held killed it, nobody knows, so each goes, as a copy that counts
        the unsettled deliveries (``x-ojs-unsettled-deliveries``), to
        ``ojs.queue.redelivered.{q}``, which every worker consumes one job at a time:
        there, a job that kills its worker is the only one it held, and only its count
        grows, up to ``max_deliveries`` (then WORKER_LOST).  Confirmed, then the original
        is acked.  Only redelivered jobs pay this.  True when done; False (the job then
        runs now, uncounted) if the broker refused the copy."""
        msg = a.msg
        props = with_headers(
            msg.properties, {H_UNSETTLED: lost}, drop=(H_DELIVERY_COUNT,),
            base=strip_dead_letter_headers(msg.properties.headers),
        )  # fmt: skip
        self._moving += 1
        try:
            return await self._move(a, lost, props)
        finally:
            self._moving -= 1
            if not self._moving and self._moved is not None:
                self._moved.set()

    async def _move(self, a: Attempt, lost: int, props: amqp.BasicProperties | None) -> bool:
        client, ch, queue, msg = a.client, a.ch, a.queue, a.msg
        published = await self._republish(
            ch, msg.body, exchange="", routing_key=client.names.redelivered_queue(queue),
            properties=props, mandatory=True,
            redeclare=functools.partial(client.declare_redelivered_queue, queue, again=True),
        )  # fmt: skip
        if published is None:
            return True  # the grace period ran out: left for the broker to redeliver
        if not published.confirmed:
            log.warning(
                "job %s on %s: redelivery %d could not be counted (%s); it runs uncounted",
                msg.properties.message_id, queue, lost, published.reason,
            )  # fmt: skip
            return False
        await msg.ack()
        # On the wire before the copy can run here (and perhaps end this process): a batched
        # ack lost with the process would leave the original to come back as a second copy.
        await client.conn.flush()
        log.info(
            "job %s on %s was delivered before and never settled (%d time%s): it runs again on its own",
            msg.properties.message_id, queue, lost, "" if lost == 1 else "s",
        )  # fmt: skip
        return True

    async def _unknown_type(self, a: Attempt) -> None:
        """A job of a type this worker has no handler for (a rolling deploy: pushed by new
        code before every worker runs it).  Within ``unknown_type_grace`` of the first time
        a worker met it, it goes back through the retry ladder, not counted as an attempt,
        so a worker that knows the type takes it once the delay passes; after that it is
        dead-lettered as ``INVALID_JOB_TYPE``."""
        job = a.job
        assert job is not None
        now_ms = int(time.time() * 1000)
        grace_ms = int(self.unknown_type_grace * 1000)
        since = header_since(a.msg.properties.headers, H_UNKNOWN_TYPE_SINCE, now_ms)
        waited_ms = now_ms - since
        reason = f"no handler registered for job type {job.type!r} on worker {self.worker_id}"
        if waited_ms >= grace_ms:
            if grace_ms:
                grace = self.unknown_type_grace
                reason += f" (for {waited_ms / 1000:.0f}s, past the {grace:g}s grace window)"
            await self._settle(a, dead_letter(ErrorCode.INVALID_JOB_TYPE, reason))
            return
        # Waits of about the time waited so far (1 s, 2 s, 5 s… at most a minute), on the
        # rungs of the retry ladder, never past the end of the window.
        ladder_ms = ladder_delay_ms(min(max(waited_ms, 1000), 60_000), max_ms=max(grace_ms - waited_ms, 1))
        headers = {H_UNKNOWN_TYPE_SINCE: since, H_ATTEMPT: Int32(a.number)}
        moved = await self._through_retry_queue(
            a, ladder_ms, headers, code=ErrorCode.INVALID_JOB_TYPE, message=reason
        )
        if not moved:
            return
        if job.type not in self._unknown_logged and len(self._unknown_logged) < 1000:
            self._unknown_logged.add(job.type)
            log.warning(
                "job type %r on queue %s has no handler on worker %s: its jobs go back through the "
                "retry queues for up to %gs (a worker that knows the type takes them), then to the "
                "dead-letter queue (logged once per type)",
                job.type, a.queue, self.worker_id, self.unknown_type_grace,
            )  # fmt: skip
        self._report(
            a.outcome(
                Outcome.DEFERRED, error_code=str(ErrorCode.INVALID_JOB_TYPE), error_message=reason,
                delay_ms=ladder_ms,
            )
        )  # fmt: skip

    async def _through_retry_queue(
        self,
        a: Attempt,
        ladder_ms: int,
        headers: dict[str, Any],
        *,
        drop: tuple[str, ...] = (),
        code: ErrorCode,
        message: str,
        failure: BaseException | None = None,
    ) -> bool:
        """Publish the job again through ``ojs.queue.retry.{q}.{ladder_ms}`` with ``headers``
        (confirmed), then ack the original.  True when that happened; otherwise the
        delivery was settled by the rule for refusals (docs/failure-handling.md)."""
        client, ch, queue, msg = a.client, a.ch, a.queue, a.msg
        await client.declare_retry_queue(queue, ladder_ms)
        props = with_headers(
            msg.properties, headers, drop=drop, base=strip_dead_letter_headers(msg.properties.headers)
        )
        published = await self._republish(
            ch,
            msg.body,
            exchange=client.names.retry_exchange,
            routing_key=client.names.retry_routing_key(queue, ladder_ms),
            properties=props,
            mandatory=True,
            redeclare=functools.partial(client.declare_retry_queue, queue, ladder_ms, again=True),
        )
        if published is None:
            return False  # the grace period ran out first: left for the broker to redeliver
        if published.final:
            why = f"{message} (the retry cannot be published: {published.reason})"
            await self._dead_letter(a, code, why, failure)
            return False
        if published.gave_up:
            await self._requeue(a, f"the retry was not confirmed: {published.reason}")
            return False
        await msg.ack()
        return True

    async def _dead_letter(
        self, a: Attempt, code: ErrorCode, message: str, failure: BaseException | None = None
    ) -> None:
        """``Basic.Nack(requeue=false)`` (or the opt-in annotated copy; ``_dead_letter.py``),
        an ERROR line with the failure's traceback, and the outcome."""
        await settle_dead_letter(
            a, code=str(code), message=message, publish=self._republish, annotate=self.annotate_dead_letters
        )  # with a death note unless annotated: _death_notes.py
        _pipeline.log_dead_letter(
            log, failure, a.log_extra(),
            f"{JOB_LINE} outcome=dead_lettered code=%(code)s: %(message)s",
            {**a.fields(), "code": code, "message": message},
        )
        self._report(
            a.outcome(
                Outcome.DEAD_LETTERED, error_code=str(code), error_message=message,
                error=error_object(failure, _error_type(failure) if failure else str(code), message),
            )
        )  # fmt: skip

    async def _requeue(self, a: Attempt, why: str) -> None:
        """Give the delivery back to the broker unchanged (``Basic.Nack``, requeue): a
        transient refusal of a settling publish must not change the job's fate."""
        await a.msg.nack(requeue=True)
        log.warning(
            f"{JOB_LINE} outcome=requeued: %(why)s; the broker delivers it again",
            {**a.fields(), "why": why}, extra=a.log_extra(),
        )  # fmt: skip
        self._report(a.outcome(Outcome.REQUEUED, error_message=why))

    async def _republish(self, ch: amqp.Channel, body: bytes, **publish: Any) -> amqp.Republished | None:
        """:func:`amqp.republish` under this worker's policy (``republish=``).

        ``None`` when a graceful stop's grace period ran out first: the delivery is left
        unsettled, and the broker redelivers it when the channel closes."""
        with anyio.CancelScope() as scope:
            self._settle_scopes.add(scope)
            try:
                return await amqp.republish(ch, body, policy=self.republish, rng=self._rng, **publish)
            finally:
                self._settle_scopes.discard(scope)
                if self._stopping:
                    self._wake_stop_wait()
        return None

    def _report(self, outcome: JobOutcome) -> None:
        self.counts[outcome.outcome] = self.counts.get(outcome.outcome, 0) + 1
        self.control.finished(outcome)
        if outcome.outcome in ("completed", "cancelled", "abandoned") and log.isEnabledFor(logging.INFO):
            fields = {
                "job_id": outcome.id, "job_type": outcome.type, "queue": outcome.queue,
                "attempt": outcome.attempt, "outcome": str(outcome.outcome), "duration": outcome.duration,
            }
            log.info(
                f"{JOB_LINE} outcome=%(outcome)s duration=%(duration).3fs", fields,
                extra=log_extra(outcome.id, outcome.type, outcome.queue, outcome.attempt),
            )  # fmt: skip
        if not (self._outcome_hooks or self._listeners):
            return
        for cb in (*self._outcome_hooks, *self._listeners):
            try:
                cb(outcome)
            except Exception:  # a listener's bug must not stop the worker
                log.exception("worker %s: outcome listener %r failed; carrying on", self.worker_id, cb)

    # ------------------------------------------------------------ control

    def cancel_job(self, job_id: str) -> bool:
        """Cancel a running job (CANCEL): it is acked and reported as cancelled."""
        entries = self._running.get(job_id)
        if not entries:
            return False
        for scope, ctx in entries:  # every delivery of that id
            ctx.cancel_requested = True
            scope.cancel()
        return True


def _decode_delivered(body: bytes) -> Job:
    """:func:`decode_job`, but an envelope without ``specversion`` is read as version 1.0.

    The binding's own publishing example (§15.1) sends ``{"id", "type", "queue", "args",
    "created_at"}`` without ``specversion``; jobs from that example must run here too.
    Everything else stays strict, and the body is never rewritten (retries and dead
    letters carry the bytes the producer sent).
    """
    try:
        return decode_job(body)
    except InvalidJobError as exc:
        if exc.field != "specversion":
            raise
        data = _json_decode.decode(body)  # decoded fine the first time
        if not isinstance(data, dict) or "specversion" in data:
            raise
        return job_from_dict({"specversion": SPEC_VERSION, **data})


def _error_type(exc: BaseException) -> str:
    return error_type_name(type(exc))


class _Backend:
    """The running backend's per-job primitives, looked up once per run: anyio finds the
    backend anew on every ``CancelScope()``, ``current_time()`` and
    ``get_cancelled_exc_class()``, which is a measurable share of a no-op job."""

    __slots__ = ("cancelled", "clock", "scope_type")

    def __init__(self) -> None:
        self.scope_type: Callable[..., anyio.CancelScope] = type(anyio.CancelScope())
        self.cancelled: type[BaseException] = anyio.get_cancelled_exc_class()
        self.clock: Callable[[], float]
        if self.cancelled is asyncio.CancelledError:
            self.clock = asyncio.get_running_loop().time  # what anyio.current_time() reads
        elif sniffio.current_async_library() == "trio":
            import trio

            self.clock = trio.current_time  # likewise
        else:
            self.clock = anyio.current_time


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
