"""The OJS client: topology, PUSH (single and batch), and dead-letter management.

Reading a push from ``Client.push()`` to the socket: this file builds the job and its
properties (``_wire.job_properties``), publishes with ``amqp.Channel.publish``
(``ojs_anyio/amqp/_publish.py``), which encodes through ``ojs_codec`` and writes in
``ojs_anyio/amqp/_transport.py``.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar

import anyio
import anyio.abc
import msgspec

from ojs_anyio.amqp import UsageError

from .. import amqp
from . import _tracing
from ._args import check_json_args
from ._control import CONTROL_CANCEL, CONTROL_HEARTBEAT, CONTROL_INFO, SYNC_CANCEL_DETAIL
from ._dead_letters import DeadJob, DeadLetters, return_to_queue
from ._declarer import Declarer
from ._dedup import DEFAULT_IDEMPOTENCY_WINDOW, DuplicateJobError, check_window, claim, lock_queue, release
from ._durations import DurationLike, duration_ms, duration_seconds
from ._envelope import Job, format_timestamp, new_job
from ._errors import (
    ArgumentTypeError,
    DelayOutOfRangeError,
    PushError,
    SchedulerUnavailableError,
)
from ._info import ClientControl, JobInfo
from ._middleware import Middleware, build_push_chain, check_middleware, overrides
from ._results import JobFailedError, PendingResult, ResultRouter
from ._retry import RetryPolicy, merge
from ._route import Route, route
from ._sending import SEND_FAILURES, UNAVAILABLE, SendDeadline, before_sending, push_error
from ._topology import (
    MAX_DELAY_MS,
    Names,
    QueueOptions,
    delayed_exchange_arguments,
    delayed_plugin_exchange,
)
from ._unique import unique_lock
from ._wire import (
    job_message,
)

__all__ = [
    "SYNC_CANCEL_DETAIL",
    "CONTROL_CANCEL",
    "CONTROL_HEARTBEAT",
    "CONTROL_INFO",
    "JobInfo",
    "Client",
    "DeadLetters",
    "DeadJob",
    "PushResult",
    "connect",
    "return_to_queue",
]

R = TypeVar("R")

log = logging.getLogger("ojs_anyio.jobs")

_json = msgspec.json.Encoder()
_json_decode = msgspec.json.Decoder()

DEFAULT_URL = "amqp://guest:guest@localhost:5672/"
#: How scheduled jobs are delayed: the binary delay levels (no plugin), the
#: delayed-message-exchange plugin, or the plugin when the broker has it (detected, never assumed).
SCHEDULERS = ("levels", "plugin", "auto")


@dataclass(frozen=True, slots=True)
class PushResult:
    """One job of a batch: ``error`` is None when the broker confirmed it."""

    job: Job
    error: PushError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class Client:
    """What ``async with ojs_anyio.connect(...) as client`` yields."""

    def __init__(
        self,
        conn: amqp.Connection,
        *,
        names: Names,
        declare: str = "lazy",
        queue_options: QueueOptions | dict[str, QueueOptions] | None = None,
        retry: RetryPolicy | None = None,
        scheduler: str = "levels",
        middleware: Sequence[Middleware] | None = None,
        confirm_timeout: float | None = amqp.DEFAULT_CONFIRM_TIMEOUT,
    ) -> None:
        if declare not in ("eager", "lazy"):
            raise UsageError("declare must be 'eager' or 'lazy'")
        if scheduler not in SCHEDULERS:
            raise UsageError(f"scheduler must be one of {', '.join(SCHEDULERS)}, got {scheduler!r}")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ArgumentTypeError(
                f"retry must be an ojs_anyio.RetryPolicy or None, not {type(retry).__name__}"
            )
        if retry is not None and retry.carries_classes():
            raise ArgumentTypeError(_CLASSES_ON_THE_WIRE.format(where="connect(retry=...)"))
        if queue_options is not None and not isinstance(queue_options, QueueOptions | dict):
            raise ArgumentTypeError(
                "queue_options must be a QueueOptions, a dict of queue name -> QueueOptions, or None, "
                f"not {type(queue_options).__name__}"
            )
        self.conn = conn
        #: Seconds a push waits for the broker's confirm once the job was sent (None: until
        #: it comes or the connection is declared dead), then PushOutcomeUnknownError.
        self.confirm_timeout = confirm_timeout
        #: Around-hooks of every push (first = outermost); see :class:`Middleware`.
        self.middleware: tuple[Middleware, ...] = check_middleware(middleware)
        self._push_hooks = tuple(m for m in self.middleware if overrides(m, "around_push"))
        #: Set by connect(): the task group of the result queue's reader.
        self._tg: anyio.abc.TaskGroup | None = None
        self._results: ResultRouter | None = None
        #: "levels" or "plugin" once resolved; "auto" until the first scheduled push (or
        #: :meth:`resolve_scheduler`) has asked the broker.
        self.scheduler = scheduler
        #: Options for the short-lived connection of :meth:`detect_delayed_plugin`.
        self._probe_options: dict[str, Any] = {}
        self.names = names
        self.declare = declare
        #: The producer's retry defaults: the fields it sets are written into every job this
        #: client builds that does not set them itself (so they become the job's own policy).
        self.retry = retry
        self._channel: amqp.Channel | None = None
        #: The one place the job topology is declared (``_declarer.py``).
        self.declarer = Declarer(conn, names, self.channel, queue_options)
        self._channel_lock = anyio.Lock()
        #: Sending CANCEL, BEAT and INFO, and INFO's reply queue (``_info.py``).
        self.control = ClientControl(self)

    # ------------------------------------------------------------ plumbing

    async def channel(self) -> amqp.Channel:
        """The client's publishing channel (confirms on); re-opened after a channel error."""
        ch = self._channel
        if ch is not None and not ch.is_closed:
            return ch
        async with self._channel_lock:
            if self._channel is None or self._channel.is_closed:
                ch = self.conn.channel(confirms=True)
                await ch.open()
                self._channel = ch
            return self._channel

    async def aclose(self) -> None:
        await self.control.aclose()
        ch, self._channel = self._channel, None
        if ch is not None:
            await ch.aclose()

    def queue_options(self, queue: str) -> QueueOptions | None:
        return self.declarer.queue_options(queue)

    @property
    def shared_queue_options(self) -> QueueOptions | None:
        """The one :class:`QueueOptions` this client applies to every queue, or None (none,
        or one per queue).  Queues shared by all job queues (delay levels, a scheduler's
        leader queue) are quorum only when this says so."""
        return self.declarer.shared_queue_options

    # ------------------------------------------- topology (the Declarer's)

    async def declare_queue(self, queue: str) -> None:
        """Declare (idempotently) the exchanges, ``ojs.queue.{q}``, ``ojs.queue.dlx.{q}`` and
        their bindings.  A queue that exists with other arguments raises
        :class:`TopologyConflictError` naming it and showing both argument sets."""
        await self.declarer.declare_queue(queue)

    async def declare_redelivered_queue(self, queue: str, *, again: bool = False) -> None:
        """Declare ``ojs.queue.redelivered.{q}`` (see :meth:`Declarer.declare_redelivered_queue`)."""
        await self.declarer.declare_redelivered_queue(queue, again=again)

    async def use_existing_queue(self, queue: str) -> amqp.QueueInfo:
        """Check that ``ojs.queue.{q}`` exists and push to it as it is, without declaring
        it (so a queue declared with other :class:`QueueOptions` is not re-declared).
        Raises :class:`QueueNotFoundError` if the queue does not exist.  Used by
        ``ojs-anyio push``."""
        return await self.declarer.use_existing_queue(queue)

    async def declare_retry_queue(self, queue: str, delay_ms: int, *, again: bool = False) -> None:
        """Declare ``ojs.queue.retry.{q}.{delay_ms}`` exactly as 001 §8.2, bound to the retry exchange."""
        await self.declarer.declare_retry_queue(queue, delay_ms, again=again)

    async def declare_delay_levels(self) -> None:
        """Declare the 32 binary delay levels shared by every queue (docs/scheduling.md)."""
        await self.declarer.declare_delay_levels()

    async def declare_control_queue(self, queue: str) -> None:
        """The durable ``ojs.queue.control.{q}`` (see :meth:`Declarer.declare_control_queue`)."""
        await self.declarer.declare_control_queue(queue)

    async def declare_eagerly(self, queues: Iterable[str]) -> None:
        """Eager declaration (001 §7.3): everything a queue needs, before the first job.

        The direct, dead-letter and retry exchanges; for each queue its job queue, dead-letter
        queue and control queue with their bindings; and, with the default scheduler, the
        binary delay levels and each queue's landing queue.  Retry delay queues are declared
        on a job's first retry (each needs its delay).  Idempotent.
        """
        for queue in queues:
            await self.declare_queue(queue)
            await self.declare_control_queue(queue)
            if self.scheduler == "levels":
                await self.declarer.landing(queue)

    # ------------------------------------------- delayed-message-exchange plugin

    async def detect_delayed_plugin(self, *, timeout: float = 10.0) -> bool:
        """Whether the broker has the rabbitmq-delayed-message-exchange plugin (scheduling:
        detected, not assumed).

        Declares a throwaway ``x-delayed-message`` exchange and deletes it again, on a
        separate short-lived connection: RabbitMQ answers an unknown exchange type with
        the *connection-level* error 503 COMMAND_INVALID, which would close this client's
        connection (and every channel and consumer on it).  That answer gives ``False``;
        any other failure (unreachable broker, 403 ACCESS_REFUSED…) is raised.
        """
        probe = f"{self.names.prefix}ojs.probe.delayed.{uuid.uuid4().hex[:12]}"
        options = {**self._probe_options, "recovery": amqp.RecoveryPolicy(enabled=False)}
        try:
            with anyio.fail_after(timeout):
                async with (
                    amqp.connect(self.conn.url, **options) as conn,
                    conn.channel(confirms=False) as ch,
                ):
                    await ch.exchange_declare(
                        probe, "x-delayed-message", auto_delete=True, arguments=delayed_exchange_arguments()
                    )
                    await ch.exchange_delete(probe)
        except amqp.AMQPError as exc:
            if getattr(exc, "reply_code", None) == 503 and "x-delayed-message" in str(exc):
                return False
            raise
        return True

    async def resolve_scheduler(self) -> str:
        """Settle ``scheduler="auto"`` (or check ``"plugin"``) against the broker, once.

        Returns the scheduler in use, "levels" or "plugin".  ``"plugin"`` on a broker
        without the plugin raises :class:`SchedulerUnavailableError`.
        """
        if self.scheduler == "levels" or (self.scheduler == "plugin" and self.declarer.delayed_declared):
            return self.scheduler
        present = await self.detect_delayed_plugin()
        if self.scheduler == "plugin" and not present:
            raise SchedulerUnavailableError(
                "scheduler='plugin' needs the rabbitmq-delayed-message-exchange plugin, and the broker "
                f"at {self.conn.url.redacted()} does not have it (exchange type 'x-delayed-message' is "
                "unknown); enable it (rabbitmq-plugins enable rabbitmq_delayed_message_exchange) or use "
                "scheduler='levels' or 'auto'"
            )
        if present:
            await self.declarer.declare_exchange(delayed_plugin_exchange(self.names))
            self.declarer.delayed_declared = True
        self.scheduler = "plugin" if present else "levels"
        log.info("scheduled jobs use the %s", "delayed-message plugin" if present else "binary delay levels")
        return self.scheduler

    # --------------------------------------------------------------- PUSH

    def build(
        self,
        type: str,
        args: Sequence[Any] = (),
        *,
        queue: str = "default",
        priority: int | None = None,
        timeout: DurationLike | None = None,
        retry: RetryPolicy | None = None,
        meta: dict[str, Any] | None = None,
        scheduled_at: datetime | None = None,
        delay: DurationLike | None = None,
        expires_at: datetime | None = None,
        id: str | None = None,
    ) -> Job:
        """Build (and validate) a job without pushing it.

        ``args`` must be JSON values (see :func:`check_json_args`); ``timeout`` (whole
        seconds) and ``delay`` take a number of seconds, a ``timedelta`` or an ISO 8601
        duration.  ``retry`` is merged over the client's ``connect(retry=...)``: the result
        is the job's own policy, carried in its envelope.
        """
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
                raise ArgumentTypeError(
                    f"retry must be an ojs_anyio.RetryPolicy or None, not {type(retry).__name__}"
                )
            _check_job_policy(retry)
        if self.retry is not None:
            retry = self.retry if retry is None else merge(retry, self.retry)
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

    async def push(
        self,
        type: str,
        args: Sequence[Any] = (),
        *,
        queue: str = "default",
        priority: int | None = None,
        timeout: DurationLike | None = None,
        retry: RetryPolicy | None = None,
        meta: dict[str, Any] | None = None,
        scheduled_at: datetime | None = None,
        delay: DurationLike | None = None,
        expires_at: datetime | None = None,
        idempotency_key: str | None = None,
        idempotency_window: DurationLike = DEFAULT_IDEMPOTENCY_WINDOW,
        id: str | None = None,
    ) -> Job:
        """PUSH one job; return it once the broker confirmed it (001 §5.1).

        Raises :class:`UnroutableJobError` (its queue doesn't exist), :class:`QueueFullError`
        (QUEUE_FULL), :class:`PushNotSentError` (not sent: the connection was not usable
        within ``publish_timeout``; the job is not enqueued), :class:`PushOutcomeUnknownError`
        (sent, then the connection was lost or ``confirm_timeout`` passed before the
        confirm); ``TypeError`` for an argument JSON cannot carry.

        ``idempotency_key``: a second push with the same key within ``idempotency_window``
        (default 24 h), from any client of the broker, raises :class:`DuplicateJobError`
        and publishes nothing (a lock queue per key; see ``docs/jobs.md`` for its cost).
        """
        job = self.build(
            type,
            args,
            queue=queue,
            priority=priority,
            timeout=timeout,
            retry=retry,
            meta=meta,
            scheduled_at=scheduled_at,
            delay=delay,
            expires_at=expires_at,
            id=id,
        )
        return await self._push_through(job, idempotency_key, idempotency_window, None)

    async def push_for_result(
        self,
        type: str,
        args: Sequence[Any] = (),
        *,
        idempotency_key: str | None = None,
        idempotency_window: DurationLike = DEFAULT_IDEMPOTENCY_WINDOW,
        **options: Any,
    ) -> PendingResult[Any]:
        """PUSH one job that carries ``reply_to`` = this client's result queue; returns a
        :class:`PendingResult` once the broker confirmed it: ``await pending.result(timeout=…)``.

        ``options`` are :meth:`push`'s.  See :mod:`ojs_anyio.jobs._results` (and
        ``docs/job-api.md``) for what happens when this client goes away first.
        """
        job = self.build(type, args, **options)
        return await self.push_job_for_result(
            job, idempotency_key=idempotency_key, idempotency_window=idempotency_window
        )

    async def push_job_for_result(
        self,
        job: Job,
        *,
        idempotency_key: str | None = None,
        idempotency_window: DurationLike = DEFAULT_IDEMPOTENCY_WINDOW,
        convert: Callable[[Any], R] | None = None,
    ) -> PendingResult[R]:
        """:meth:`push_for_result` for a job built with :meth:`build`."""
        _check_pushable(job)
        router = self._result_router()
        try:
            with before_sending(SendDeadline(self.conn)):
                reply_to = await router.reply_to()
        except UNAVAILABLE as exc:
            raise push_error(exc, job) from exc
        pending: PendingResult[R] = router.expect(job, convert)
        try:
            pushed = await self._push_through(job, idempotency_key, idempotency_window, reply_to)
        except BaseException:
            router.forget(job.id)
            raise
        if pushed.id != job.id:  # a middleware replaced the job: wait for the one sent
            router.forget(job.id)
            pending = router.expect(pushed, convert)
        pending.job = pushed
        return pending

    def _result_router(self) -> ResultRouter:
        if self._results is None:
            if self._tg is None:
                raise UsageError("push_for_result needs a client from ojs_anyio.connect()")
            self._results = ResultRouter(self.conn, self._tg)
        return self._results

    async def _push_through(
        self, job: Job, idempotency_key: str | None, window: DurationLike | None, reply_to: str | None
    ) -> Job:
        """One push, wrapped by the middleware's ``around_push`` hooks (if any)."""
        if not self._push_hooks:
            return await self._push_job(
                job, idempotency_key=idempotency_key, window=window, reply_to=reply_to
            )

        async def publish(changed: Job) -> Job:
            _check_pushable(changed)
            return await self._push_job(
                changed, idempotency_key=idempotency_key, window=window, reply_to=reply_to
            )

        return await build_push_chain(self._push_hooks, publish)(job)

    async def push_job(
        self,
        job: Job,
        *,
        idempotency_key: str | None = None,
        idempotency_window: DurationLike | None = DEFAULT_IDEMPOTENCY_WINDOW,
    ) -> Job:
        """PUSH a job built with :meth:`build` (or :func:`new_job`); see :meth:`push`.

        ``idempotency_window=None`` writes ``idempotency_key`` to ``x-ojs-idempotency-key``
        as a label and claims nothing (the cron scheduler labels each tick so; its leader
        lease, not the key, keeps a tick from firing twice)."""
        _check_pushable(job)
        return await self._push_through(job, idempotency_key, idempotency_window, None)

    async def _push_job(
        self,
        job: Job,
        *,
        idempotency_key: str | None = None,
        window: DurationLike | None = None,
        reply_to: str | None = None,
    ) -> Job:
        """The push itself.  With a ``window``, the ``idempotency_key`` is claimed first (a
        duplicate raises); without one (the scheduler's label for a tick) it is only written
        to ``x-ojs-idempotency-key``."""
        ignore = False
        if not isinstance(job.unique, msgspec.UnsetType):
            if idempotency_key is not None and window is not None:
                raise UsageError(f"job {job.id}: give a unique policy or an idempotency_key, not both")
            idempotency_key, window, ignore = unique_lock(job)  # the fingerprint, for the period
        if idempotency_key is None or window is None:
            return await self._publish_job(job, idempotency_key, reply_to)
        if not isinstance(idempotency_key, str) or not idempotency_key:
            raise ArgumentTypeError(f"idempotency_key must be a non-empty str, got {idempotency_key!r}")
        window_ms = duration_ms(window, "idempotency_window", allow_zero=False)
        check_window(window_ms)
        lock = lock_queue(self.names.prefix, idempotency_key, window_ms)
        deadline = SendDeadline(self.conn)
        try:
            with before_sending(deadline):
                # Before the claim: a topology error keeps the key free.
                await self.declare_queue(job.queue)
            # Not under the deadline: cut after its marker was sent, the key's state is unknown.
            await claim(
                self.conn, lock, window_ms, key=idempotency_key, job_id=job.id, queue=job.queue,
                record_holder=ignore,
            )  # fmt: skip
        except DuplicateJobError as exc:
            if ignore and exc.existing_job_id:  # unique on_conflict="ignore": the existing job
                return msgspec.structs.replace(job, id=exc.existing_job_id)
            raise
        except SEND_FAILURES as exc:
            raise push_error(exc, job) from exc
        try:
            return await self._publish_job(job, idempotency_key, reply_to, deadline)
        except BaseException:
            # Free the key, so that pushing again can succeed (at least once, as everywhere).
            with anyio.CancelScope(shield=True):
                try:
                    await release(await self.channel(), lock)
                except (amqp.AMQPError, OSError) as exc:
                    log.warning(
                        "could not release idempotency key %r of job %s: %s", idempotency_key, job.id, exc
                    )
            raise

    async def _publish_job(
        self,
        job: Job,
        idempotency_key: str | None,
        reply_to: str | None = None,
        deadline: SendDeadline | None = None,
    ) -> Job:
        if deadline is None:
            deadline = SendDeadline(self.conn)
        try:
            with before_sending(deadline):
                now = datetime.now(UTC)
                route = await self._route(job, now)
        except UNAVAILABLE as exc:
            raise push_error(exc, job) from exc
        # The message's trace headers are written inside the PRODUCER span, so the worker's
        # CONSUMER span becomes its child (001 §12.2).
        with _tracing.producer_span(job, self.names.direct_exchange) as span:
            try:
                pushed = as_enqueued(job, route, now)  # what the body carries, and push returns
                props, body = self._message(pushed, route, idempotency_key, reply_to, now)
                with before_sending(deadline):
                    ch = await self.channel()
                if route.exchange != self.names.direct_exchange:
                    span.set_attribute("messaging.destination.name", route.exchange)
                await ch.publish(
                    body,
                    exchange=route.exchange,
                    routing_key=route.routing_key,
                    properties=props,
                    mandatory=route.mandatory,
                    timeout=deadline.left(),
                    confirm_timeout=self.confirm_timeout,
                )
            except SEND_FAILURES as exc:
                raise push_error(exc, job) from exc
        return pushed

    async def push_batch(self, jobs: Iterable[Job], *, max_in_flight: int = 1024) -> list[PushResult]:
        """PUSH many jobs pipelined on one channel (one round trip's latency, not one per job).

        Returns one :class:`PushResult` per job, in order; a failed job doesn't stop the others.
        Errors are :meth:`push`'s: while the connection is away, the first job waits up to
        ``publish_timeout`` and every job not sent gets :class:`PushNotSentError` (the others
        at once); the confirms are awaited up to ``confirm_timeout`` after the last job was sent.
        """
        jobs = list(jobs)
        if self._push_hooks:
            jobs = [await self._through_hooks(job) for job in jobs]
        for job in jobs:
            _check_pushable(job)
        # One publish_timeout for the waits before a job is sent, restarted by each job
        # sent: while the connection stays away, the first job waits and the rest fail at once.
        deadline = SendDeadline(self.conn)
        try:
            with before_sending(deadline):
                for queue in {j.queue for j in jobs}:
                    await self.declare_queue(queue)
                ch = await self.channel()
        except UNAVAILABLE as exc:
            return [PushResult(job, push_error(exc, job)) for job in jobs]
        window = ch.publish_window(max_in_flight=max_in_flight)
        handles: list[amqp.PublishHandle | PushError] = []
        sent: list[Job] = []  # each job as its result reports it: as enqueued once sent
        for job in jobs:
            pushed = job
            with _tracing.producer_span(job, self.names.direct_exchange) as span:
                try:
                    with before_sending(deadline):
                        now = datetime.now(UTC)
                        route = await self._route(job, now)
                    pushed = as_enqueued(job, route, now)
                    props, body = self._message(pushed, route, None, None, now)
                    if route.exchange != self.names.direct_exchange:
                        span.set_attribute("messaging.destination.name", route.exchange)
                    handles.append(
                        await window.publish(
                            body,
                            exchange=route.exchange,
                            routing_key=route.routing_key,
                            properties=props,
                            mandatory=route.mandatory,
                            timeout=deadline.left(),
                        )
                    )
                    deadline.restart()
                except SEND_FAILURES as exc:
                    pushed = job  # not sent: the job as built
                    handles.append(push_error(exc, job))
            sent.append(pushed)
        await window.wait_all(self.confirm_timeout)
        results: list[PushResult] = []
        for job, handle in zip(sent, handles, strict=True):
            if isinstance(handle, PushError):
                results.append(PushResult(job, handle))
            elif handle.error is not None:
                results.append(PushResult(job, push_error(handle.error, job)))
            else:
                results.append(PushResult(job))
        return results

    async def _through_hooks(self, job: Job) -> Job:
        """``push_batch``: the job as the ``around_push`` hooks leave it (the batch is
        published afterwards, so their ``call_next`` only hands the job back)."""

        async def record(changed: Job) -> Job:
            return changed

        return await build_push_chain(self._push_hooks, record)(job)

    def _message(
        self, job: Job, route: Route, idempotency_key: str | None, reply_to: str | None, now: datetime
    ) -> tuple[amqp.BasicProperties, bytes]:
        """The job's message along ``route`` (``_wire.job_message``; no I/O)."""
        return job_message(
            job, route, enqueued_at=now, idempotency_key=idempotency_key,
            reply_to=reply_to, trace_headers=_tracing.inject_headers(),
        )  # fmt: skip

    async def _route(self, job: Job, now: datetime) -> Route:
        """Where ``job`` goes now, with what it needs declared (the Declarer's).

        A scheduled job's scheduler is settled first (``"auto"``: asked of the broker once);
        a route whose entities were declared just now is worked out again, so the time
        spent declaring is not added to the job's wait."""
        scheduler = self.scheduler
        if scheduler != "levels" and isinstance(job.scheduled_at, str):
            scheduler = await self.resolve_scheduler()
        resolved: Literal["levels", "plugin"] = "plugin" if scheduler == "plugin" else "levels"
        found = route(job, now, resolved, self.names)
        declarer = self.declarer
        if declarer.missing(found.needs) and await declarer.ensure(found.needs) and found.delay_ms:
            found = route(job, datetime.now(UTC), resolved, self.names)
        return found

    # ------------------------------------------------- control plane (001 §5.6-5.8)

    async def cancel(self, job_id: str, *, queue: str = "default") -> None:
        """CANCEL: ask the workers of ``queue`` to abort job ``job_id`` (001 §5.6).

        Asynchronous: the worker running it cancels its handler and acks it as cancelled;
        a worker receiving the job later skips it (the cancel is remembered for a while).
        A handler running in a thread (a plain ``def``) cannot be interrupted: it runs to
        completion, and INFO says so (``JobInfo.interruptible`` is False).

        Raises :class:`InvalidJobError` for an id that cannot be a job id (not a lowercase
        UUIDv7) and :class:`QueueNotFoundError` when ``ojs.queue.{q}`` does not exist;
        nothing is sent then.
        """
        await self.control.cancel(job_id, queue=queue)

    async def heartbeat(self, job_id: str, worker_id: str, *, queue: str = "default") -> None:
        """BEAT: tell every worker of ``queue`` that ``worker_id`` still runs ``job_id`` (001 §5.7)."""
        await self.control.heartbeat(job_id, worker_id, queue=queue)

    async def info(self, job_id: str, *, queue: str = "default", timeout: DurationLike = 5.0) -> JobInfo:
        """INFO over RPC (001 §5.8): the state of ``job_id`` from the worker that knows it
        (see :meth:`ClientControl.info`); ``JobInfo(state="unknown")`` when none answers
        within ``timeout``."""
        return await self.control.info(job_id, queue=queue, timeout=timeout)

    async def result(
        self, job_id: str, *, queue: str = "default", timeout: DurationLike = 30.0, poll: DurationLike = 0.25
    ) -> Any:
        """The result of job ``job_id``, from any process: the workers of ``queue`` are asked
        (INFO) every ``poll`` seconds until one says the job finished.

        Returns what the handler returned (a JSON value the worker kept: at most 4 KiB, with
        ``Worker(info_details=True)``, the default; else None).  Raises
        :class:`JobFailedError` if the job was dead-lettered or cancelled, and
        ``TimeoutError`` when ``timeout`` passes first: the job has not finished yet, or it
        finished longer ago than the workers keep finished jobs (1,000 a worker, one hour:
        ``docs/job-api.md``), or its worker has stopped since.  Use :meth:`push_for_result`
        when the process that pushes is the one that waits."""
        seconds = duration_seconds(timeout, "timeout")
        interval = duration_seconds(poll, "poll")
        with anyio.fail_after(seconds):
            while True:
                info = await self.info(job_id, queue=queue, timeout=min(2.0, max(seconds, 0.1)))
                if info.state == "completed":
                    return info.result
                if info.state in ("discarded", "cancelled"):
                    error = info.error
                    raise JobFailedError(
                        job_id,
                        "CANCELLED" if info.state == "cancelled" else None,
                        error.type if error is not None else None,
                        error.message if error is not None else info.state,
                    )
                await anyio.sleep(interval)  # the workers' state: there is no event to wait on

    def owns_reply_queue(self, name: str) -> bool:
        """Whether ``name`` is one of this client's own reply queues (results, INFO)."""
        if self._results is not None and self._results.queue_name == name:
            return True
        return self.control.owns_reply_queue(name)

    # -------------------------------------------------------------- misc

    # ---------------------------------------------------------- workflows (docs/workflows.md)

    async def start_workflow(self, workflow: Any) -> Any:
        """Start an ``ojs.chain/group/batch(...)``; returns its :class:`WorkflowHandle`."""
        from ._workflows import start_workflow

        return await start_workflow(self, workflow)

    async def workflow(self, workflow_id: str) -> Any:
        """A workflow's :class:`WorkflowState`, from any process (docs/workflows.md)."""
        from ._workflows import inspect_workflow

        return await inspect_workflow(self, workflow_id)

    async def cancel_workflow(self, workflow_id: str) -> list[str]:
        """Cancel a workflow: nothing more of it is pushed, its jobs get CANCEL."""
        from ._workflows import cancel_workflow

        return await cancel_workflow(self, workflow_id)

    async def chain(self, *steps: Any, name: str | None = None) -> Any:
        """Start ``ojs.chain(*steps)`` (OJS workflows §4)."""
        from ._workflows import chain

        return await self.start_workflow(chain(*steps, name=name))

    async def group(self, *jobs: Any, name: str | None = None) -> Any:
        """Start ``ojs.group(*jobs)`` (OJS workflows §5)."""
        from ._workflows import group

        return await self.start_workflow(group(*jobs, name=name))

    async def batch(self, jobs: Sequence[Any], **callbacks: Any) -> Any:
        """Start ``ojs.batch(jobs, on_complete=…, on_success=…, on_failure=…)`` (§6)."""
        from ._workflows import batch

        return await self.start_workflow(batch(jobs, **callbacks))

    def dead_letters(self, queue: str) -> DeadLetters:
        return DeadLetters(self, queue)


