"""Running a worker's jobs: the pull tasks, and one delivery from receipt to its verdict.

Per queue (:meth:`JobRunner.serve_queue`): one channel with publisher confirms,
``Basic.Qos(prefetch=...)`` then ``Basic.Consume(no_ack=False)`` (AMQP-006/007), and
``concurrency`` long-lived tasks pulling from the bounded delivery stream (no task per
job), plus one task for the queue of redelivered jobs, which run one at a time.  These
tasks and their graceful stop are a :class:`ConsumePool` (``_consume_pool.py``, the event
bus's too): :meth:`JobRunner.stop` stops each queue's pool.

Per delivery (:meth:`JobRunner._handle_one`): admit it (decode, unsettled deliveries, a
CANCEL that came first, its handler, its policy, expiry), convert its arguments, run the
handler under the job's timeout (default 1800 s), ask :func:`decide` what that means, and
hand the verdict to the :class:`Settler`.  Each pull task has one cancel scope for many
jobs: while a handler runs, the scope is in :attr:`JobRunner.running` with the job's
context, and the timeout watch (:meth:`JobRunner.watch_timeouts`, at ``ctx.deadline``),
CANCEL and the grace period cancel it; a spent scope is replaced.
"""

from __future__ import annotations

import functools
import logging
import math
import random
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Protocol

import anyio
import anyio.abc
from msgspec import UNSET

from .. import _pipeline, amqp
from .._consume_pool import ConsumePool
from . import _tracing
from ._attempt import Attempt, Backend, fault, handler_arguments
from ._client import Client
from ._context import JobContext, Outcome
from ._control import WorkerControl
from ._decide import ACK, Verdict, dead_letter, decide
from ._envelope import Job, decode_job, parse_timestamp
from ._errors import ErrorCode, InvalidJobError
from ._failures import log_extra
from ._handlers import HandlerSpec
from ._job_metrics import JobMetrics
from ._middleware import HandlerChain, Middleware, build_handler_chain, outcome_hooks, skip_hooks
from ._retry import DEFAULT_RETRY_POLICY, EffectiveRetryPolicy, RetryPolicy, merge, resolve_retry
from ._settle import Settler
from ._startup import through_cuts
from ._timeouts import JobScope, TimeoutWatch, handler_timeout
from ._wire import header_attempt, header_max_attempts, unsettled_deliveries

__all__ = ["JobRunner"]

log = logging.getLogger("ojs_anyio.worker")


class RunningWorker(Protocol):
    """What the runner reads of its worker (``Worker`` is one)."""

    worker_id: str
    concurrency: int
    retry: RetryPolicy | None
    default_timeout: float
    broker_consumer_timeout: float
    grace_period: float
    max_deliveries: int
    middleware: list[Middleware]
    metrics: bool
    tracing: bool
    control: WorkerControl

    @property
    def prefetch(self) -> int: ...

    @property
    def stopping(self) -> bool: ...


