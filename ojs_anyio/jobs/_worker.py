"""The OJS worker: FETCH, ACK, FAIL (001 §5.2-5.5), with retry and dead letters.

Per queue: one channel with publisher confirms, ``Basic.Qos(prefetch=concurrency)`` then
``Basic.Consume(no_ack=False)`` (AMQP-006/007), and ``concurrency`` long-lived tasks
pulling from the bounded delivery stream (no task per job).  Each job runs in its own
cancel scope under its ``timeout`` (default 1800 s).

Outcomes:

* success → ``Basic.Ack`` (AMQP-008);
* retryable failure → publish to ``ojs.exchange.retry`` (routing key ``{q}.{delay}``,
  delay on the bounded ladder) with ``x-ojs-attempt`` + 1 and the error headers, wait for
  the confirm, then ``Basic.Ack`` the original (001 §5.4, DECISIONS 2): a crash in between
  duplicates the job, never loses it;
* exhausted, non-retryable, discarded or bad input → dead letter (see below);
* the worker is stopping and the grace period ran out → the job is left unacked; the
  broker redelivers it when the channel closes.  Nothing is acked that did not complete.

Dead letters and their reason.  AMQP-009 requires the discard to be a
``Basic.Nack(requeue=false)``, and DECISIONS 3 requires the reason to travel in
``x-ojs-error-code`` / ``x-ojs-error-message``.  A Nack cannot add headers, so a dead job
makes one extra hop: the worker republishes the message, with the reason headers and
our marker ``x-ojs-dead-letter``, to the head of its own queue (priority 9, confirmed),
acks the original, and the worker that receives the marked copy Nacks it without
running it.  The broker's own dead-lettering then puts it in ``ojs.queue.dlx.{q}`` with
our headers and RabbitMQ's ``x-death``.  A marked copy is never executed by us.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import random
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.abc
import msgspec

from ojs_codec import Int32

from .. import amqp
from . import _tracing
from ._client import CONTROL_CANCEL, CONTROL_HEARTBEAT, CONTROL_INFO, Client
from ._decide import Verdict, dead_letter, decide
from ._envelope import SPEC_VERSION, Job, decode_job, format_timestamp, job_from_dict, parse_timestamp
from ._errors import ErrorCode, InvalidJobError
from ._retry import EffectiveRetryPolicy, RetryPolicy, merge, resolve_retry
from ._topology import strip_dead_letter_headers
from ._wire import (
    H_ATTEMPT,
    H_DEAD_LETTER,
    H_ERROR_CODE,
    H_ERROR_MESSAGE,
    H_MAX_ATTEMPTS,
    H_ORIGINAL_PRIORITY,
    header_int,
    with_headers,
)

__all__ = ["Handler", "JobContext", "JobOutcome", "Worker"]

log = logging.getLogger("ojs_anyio.worker")

_json = msgspec.json.Encoder()
_json_decode = msgspec.json.Decoder()

Handler = Callable[..., Awaitable[Any]]

DEFAULT_TIMEOUT = 1800.0
#: RabbitMQ's default consumer_timeout (30 min): an unacked delivery older than this gets
#: its channel closed with 406 PRECONDITION_FAILED (DECISIONS 7).
BROKER_CONSUMER_TIMEOUT = 1800.0


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
    outcome: str  # completed | retried | dead_lettered | cancelled | abandoned
    error_code: str | None = None
    error_message: str | None = None
    delay_ms: int | None = None
    duration: float = 0.0


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
        grace_period: float = 25.0,
        default_timeout: float = DEFAULT_TIMEOUT,
        worker_id: str | None = None,
        rng: random.Random | None = None,
        broker_consumer_timeout: float = BROKER_CONSUMER_TIMEOUT,
        heartbeat_interval: float = 5.0,
        cancel_memory: float = 3600.0,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.queues = list(queues)
        self.concurrency = concurrency
        self.retry = retry
        self.grace_period = grace_period
        self.default_timeout = default_timeout
        self.worker_id = worker_id or f"worker-{uuid.uuid4().hex[:12]}"
        self.broker_consumer_timeout = broker_consumer_timeout
        self._rng = rng or random.Random()
        #: (worker policy, client policy, the two merged): see _policy.
        self._defaults: tuple[RetryPolicy | None, RetryPolicy, RetryPolicy] | None = None
        #: job type -> (handler, its signature, (min, max) positional args incl. ctx or None)
        self._handlers: dict[str, tuple[Handler, inspect.Signature, tuple[int, float] | None]] = {}
        self._listeners: list[Callable[[JobOutcome], None]] = []
        self._stopping = False
        #: The scopes of the job tasks now waiting for a delivery (stop() cancels them).
        self._fetch_scopes: set[anyio.CancelScope] = set()
        self._backend: _Backend | None = None
        self._job_scopes: dict[str, tuple[anyio.CancelScope, JobContext]] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._ready = anyio.Event()
        self.active: dict[str, JobContext] = {}
        self.counts: dict[str, int] = {}
        self.heartbeat_interval = heartbeat_interval
        self.cancel_memory = cancel_memory
        #: Jobs cancelled before they reached this worker: job id -> when (monotonic); bounded.
        self._cancelled: OrderedDict[str, float] = OrderedDict()
        #: Liveness seen through BEAT messages: job id -> (worker id, monotonic time); bounded.
        self.liveness: OrderedDict[str, tuple[str, float]] = OrderedDict()
        #: Jobs this worker finished recently, for INFO: job id -> answer; bounded.
        self._recent: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._control_ch: amqp.Channel | None = None
        #: Set whenever a job finishes (the grace-period wait in stop() listens to it).
        self._jobs_changed = anyio.Event()

    # ------------------------------------------------------------- config

    def handler(self, job_type: str) -> Callable[[Handler], Handler]:
        """Decorator registering ``fn(ctx, *args)`` for ``job_type``."""

        def register(fn: Handler) -> Handler:
            self.register(job_type, fn)
            return fn

        return register

    def register(self, job_type: str, fn: Handler) -> None:
        signature = inspect.signature(fn)
        self._handlers[job_type] = (fn, signature, _positional_arity(signature))

    def _policy(self, job: Job, client: Client) -> EffectiveRetryPolicy:
        """The job's retry policy over the worker's over the client's (merged once per pair)."""
        cached = self._defaults
        if cached is None or cached[0] is not self.retry or cached[1] is not client.retry:
            cached = self._defaults = (self.retry, client.retry, merge(self.retry, client.retry))
        return resolve_retry(job.retry, cached[2])

    def add_listener(self, callback: Callable[[JobOutcome], None]) -> Callable[[], None]:
        """Call ``callback`` with every :class:`JobOutcome` (synchronously)."""
        self._listeners.append(callback)
        return lambda: self._listeners.remove(callback) if callback in self._listeners else None

    async def wait_ready(self) -> None:
        """Wait until every queue's consumer is registered."""
        await self._ready.wait()

    # ---------------------------------------------------------------- run

    async def run(self, client: Client) -> None:
        """Consume until cancelled or :meth:`stop`; returns after a graceful stop."""
        # Not reset here: a stop() that came before this task got going (a signal during
        # startup) must still count.  Reset on the way out, so the worker can run again.
        try:
            self._backend = _Backend()
            for queue in self.queues:
                await client.declare_queue(queue)
            async with anyio.create_task_group() as tg:
                self._tg = tg
                control_started = anyio.Event()
                tg.start_soon(self._serve_control, client, control_started)
                await control_started.wait()
                started = [anyio.Event() for _ in self.queues]
                self._queues_done = anyio.Event()
                self._queues_running = len(self.queues)
                for queue, ev in zip(self.queues, started, strict=True):
                    tg.start_soon(self._serve_queue, client, queue, ev)
                for ev in started:
                    await ev.wait()
                beat_scope = anyio.CancelScope()
                tg.start_soon(self._beat_loop, client, beat_scope)
                self._ready.set()
                await self._wait_queues_done(started)
                beat_scope.cancel()
                self._control_scope.cancel()
        finally:
            # Also when run() fails: a later stop() must not start a task in a dead group.
            self._tg = None
            self._stopping = False
            self._ready = anyio.Event()

    async def _wait_queues_done(self, started: list[anyio.Event]) -> None:
        await self._queues_done.wait()

    # ------------------------------------------------------ control plane

    async def _serve_control(self, client: Client, started: anyio.Event) -> None:
        """DECISIONS 6: an exclusive queue per worker bound to each control routing key, so
        every worker sees every CANCEL, BEAT and INFO; the durable control queue is declared too."""
        names = client.names
        self._control_scope = anyio.CancelScope()
        with self._control_scope:
            async with client.conn.channel(confirms=True) as ch:
                self._control_ch = ch
                info = await ch.queue_declare("", exclusive=True, auto_delete=True)
                for queue in self.queues:
                    await client.declare_control_queue(queue)
                    await ch.queue_bind(info.name, names.direct_exchange, names.control_routing_key(queue))
                async with ch.consume(info.name, prefetch=64) as messages:
                    started.set()
                    async for msg in messages:
                        await self._on_control(ch, msg)
                        await msg.ack()
        self._control_ch = None

    async def _on_control(self, ch: amqp.Channel, msg: amqp.IncomingMessage) -> None:
        kind = msg.properties.type
        try:
            data = _json_decode.decode(msg.body)
        except msgspec.DecodeError:
            log.warning("ignoring malformed control message %r: %r", kind, msg.body[:200])
            return
        job_id = data.get("job_id") if isinstance(data, dict) else None
        if not isinstance(job_id, str):
            log.warning("ignoring control message %r without a job_id", kind)
            return
        now = time.monotonic()
        if kind == CONTROL_CANCEL:
            if self.cancel_job(job_id):
                log.info("job %s: cancel requested, handler cancelled", job_id)
            else:
                _remember(self._cancelled, job_id, now, limit=10_000)
        elif kind == CONTROL_HEARTBEAT:
            worker_id = data.get("worker_id")
            if isinstance(worker_id, str):
                _remember(self.liveness, job_id, (worker_id, now), limit=10_000)
        elif kind == CONTROL_INFO:
            answer = self._info(job_id)
            if answer is not None and msg.properties.reply_to:
                await ch.publish(
                    _json.encode(answer),
                    exchange="",
                    routing_key=msg.properties.reply_to,
                    properties=amqp.BasicProperties(
                        correlation_id=msg.properties.correlation_id,
                        content_type="application/json",
                        app_id="ojs",
                    ),
                )

    def _info(self, job_id: str) -> dict[str, Any] | None:
        ctx = self.active.get(job_id)
        if ctx is not None:
            return {
                "job_id": job_id,
                "state": "active",
                "attempt": ctx.attempt,
                "worker_id": self.worker_id,
                "started_at": ctx.started_wall,
            }
        recent = self._recent.get(job_id)
        if recent is None:
            return None
        return {**recent, "finished_at": recent["finished_at"].text()}

    def _was_cancelled(self, job_id: str) -> bool:
        when = self._cancelled.get(job_id)
        if when is None:
            return False
        if time.monotonic() - when > self.cancel_memory:
            del self._cancelled[job_id]
            return False
        return True

    async def _beat_loop(self, client: Client, scope: anyio.CancelScope) -> None:
        """BEAT (001 §5.7): every ``heartbeat_interval``, one heartbeat per running job."""
        with scope:
            while True:
                await anyio.sleep(self.heartbeat_interval)
                ch = self._control_ch
                if ch is None:
                    continue
                for ctx in list(self.active.values()):
                    try:
                        await ch.publish(
                            _json.encode({"job_id": ctx.id, "worker_id": self.worker_id}),
                            exchange=client.names.direct_exchange,
                            routing_key=client.names.control_routing_key(ctx.queue),
                            properties=amqp.BasicProperties(
                                type=CONTROL_HEARTBEAT, content_type="application/json", app_id="ojs"
                            ),
                        )
                    except amqp.PublishError as exc:
                        log.warning("heartbeat for job %s not confirmed: %s", ctx.id, exc)

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
            while self._job_scopes:
                self._jobs_changed = anyio.Event()
                await self._jobs_changed.wait()
            return
        for scope, ctx in list(self._job_scopes.values()):
            log.warning("job %s still running after the grace period: cancelled, left unacked", ctx.id)
            ctx.abandoned = True
            scope.cancel()

    async def _serve_queue(self, client: Client, queue: str, started: anyio.Event) -> None:
        names = client.names
        try:
            async with (
                client.conn.channel(confirms=True) as ch,
                ch.consume(names.job_queue(queue), prefetch=self.concurrency) as deliveries,
            ):
                started.set()
                async with anyio.create_task_group() as tg:
                    for _ in range(self.concurrency):
                        tg.start_soon(self._pull_loop, client, ch, queue, deliveries)
        finally:
            self._queues_running -= 1
            if self._queues_running <= 0:
                self._queues_done.set()

    async def _pull_loop(
        self, client: Client, ch: amqp.Channel, queue: str, deliveries: amqp.Consumer
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
                await self._handle(client, ch, queue, msg)

    # ---------------------------------------------------------- one job

    async def _handle(self, client: Client, ch: amqp.Channel, queue: str, msg: amqp.IncomingMessage) -> None:
        try:
            await self._handle_one(client, ch, queue, msg)
        except (
            amqp.PublishOutcomeUnknownError,
            amqp.StaleDeliveryError,
            amqp.ChannelClosedError,
            amqp.ConnectionLostError,
        ) as exc:
            # The connection or channel died while settling: the job was not acked, so the
            # broker redelivers it (redelivered=True).  At-least-once, never lost.
            log.warning(
                "could not settle job %s (delivery %d) on %s: %s; the broker will redeliver it",
                msg.properties.message_id, msg.delivery_tag, queue, exc,
            )  # fmt: skip

    async def _handle_one(
        self, client: Client, ch: amqp.Channel, queue: str, msg: amqp.IncomingMessage
    ) -> None:
        headers = msg.properties.headers or {}
        started = time.monotonic()
        if headers.get(H_DEAD_LETTER):
            # A copy carrying its death reason: reject it into ojs.queue.dlx.{q} (AMQP-009).
            await msg.nack(requeue=False)
            return
        attempt = header_int(headers, H_ATTEMPT, 1)
        try:
            job = _decode_delivered(msg.body)
        except InvalidJobError as exc:
            verdict = dead_letter(ErrorCode.INVALID_PAYLOAD, str(exc))
            await self._settle(client, ch, queue, msg, None, attempt, verdict, started)
            return
        if self._was_cancelled(job.id):
            await msg.ack()
            log.info(
                "job %s type=%s queue=%s outcome=cancelled (cancelled before it started)",
                job.id,
                job.type,
                queue,
            )
            self._report(JobOutcome(job.id, job.type, queue, attempt, "cancelled"))
            return
        entry = self._handlers.get(job.type)
        if entry is None:
            verdict = dead_letter(
                ErrorCode.INVALID_JOB_TYPE,
                f"no handler registered for job type {job.type!r} on worker {self.worker_id}",
            )
            await self._settle(client, ch, queue, msg, job, attempt, verdict, started)
            return
        fn, signature, arity = entry
        try:
            policy = self._policy(job, client)
        except InvalidJobError as exc:
            verdict = dead_letter(ErrorCode.INVALID_PAYLOAD, str(exc))
            await self._settle(client, ch, queue, msg, job, attempt, verdict, started)
            return
        max_attempts = header_int(headers, H_MAX_ATTEMPTS, policy.max_attempts)
        if isinstance(job.expires_at, str) and parse_timestamp(job.expires_at) <= datetime.now(UTC):
            verdict = dead_letter(ErrorCode.EXPIRED, f"job expired at {job.expires_at}")
            await self._settle(client, ch, queue, msg, job, attempt, verdict, started)
            return
        ctx = JobContext(job, attempt, max_attempts, queue, self.worker_id, msg)
        try:
            # Checked against the arity worked out at registration; the full bind (which
            # words the error) only for handlers whose parameters need it.
            if arity is None or not arity[0] <= len(job.args) + 1 <= arity[1]:
                signature.bind(ctx, *job.args)
        except TypeError as exc:
            verdict = dead_letter(
                ErrorCode.INVALID_ARGS, f"args {job.args!r} do not fit {fn.__name__}{signature}: {exc}"
            )
            await self._settle(client, ch, queue, msg, job, attempt, verdict, started)
            return
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
        timeout = min(timeout, cap)
        # One scope per job serves as its timeout (the deadline) and as the handle that
        # CANCEL and the grace period use (they set a flag on ctx before cancelling it).
        backend = self._backend or _Backend()
        scope = backend.scope_type(deadline=backend.clock() + timeout)
        self._job_scopes[job.id] = (scope, ctx)
        self.active[job.id] = ctx
        raised: BaseException | None = None
        try:
            with (
                scope,
                _tracing.consumer_span(
                    headers, queue=queue, job_id=job.id, job_type=job.type, attempt=attempt
                ),
            ):
                await fn(ctx, *job.args)
        except backend.cancelled:
            raise  # the worker itself is being cancelled: leave the job unacked
        except BaseException as exc:  # whatever the handler raised, decided on below
            raised = exc
        finally:
            self._job_scopes.pop(job.id, None)
            self.active.pop(job.id, None)
            self._jobs_changed.set()
        verdict = decide(
            raised,
            cancelled_caught=scope.cancelled_caught,
            cancel_requested=ctx.cancel_requested,
            abandoned=ctx.abandoned,
            timeout=timeout,
            policy=policy,
            attempt=attempt,
            max_attempts=max_attempts,
            rng=self._rng,
        )
        await self._settle(client, ch, queue, msg, job, attempt, verdict, started)

    async def _settle(
        self,
        client: Client,
        ch: amqp.Channel,
        queue: str,
        msg: amqp.IncomingMessage,
        job: Job | None,
        attempt: int,
        verdict: Verdict,
        started: float,
    ) -> None:
        """Carry out ``verdict`` on the broker, then report the outcome."""
        action = verdict.action
        if action == "ack" or action == "cancelled":
            assert job is not None
            await msg.ack()
            outcome = "completed" if action == "ack" else "cancelled"
            self._report(
                JobOutcome(job.id, job.type, queue, attempt, outcome, duration=time.monotonic() - started)
            )
        elif action == "abandoned":
            # Left unacked: the broker redelivers it when the channel closes.
            assert job is not None
            self._report(
                JobOutcome(job.id, job.type, queue, attempt, "abandoned", duration=time.monotonic() - started)
            )
        elif action == "retry":
            assert job is not None and verdict.code is not None
            await self._retry(
                client, ch, queue, msg, job, attempt, verdict.code, verdict.message, verdict.delay_ms, started
            )
        else:
            assert verdict.code is not None
            await self._dead_letter(
                client, ch, queue, msg, job, attempt, verdict.code, verdict.message, started
            )

    async def _retry(
        self,
        client: Client,
        ch: amqp.Channel,
        queue: str,
        msg: amqp.IncomingMessage,
        job: Job,
        attempt: int,
        code: str,
        message: str,
        ladder_ms: int,
        started: float,
    ) -> None:
        names = client.names
        await client.declare_retry_queue(queue, ladder_ms)
        props = with_headers(
            msg.properties,
            {H_ATTEMPT: Int32(attempt + 1), H_ERROR_CODE: str(code), H_ERROR_MESSAGE: message[:1000]},
            base=strip_dead_letter_headers(msg.properties.headers),
        )
        try:
            await ch.publish(
                msg.body,
                exchange=names.retry_exchange,
                routing_key=names.retry_routing_key(queue, ladder_ms),
                properties=props,
                mandatory=True,
            )
        except (amqp.UnroutableError, amqp.PublishNackedError) as exc:
            await self._dead_letter(
                client,
                ch,
                queue,
                msg,
                job,
                attempt,
                code,
                f"{message} (retry publish failed: {exc})",
                started,
            )
            return
        await msg.ack()
        log.info(
            "job %s type=%s queue=%s attempt=%d outcome=retried code=%s delay=%dms: %s",
            job.id, job.type, queue, attempt, code, ladder_ms, message,
        )  # fmt: skip
        self._report(
            JobOutcome(
                job.id,
                job.type,
                queue,
                attempt,
                "retried",
                str(code),
                message,
                ladder_ms,
                time.monotonic() - started,
            )
        )

    async def _dead_letter(
        self,
        client: Client,
        ch: amqp.Channel,
        queue: str,
        msg: amqp.IncomingMessage,
        job: Job | None,
        attempt: int,
        code: str,
        message: str,
        started: float,
    ) -> None:
        props = with_headers(
            msg.properties,
            {
                H_ERROR_CODE: str(code),
                H_ERROR_MESSAGE: message[:1000],
                H_DEAD_LETTER: True,
                "x-ojs-dead-lettered-at": format_timestamp(datetime.now(UTC)),
                H_ORIGINAL_PRIORITY: Int32(msg.properties.priority or 0),
            },
        )
        props = _with_priority(props, 9)
        # First choice: the marked copy back through the job queue, to be Nacked into the
        # DLQ (AMQP-009).  If the job queue refuses it (full with reject-publish, or
        # unbound), keep the reason anyway: the copy, unmarked, straight to the DLX.  Each
        # publish is confirmed before the original is acked.
        copies = (
            (client.names.direct_exchange, props),
            (client.names.dlx_exchange, with_headers(props, {}, drop=(H_DEAD_LETTER,))),
        )
        for exchange, copy in copies:
            try:
                await ch.publish(
                    msg.body, exchange=exchange, routing_key=queue, properties=copy, mandatory=True
                )
            except (amqp.UnroutableError, amqp.PublishNackedError) as exc:
                log.warning("dead-letter copy of a job on %s refused via %r: %s", queue, exchange, exc)
                continue
            await msg.ack()
            break
        else:
            # Only x-death will say where it came from.
            log.error("dead-lettering a job on %s without its reason headers", queue)
            await msg.nack(requeue=False)
        job_id = job.id if job is not None else msg.properties.message_id
        job_type = job.type if job is not None else msg.properties.type
        log.info(
            "job %s type=%s queue=%s attempt=%d outcome=dead_lettered code=%s: %s",
            job_id, job_type, queue, attempt, code, message,
        )  # fmt: skip
        self._report(
            JobOutcome(
                job_id,
                job_type,
                queue,
                attempt,
                "dead_lettered",
                str(code),
                message,
                None,
                time.monotonic() - started,
            )
        )

    def _report(self, outcome: JobOutcome) -> None:
        self.counts[outcome.outcome] = self.counts.get(outcome.outcome, 0) + 1
        if outcome.job_id:
            state = _OUTCOME_STATE.get(outcome.outcome, outcome.outcome)
            _remember(
                self._recent,
                outcome.job_id,
                {
                    "job_id": outcome.job_id,
                    "state": state,
                    "attempt": outcome.attempt,
                    "worker_id": self.worker_id,
                    "finished_at": _FinishedAt(time.time()),
                },
                limit=1000,
            )
        if outcome.outcome in ("completed", "cancelled", "abandoned"):
            log.info(
                "job %s type=%s queue=%s attempt=%d outcome=%s duration=%.3fs",
                outcome.job_id, outcome.type, outcome.queue,
                outcome.attempt, outcome.outcome, outcome.duration,
            )  # fmt: skip
        for cb in list(self._listeners):
            cb(outcome)

    # ------------------------------------------------------------ control

    def cancel_job(self, job_id: str) -> bool:
        """Cancel a running job (CANCEL): it is acked and reported as cancelled."""
        entry = self._job_scopes.get(job_id)
        if entry is None:
            return False
        scope, ctx = entry
        ctx.cancel_requested = True
        scope.cancel()
        return True


_OUTCOME_STATE = {
    "completed": "completed",
    "retried": "retryable",
    "dead_lettered": "discarded",
    "cancelled": "cancelled",
    "abandoned": "available",
}


def _decode_delivered(body: bytes) -> Job:
    """:func:`decode_job`, but an envelope without ``specversion`` is read as version 1.0.

    001 §15.1, the binding's own publishing example, sends ``{"id", "type", "queue",
    "args", "created_at"}`` without ``specversion``; DECISIONS 12 wants jobs from those
    examples to run.  Everything else stays strict, and the body is never rewritten
    (retries and dead letters carry the bytes the producer sent).
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


class _FinishedAt(float):
    """A finish time kept as epoch seconds; formatted only if INFO asks for it."""

    __slots__ = ()

    def text(self) -> str:
        return format_timestamp(datetime.fromtimestamp(self, UTC))


def _positional_arity(signature: inspect.Signature) -> tuple[int, float] | None:
    """``(min, max)`` positional arguments a handler takes (``max`` may be infinite), or
    ``None`` when a keyword-only parameter without a default makes positional calls fail."""
    low, high = 0, 0.0
    for param in signature.parameters.values():
        if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            high += 1
            if param.default is param.empty:
                low += 1
        elif param.kind is param.VAR_POSITIONAL:
            high = math.inf
        elif param.kind is param.KEYWORD_ONLY and param.default is param.empty:
            return None
    return low, high


def _remember(table: OrderedDict[str, Any], key: str, value: Any, *, limit: int) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > limit:
        table.popitem(last=False)


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
        else:
            self.clock = anyio.current_time


def _with_priority(props: amqp.BasicProperties, priority: int) -> amqp.BasicProperties:
    return msgspec.structs.replace(props, priority=priority)