_CLASSES_ON_THE_WIRE = (
    "{where}: non_retryable_errors holds exception classes, which cannot travel in a job's message; "
    "give their OJS error types as strings ('mypkg.errors.PaymentDeclined', or 'mypkg.errors.*'), "
    "or put the classes in the worker's policy: Worker(retry=RetryPolicy(non_retryable_errors=(...)))"
)


def _check_job_policy(policy: RetryPolicy) -> None:
    if policy.carries_classes():
        raise ArgumentTypeError(_CLASSES_ON_THE_WIRE.format(where="the job's retry policy"))
    if policy.on_exhaustion == "discard":
        import warnings

        warnings.warn(
            "on_exhaustion='discard' is not honoured by the OJS AMQP binding: an exhausted job is "
            "rejected (Basic.Nack, requeue=false) and the broker moves it to its dead-letter queue "
            "ojs.queue.dlx.{queue} (OJS AMQP binding §5.5); purge that queue to drop them",
            UserWarning,
            stacklevel=4,
        )


def as_enqueued(job: Job, route: Route, enqueued_at: datetime) -> Job:
    """``job`` as push returns it: with ``enqueued_at``, ``created_at`` (as the message
    carries it) and its ``state`` (``scheduled`` when it waits for its time, else
    ``available``), as the OJS conformance suite expects of a PUSH's answer."""
    stamp = format_timestamp(enqueued_at)
    return msgspec.structs.replace(
        job,
        enqueued_at=stamp,
        created_at=job.created_at if isinstance(job.created_at, str) else stamp,
        state="scheduled" if route.delay_ms else "available",
    )


