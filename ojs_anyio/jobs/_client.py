"""The OJS client: what ``connect()`` yields, a facade over the objects that do the work.

Building a job is ``_build.py`` (pure); the push path (route -> ``Declarer.ensure`` ->
publish) is :class:`~ojs_anyio.jobs._push.Pusher`; topology is the ``Declarer``; CANCEL,
BEAT, INFO and results by INFO are ``ClientControl`` (``_info.py``); dead letters are
``_dead_letters.py``; ``connect()`` is ``_connect.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, TypeVar

import anyio
import anyio.abc

from ojs_anyio.amqp import UsageError

from .. import amqp
from ._build import build_job, check_client_options, check_pushable
from ._control import CONTROL_CANCEL, CONTROL_HEARTBEAT, CONTROL_INFO, SYNC_CANCEL_DETAIL
from ._dead_letters import DeadJob, DeadLetters, return_to_queue
from ._declarer import Declarer, detect_delayed_plugin
from ._dedup import DEFAULT_IDEMPOTENCY_WINDOW
from ._durations import DurationLike
from ._envelope import Job
from ._info import ClientControl, JobInfo
from ._middleware import Middleware, check_middleware, overrides
from ._push import Pusher, PushResult
from ._results import PendingResult, ResultRouter
from ._retry import RetryPolicy
from ._topology import Names, QueueOptions

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
    "return_to_queue",
]

R = TypeVar("R")

log = logging.getLogger("ojs_anyio.jobs")

DEFAULT_URL = "amqp://guest:guest@localhost:5672/"


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
        probe_options: dict[str, Any] | None = None,
    ) -> None:
        check_client_options(declare=declare, scheduler=scheduler, retry=retry, queue_options=queue_options)
        self.conn = conn
        #: Seconds a push waits for the broker's confirm once the job was sent (None: until
        #: it comes or the connection is declared dead), then PushOutcomeUnknownError.
        self.confirm_timeout = confirm_timeout
        #: Around-hooks of every push (first = outermost); see :class:`Middleware`.
        self.middleware: tuple[Middleware, ...] = check_middleware(middleware)
        #: Set by connect(): the task group of the result queue's reader.
        self._tg: anyio.abc.TaskGroup | None = None
        self._results: ResultRouter | None = None
        #: "levels" or "plugin" once resolved; "auto" until the first scheduled push (or
        #: :meth:`resolve_scheduler`) has asked the broker.
        self.scheduler = scheduler
        #: Options for the short-lived connection of :meth:`detect_delayed_plugin`.
        self._probe_options: dict[str, Any] = dict(probe_options or {})
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
        #: The push path: route -> declare what the route needs -> publish (``_push.py``).
        self.pusher = Pusher(self, [m for m in self.middleware if overrides(m, "around_push")])

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

    def use_task_group(self, tg: anyio.abc.TaskGroup) -> None:
        """Where the result queue's reader will run (``connect()``'s task group); until
        then, and after :meth:`aclose`, ``push_for_result`` raises :class:`UsageError`."""
        self._tg = tg

    async def aclose(self) -> None:
        self._tg = None
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
        return await detect_delayed_plugin(self.conn.url, self.names, self._probe_options, timeout=timeout)

    async def resolve_scheduler(self) -> str:
        """Settle ``scheduler="auto"`` (or check ``"plugin"``) against the broker, once.

        Returns the scheduler in use, "levels" or "plugin".  ``"plugin"`` on a broker
        without the plugin raises :class:`SchedulerUnavailableError`.
        """
        if self.scheduler == "levels" or (self.scheduler == "plugin" and self.declarer.delayed_declared):
            return self.scheduler
        present = await self.detect_delayed_plugin()
        self.scheduler = await self.declarer.use_scheduler(self.scheduler, present)
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
        return build_job(
            self.retry, type, args, queue=queue, priority=priority, timeout=timeout, retry=retry,
            meta=meta, scheduled_at=scheduled_at, delay=delay, expires_at=expires_at, id=id,
        )  # fmt: skip

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
        job = build_job(  # what self.build does, one call less on the hot path
            self.retry, type, args, queue=queue, priority=priority, timeout=timeout, retry=retry,
            meta=meta, scheduled_at=scheduled_at, delay=delay, expires_at=expires_at, id=id,
        )  # fmt: skip
        return await self.pusher.push_through(job, idempotency_key, idempotency_window, None)

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
        check_pushable(job)
        return await self.pusher.for_result(
            job,
            self._result_router(),
            idempotency_key=idempotency_key,
            window=idempotency_window,
            convert=convert,
        )

    def _result_router(self) -> ResultRouter:
        if self._results is None:
            if self._tg is None:  # not from connect(), or after it
                raise UsageError("push_for_result needs a client from ojs_anyio.connect()")
            self._results = ResultRouter(self.conn, self._tg)
        return self._results

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
        check_pushable(job)
        return await self.pusher.push_through(job, idempotency_key, idempotency_window, None)

    async def push_batch(self, jobs: Iterable[Job], *, max_in_flight: int = 1024) -> list[PushResult]:
        """PUSH many jobs pipelined on one channel (one round trip's latency, not one per job).

        Returns one :class:`PushResult` per job, in order; a failed job doesn't stop the others.
        Errors are :meth:`push`'s: while the connection is away, the first job waits up to
        ``publish_timeout`` and every job not sent gets :class:`PushNotSentError` (the others
        at once); the confirms are awaited up to ``confirm_timeout`` after the last job was sent.
        """
        return await self.pusher.batch(jobs, max_in_flight=max_in_flight)

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
        return await self.control.result(job_id, queue=queue, timeout=timeout, poll=poll)

    def owns_reply_queue(self, name: str) -> bool:
        """Whether ``name`` is one of this client's own reply queues (results, INFO)."""
        if self._results is not None and self._results.queue_name == name:
            return True
        return self.control.owns_reply_queue(name)

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