class JobRunner:
    """The pull tasks of one worker and what they do with each delivery (see the module
    docstring)."""

    def __init__(
        self, worker: RunningWorker, settler: Settler, handlers: dict[str, HandlerSpec], rng: random.Random
    ) -> None:
        self._worker = worker
        self._settler = settler
        #: job type -> the handler (the worker's registry, shared).
        self._registry = handlers
        self._rng = rng
        #: Every delivery running now, by job id: (its scope, its context).  Usually one a
        #: job; two deliveries of one id (a re-push after an unknown outcome) are both here,
        #: so CANCEL and the grace period reach each.
        self.running: dict[str, list[tuple[JobScope, JobContext]]] = {}
        #: Each pull task's scope, and whether the task now waits for a delivery (stop
        #: cancels those that do).  A flag set and cleared per job, not a set's add and
        #: discard: two calls a job fewer.
        self._fetch_scopes: dict[JobScope, bool] = {}
        #: (worker policy, it merged over the OJS defaults, that resolved for jobs without
        #: their own policy): see _policy.
        self._defaults: tuple[RetryPolicy | None, RetryPolicy, EffectiveRetryPolicy] | None = None
        self._backend: Backend | None = None
        #: (default_timeout, broker_consumer_timeout, the handler timeout of a job without
        #: its own): handler_timeout's answer for most jobs, worked out once per value.
        self._default_timeout: tuple[float, float, float] = (math.nan, math.nan, math.nan)
        #: Bounds the threads of sync handlers (made by prepare(): one per event loop).
        self._thread_limiter: anyio.CapacityLimiter | None = None
        self._handler_chain: HandlerChain | None = None
        #: Middleware ``on_skipped`` hooks (set per run), awaited before a job cancelled
        #: before it started is acked unrun.
        self._skip_hooks: tuple[Callable[[Job], Awaitable[None]], ...] = ()
        #: The consume pool of each queue being served (stop() stops each).
        self._pools: set[ConsumePool] = set()
        self._queues_running = 0
        self._queues_done: anyio.Event | None = None
        #: The handlers' timeouts (_timeouts.py): Worker.run runs its task (watch_timeouts).
        self._timeouts = TimeoutWatch(self.running)

    def start(self, queues: int) -> None:
        """Per run, in its event loop: the backend's primitives, the thread bound, the
        handler chain, and the count of queues :meth:`queues_done` waits for."""
        self._backend = Backend()
        self._thread_limiter = anyio.CapacityLimiter(self._worker.concurrency * queues)
        self.prepare()
        self._queues_running = queues
        self._queues_done = anyio.Event()

    async def queues_done(self) -> None:
        """Wait until every :meth:`serve_queue` has returned."""
        assert self._queues_done is not None
        await self._queues_done.wait()

    def stop(self) -> None:
        """The graceful stop of each queue's pool (the worker's ``stopping`` is set)."""
        for pool in list(self._pools):
            pool.stop()

    async def watch_timeouts(self, scope: anyio.CancelScope) -> None:
        """The handlers' timeouts, for the whole run (see ``_timeouts.py``)."""
        await self._timeouts.run(scope, (self._backend or Backend()).clock)

    def _stop_fetching(self) -> None:
        """Cancel the pull tasks that wait for a delivery (a pool's ``stop_fetching``)."""
        for scope, waiting in list(self._fetch_scopes.items()):
            if waiting:
                scope.cancel()

    def _abandon(self, queue: str, channels: tuple[amqp.Channel, ...]) -> None:
        """The grace period ran out (a pool's ``abandon``): cancel the handlers of ``queue``
        still running (settled as abandoned: unacked), and its settling publishes."""
        for scope, ctx in [entry for entries in self.running.values() for entry in entries]:
            if ctx.queue == queue:
                log.warning("job %s still running after the grace period: cancelled, left unacked", ctx.id)
                ctx.abandoned = True
                scope.cancel()
        for settle_scope, ch in list(self._settler.settle_scopes.items()):
            if ch in channels:
                settle_scope.cancel()  # a settling publish still refused: left unacked as well

    def _policy(self, job: Job, client: Client) -> EffectiveRetryPolicy:
        """The job's own retry policy, over the worker's ``retry=``, over the OJS defaults
        (a producer's ``connect(retry=...)`` was written into the job's envelope)."""
        cached = self._defaults
        if cached is None or cached[0] is not self._worker.retry:
            merged = merge(self._worker.retry, DEFAULT_RETRY_POLICY)
            cached = self._defaults = (self._worker.retry, merged, resolve_retry(None, merged))
        # A job without its own policy (most): the worker's, resolved once.
        return cached[2] if job.retry is UNSET else resolve_retry(job.retry, cached[1])

    async def serve_queue(self, client: Client, queue: str, started: anyio.Event) -> None:
        step = functools.partial(self._serve_queue, client, queue, started)
        try:
            await through_cuts(step, started.is_set, f"consuming queue {queue!r}", self._worker.worker_id)
        finally:
            self._queues_running -= 1
            if self._queues_running <= 0 and self._queues_done is not None:
                self._queues_done.set()

    async def _serve_queue(self, client: Client, queue: str, started: anyio.Event) -> None:
        names = client.names
        async with (
            client.conn.channel(confirms=True) as ch,
            ch.consume(names.job_queue(queue), prefetch=self._worker.prefetch) as deliveries,
            client.conn.channel(confirms=True) as lone_ch,
            # Jobs whose delivery ended unsettled run one at a time, so a job that kills
            # its worker is the only one in flight when it does (see _move_redelivered).
            lone_ch.consume(names.redelivered_queue(queue), prefetch=1) as redelivered,
        ):
            pool = ConsumePool(
                grace_period=self._worker.grace_period, stop_fetching=self._stop_fetching,
                abandon=functools.partial(self._abandon, queue, (ch, lone_ch)),
            )  # fmt: skip
            pull = self._pull_loop
            pool.add(self._worker.concurrency, functools.partial(pull, client, ch, queue, deliveries))
            pool.add(1, functools.partial(pull, client, lone_ch, queue, redelivered, lone=True))
            self._pools.add(pool)
            try:
                started.set()
                async with pool:
                    await pool.wait()  # until a graceful stop (stop()) ends them, or the consumers end
            finally:
                self._pools.discard(pool)

    async def _pull_loop(
        self, client: Client, ch: amqp.Channel, queue: str, deliveries: amqp.Consumer, *, lone: bool = False
    ) -> None:
        # One cancel scope for many jobs, not one per job (anyio spends about thirty calls
        # making, entering and leaving one, and a deadline arms a timer).  It is in
        # _fetch_scopes (where stop() cancels it) only while the task waits for a delivery;
        # while a job's handler runs, it is the handle the timeout watch (watch_timeouts),
        # CANCEL and the grace period cancel (running).  A cancelled scope is spent: the loop
        # leaves it, settles the job it cut short, and makes a new one.
        backend = self._backend or Backend()
        idle = self._fetch_scopes
        while not self._worker.stopping:
            scope = JobScope(backend.scope_type())
            cut: Attempt | None = None
            try:
                with scope.scope:
                    while not self._worker.stopping:
                        idle[scope] = True
                        try:
                            msg = await deliveries.__anext__()
                        except StopAsyncIteration:
                            return
                        finally:
                            idle[scope] = False
                        if scope.cut:
                            return  # stop() came with this delivery: left unacked, the broker redelivers it
                        if lone:
                            await self._settler.moves_settled()
                        cut = Attempt(client, ch, queue, msg, scope)
                        try:  # a fault of ours with one delivery must not stop this worker
                            await self._handle_one(cut)
                        except Exception as exc:
                            await fault(cut, exc)
                        if scope.cut:
                            break  # cancelled as its handler returned: settled below, outside the scope
                        cut = None
            finally:
                del idle[scope]
            if cut is not None and cut.ctx is not None:
                # The scope was cancelled while the job ran (its deadline, CANCEL or the
                # grace period) or as it returned; the worker itself was not (that would
                # have gone on up from here, leaving the job unacked).
                try:
                    await self._settle_cut(cut)
                except Exception as exc:
                    await fault(cut, exc)

    async def _handle_one(self, a: Attempt) -> None:
        """Admit the delivery (decode, checks), then run its handler and settle it.  When
        the pull task's scope is cancelled during the handler, the cancellation goes on up
        to the pull loop, which settles the job (:meth:`_settle_cut`)."""
        admitted = await self._admit(a)
        if admitted is None:
            return
        spec, policy, max_attempts = admitted
        job = a.job
        assert job is not None
        ctx = JobContext(
            job=job, attempt=a.number, max_attempts=max_attempts, queue=a.queue,
            worker_id=self._worker.worker_id, message=a.msg, started_at=a.started, policy=policy,
        )  # fmt: skip
        args = handler_arguments(spec, ctx)
        if isinstance(args, Verdict):
            await self._settler.settle(a, args)
            return
        worker = self._worker
        if job.timeout is UNSET:  # most jobs: the worker's default, capped once per value (no call)
            cached = self._default_timeout
            given, broker = worker.default_timeout, worker.broker_consumer_timeout
            if cached[0] != given or cached[1] != broker:
                cached = self._default_timeout = (given, broker, handler_timeout(job, given, broker))
            timeout = a.timeout = cached[2]
        else:
            timeout = a.timeout = handler_timeout(job, worker.default_timeout, worker.broker_consumer_timeout)
        backend = self._backend or Backend()
        scope = a.scope
        deadline = ctx.deadline = (a.started if backend.monotonic else backend.clock()) + timeout
        watch = self._timeouts
        if deadline < watch.until and watch.wake is not None:
            watch.until = deadline
            watch.wake.set()  # the watch sleeps until a later deadline: it looks again
        a.ctx = ctx
        entry = (scope, ctx)
        same_id = self.running.get(job.id)
        if same_id is None:
            self.running[job.id] = [entry]
        else:
            same_id.append(entry)
        raised: BaseException | None = None
        result: Any = None
        try:
            chain = self._handler_chain  # tracing is middleware (_tracing.Tracing, see _prepare_middleware)
            if chain is not None:
                result = await chain(ctx, functools.partial(self._call_handler, spec, ctx, args, scope))
            elif spec.is_async:
                result = await spec.fn(ctx, *args)
            else:
                result = await self._run_sync(spec, ctx, args, scope)
        except backend.cancelled:
            raise  # this scope (timeout, CANCEL, grace period: see _pull_loop) or the worker's
        except KeyboardInterrupt:
            raise  # Ctrl-C reached the handler: the process is stopping, the job stays unacked
        except BaseException as exc:  # whatever the handler raised, decided on below
            # SystemExit included: a handler's sys.exit() (argparse inside a job) is the
            # handler's failure (HANDLER_PANIC), not a request to end the worker.  A signal
            # stops the worker gracefully through stop(), never through SystemExit.
            raised = exc
        finally:
            entries = self.running[job.id]  # out of watch_timeouts' sight: settling is not the handler's time
            if len(entries) == 1:
                del self.running[job.id]
            else:
                entries[:] = [e for e in entries if e is not entry]
        # A handler that returned, its scope not cancelled, is acked (decide's first case,
        # told here without the call).
        verdict = ACK if raised is None else decide(
            raised, cancelled_caught=False, cancel_requested=ctx.cancel_requested, abandoned=ctx.abandoned,
            timeout=timeout, policy=policy, attempt=a.number, max_attempts=max_attempts, rng=self._rng,
        )  # fmt: skip
        if scope.cut:  # cancelled as the handler returned: the pull loop settles it
            a.verdict, a.result = verdict, result
            return
        await self._settler.settle(a, verdict, result)

    async def _settle_cut(self, a: Attempt) -> None:
        """Settle a job whose handler the pull task's scope cut short (or that returned as
        it was cancelled: its verdict is then kept on the attempt)."""
        if a.verdict is not None:
            await self._settler.settle(a, a.verdict, a.result)
            return
        ctx = a.ctx
        assert ctx is not None and ctx.policy is not None
        verdict = decide(
            None, cancelled_caught=True, cancel_requested=ctx.cancel_requested, abandoned=ctx.abandoned,
            timeout=a.timeout, policy=ctx.policy, attempt=a.number, max_attempts=ctx.max_attempts,
            rng=self._rng,
        )  # fmt: skip
        await self._settler.settle(a, verdict)

    async def _admit(self, a: Attempt) -> tuple[HandlerSpec, EffectiveRetryPolicy, int] | None:
        """Everything before the handler runs: decode the job, count unsettled deliveries,
        skip a cancelled job, find its handler and policy, refuse an expired one.  None when
        the delivery was settled here (or moved)."""
        msg = a.msg
        if msg.malformed is not None:
            await self._settler.reject_malformed(a)
            return None
        headers = msg.properties.headers or {}
        # (A header once made the worker reject a job unrun, with no log line and no outcome:
        # any vhost client could set it.  It means nothing now; `dlq requeue` still strips it.)
        try:
            a.number = header_attempt(headers)
            job = a.job = decode_job(msg.body, delivered=True)
        except InvalidJobError as exc:
            a.number = 1
            await self._settler.settle(a, dead_letter(ErrorCode.INVALID_PAYLOAD, str(exc)))
            return None
        if msg.redelivered and await self._redelivered(a, headers):
            return None
        control = self._worker.control
        if control.cancelled and control.was_cancelled(job.id):  # no CANCEL held (most runs): no call
            for hook in self._skip_hooks:  # a workflow settles the job as cancelled
                await hook(job)
            await msg.ack()
            log.info(
                "job %s type=%s queue=%s outcome=cancelled (cancelled before it started)",
                job.id, job.type, a.queue,
            )  # fmt: skip
            self._settler.report(a.outcome(Outcome.CANCELLED, timed=False))
            return None
        spec = self._registry.get(job.type)
        if spec is None:
            await self._settler.unknown_type(a)
            return None
        try:
            policy = self._policy(job, a.client)
            max_attempts = header_max_attempts(headers, policy.max_attempts)
        except InvalidJobError as exc:
            await self._settler.settle(a, dead_letter(ErrorCode.INVALID_PAYLOAD, str(exc)))
            return None
        expires_at = job.expires_at
        if expires_at is UNSET:  # most jobs: no call
            return spec, policy, max_attempts
        if isinstance(expires_at, str) and parse_timestamp(expires_at) <= datetime.now(UTC):
            await self._settler.settle(a, dead_letter(ErrorCode.EXPIRED, f"job expired at {job.expires_at}"))
            return None
        return spec, policy, max_attempts

    async def _redelivered(self, a: Attempt, headers: dict[str, Any]) -> bool:
        """A redelivered job: dead-lettered as WORKER_LOST past ``max_deliveries``, else
        moved to the redelivered queue.  True when the delivery was settled here."""
        lost = unsettled_deliveries(headers) + 1
        if lost >= self._worker.max_deliveries:
            verdict = dead_letter(
                ErrorCode.WORKER_LOST,
                f"delivered {lost} times, and each delivery ended without a settlement (a worker "
                f"died or lost its connection holding it); max_deliveries is {self._worker.max_deliveries}",
            )
            await self._settler.settle(a, verdict)
            return True
        return await self._settler.move_redelivered(a, lost)  # the copy carries the count

    async def _call_handler(
        self, spec: HandlerSpec, ctx: JobContext, args: list[Any], scope: JobScope
    ) -> Any:
        if spec.is_async:
            return await spec.fn(ctx, *args)
        return await self._run_sync(spec, ctx, args, scope)

    def prepare(self) -> None:
        """Build the handler chain and outcome hooks once per run (see Middleware)."""
        middleware = list(self._worker.middleware)
        # Tracing goes first, so its span covers every other hook, as it covered the whole
        # handler call when it was built in; without a tracer provider it is left out.
        has_tracing = any(isinstance(m, _tracing.Tracing) for m in middleware)
        if self._worker.tracing and not has_tracing and _tracing.recording():
            middleware.insert(0, _tracing.Tracing())
        has_metrics = any(isinstance(m, JobMetrics) for m in middleware)
        if self._worker.metrics and not has_metrics and amqp.sdk_meter_provider_installed():
            middleware.append(JobMetrics())
        for m in middleware:
            if isinstance(m, JobMetrics):
                m.registered = frozenset(self._registry)
        self._handler_chain = build_handler_chain(middleware)
        self._settler.hooks = outcome_hooks(middleware)
        self._skip_hooks = skip_hooks(middleware)
        # Settlements get spans when handlers do (a Tracing middleware is in the chain).
        self._settler.traced = any(isinstance(m, _tracing.Tracing) for m in middleware)

    async def _run_sync(
        self, spec: HandlerSpec, ctx: JobContext, args: list[Any], scope: JobScope
    ) -> Any:
        """A plain ``def`` handler, in a worker thread bounded by the worker's concurrency.

        Not abandoned on cancel: a thread cannot be interrupted, so a timeout, CANCEL or
        the grace period waits for it to return (no thread outlives the worker), and what
        it returned or raised decides the job, as for a handler that finished in time."""
        result = await _pipeline.call(spec.fn, False, (ctx, *args), self._thread_limiter)
        late = ctx.deadline is not None and anyio.current_time() >= ctx.deadline
        if late or ctx.cancel_requested or ctx.abandoned:
            why = "its timeout" if late else "a CANCEL" if ctx.cancel_requested else "the grace period"
            log.warning(
                "job %s: sync handler %s ran past %s (a thread cannot be interrupted); its outcome counts",
                ctx.id, spec.name, why, extra=log_extra(ctx.id, ctx.job.type, ctx.queue, ctx.attempt),
            )  # fmt: skip
        return result