def _check_pushable(job: Job) -> None:
    """What push refuses in a job built elsewhere: unique policies, non-JSON args, classes."""
    if not isinstance(job, Job):
        raise ArgumentTypeError(
            f"push_job takes an ojs_anyio.Job (from client.build), not {type(job).__name__}"
        )
    if not isinstance(job.unique, msgspec.UnsetType):
        unique_lock(job)  # refuses, with the reason, a policy a broker cannot enforce
    check_json_args(job.args, job.type)
    if isinstance(job.retry, RetryPolicy):
        _check_job_policy(job.retry)


@asynccontextmanager
async def connect(
    url: str | None = None,
    *,
    prefix: str = "",
    declare: str = "lazy",
    queue_options: QueueOptions | dict[str, QueueOptions] | None = None,
    retry: RetryPolicy | None = None,
    recovery: amqp.RecoveryPolicy | None = None,
    scheduler: str = "levels",
    queues: Iterable[str] = ("default",),
    middleware: Sequence[Middleware] | None = None,
    publish_timeout: float | None = amqp.DEFAULT_PUBLISH_TIMEOUT,
    confirm_timeout: float | None = amqp.DEFAULT_CONFIRM_TIMEOUT,
    **amqp_options: Any,
) -> AsyncIterator[Client]:
    """``async with ojs_anyio.connect("amqp://guest:guest@localhost/") as client:``

    ``url`` defaults to ``$OJS_AMQP_URL``, then ``amqp://guest:guest@localhost:5672/`` (the
    event bus, by contrast, falls back to ``memory://``).  The connection is named
    ``ojs-jobs pid=N`` unless ``name=`` says otherwise (RabbitMQ's ``connection_name``).
    Recovery (reconnect with backoff, topology re-declared, consumers re-registered) is on
    by default here; pass ``recovery=amqp.RecoveryPolicy(enabled=False)`` to turn it off.

    Nothing waits for a recovering connection without bound: ``publish_timeout`` (5 s)
    bounds every call's wait for it (a push's whole preparation counts as one wait; then
    :class:`PushNotSentError`, other calls ``amqp.OperationTimeoutError``), and
    ``confirm_timeout`` (5 s) a push's wait for the broker's confirm once the job was sent
    (then :class:`PushOutcomeUnknownError`).  ``None`` waits without bound.

    ``scheduler`` picks how scheduled jobs wait (``docs/scheduling.md``): ``"levels"``
    (default: the binary delay levels, no plugin), ``"plugin"`` (the
    delayed-message-exchange plugin; :class:`SchedulerUnavailableError` here if the broker
    lacks it) or ``"auto"`` (the plugin when the broker has it, else the levels).  The two
    last ones ask the broker on a separate short-lived connection while connecting.

    ``declare="eager"`` declares, before this returns, the exchanges and every entity of
    each queue in ``queues`` (see :meth:`Client.declare_eagerly`); ``"lazy"`` (default)
    declares each queue's entities on first use.  Both are idempotent.
    """
    url = url or os.environ.get("OJS_AMQP_URL") or DEFAULT_URL
    policy = recovery if recovery is not None else amqp.RecoveryPolicy()
    # Named, so an operator tells the job layer's connections apart in list_connections.
    amqp_options.setdefault("name", f"ojs-jobs pid={os.getpid()}")
    async with amqp.connect(url, recovery=policy, publish_timeout=publish_timeout, **amqp_options) as conn:
        client = Client(
            conn,
            names=Names(prefix),
            declare=declare,
            queue_options=queue_options,
            retry=retry,
            scheduler=scheduler,
            middleware=middleware,
            confirm_timeout=confirm_timeout,
        )
        client._probe_options = dict(amqp_options)
        try:
            async with anyio.create_task_group() as tg:
                client._tg = tg  # the result queue's reader, started on first use
                if scheduler != "levels":
                    await client.resolve_scheduler()
                if declare == "eager":
                    await client.declare_eagerly(queues)
                try:
                    yield client
                finally:
                    tg.cancel_scope.cancel()
        finally:
            client._tg = None
            with anyio.CancelScope(shield=True):
                await client.aclose()
