"""The push path of a :class:`~ojs_anyio.jobs.Client`: push is route -> ensure -> publish.

:class:`Pusher` owns it: the ``around_push`` hooks, the idempotency claim, where a job goes
(``route()``, pure, in ``_route.py``), declaring what that route needs (the client's
``Declarer``, before the message is built), the message (``enqueued_message``, pure) and
the confirmed publish, single or pipelined (``batch``).  It reaches its client through
:class:`PushingClient` (public names only); the cron scheduler pushes through the client's
public ``push_job``, so every job, scheduled or not, goes through here.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, TypeVar

import anyio
import msgspec
from msgspec import UNSET

from ojs_anyio.amqp import BasicProperties, UsageError

from .. import amqp
from .._trace_context import NO_SPAN
from . import _tracing
from ._build import check_pushable
from ._declarer import Declarer
from ._dedup import DuplicateJobError, check_window, claim, lock_queue, release
from ._durations import DurationLike, duration_ms
from ._envelope import Job, format_timestamp
from ._errors import ArgumentTypeError, PushError
from ._middleware import Middleware, build_push_chain
from ._results import PendingResult, ResultRouter
from ._route import Route, route
from ._sending import SEND_FAILURES, UNAVAILABLE, SendDeadline, before_sending, push_error
from ._topology import Names
from ._unique import unique_lock
from ._wire import job_message

__all__ = ["PushResult", "Pusher", "PushingClient", "as_enqueued", "enqueued_message"]

log = logging.getLogger("ojs_anyio.jobs")

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class PushResult:
    """One job of a batch: ``error`` is None when the broker confirmed it."""

    job: Job
    error: PushError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class PushingClient(Protocol):
    """What :class:`Pusher` uses of its client (``Client`` is one)."""

    conn: amqp.Connection
    names: Names
    declarer: Declarer
    confirm_timeout: float | None
    scheduler: str

    async def channel(self) -> amqp.Channel: ...

    async def resolve_scheduler(self) -> str: ...

    async def declare_queue(self, queue: str) -> None: ...


class Pusher:
    """A client's push path; ``hooks`` are the middleware that override ``around_push``."""

    def __init__(self, client: PushingClient, hooks: Sequence[Middleware]) -> None:
        self._client = client
        self.hooks = tuple(hooks)

    def push_through(
        self, job: Job, idempotency_key: str | None, window: DurationLike | None, reply_to: str | None
    ) -> Awaitable[Job]:
        """One push, wrapped by the middleware's ``around_push`` hooks (if any): what to await.

        Not a coroutine itself: it hands back the one it picks (a frame and a task step less
        per push on the hot path)."""
        if not self.hooks:
            # The hot path, one call less: _claims_nothing, inline.
            if job.unique is UNSET and (idempotency_key is None or window is None):
                return self.publish(job, idempotency_key, reply_to)
            return self.claim_and_publish(
                job, idempotency_key=idempotency_key, window=window, reply_to=reply_to
            )

        async def send(changed: Job) -> Job:
            check_pushable(changed)
            return await self.claim_and_publish(
                changed, idempotency_key=idempotency_key, window=window, reply_to=reply_to
            )

        return build_push_chain(self.hooks, send)(job)

    async def for_result(
        self,
        job: Job,
        router: ResultRouter,
        *,
        idempotency_key: str | None,
        window: DurationLike | None,
        convert: Callable[[Any], R] | None,
    ) -> PendingResult[R]:
        """``push_job_for_result``: the job carries ``reply_to`` = ``router``'s queue, and
        ``router`` expects its result before it is sent."""
        try:
            with before_sending(SendDeadline(self._client.conn)):
                reply_to = await router.reply_to()
        except UNAVAILABLE as exc:
            raise push_error(exc, job) from exc
        pending: PendingResult[R] = router.expect(job, convert)
        try:
            pushed = await self.push_through(job, idempotency_key, window, reply_to)
        except BaseException:
            router.forget(job.id)
            raise
        if pushed.id != job.id:  # a middleware replaced the job: wait for the one sent
            router.forget(job.id)
            pending = router.expect(pushed, convert)
        pending.job = pushed
        return pending

    async def claim_and_publish(
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
        if _claims_nothing(job, idempotency_key, window):
            return await self.publish(job, idempotency_key, reply_to)
        ignore = False
        if job.unique is not UNSET:
            if idempotency_key is not None and window is not None:
                raise UsageError(f"job {job.id}: give a unique policy or an idempotency_key, not both")
            idempotency_key, window, ignore = unique_lock(job)  # the fingerprint, for the period
        if idempotency_key is None or window is None:
            return await self.publish(job, idempotency_key, reply_to)
        if not isinstance(idempotency_key, str) or not idempotency_key:
            raise ArgumentTypeError(f"idempotency_key must be a non-empty str, got {idempotency_key!r}")
        window_ms = duration_ms(window, "idempotency_window", allow_zero=False)
        check_window(window_ms)
        lock = lock_queue(self._client.names.prefix, idempotency_key, window_ms)
        deadline = SendDeadline(self._client.conn)
        try:
            with before_sending(deadline):
                # Before the claim: a topology error keeps the key free.
                await self._client.declare_queue(job.queue)
            # Not under the deadline: cut after its marker was sent, the key's state is unknown.
            await claim(
                self._client.conn, lock, window_ms, key=idempotency_key, job_id=job.id, queue=job.queue,
                record_holder=ignore,
            )  # fmt: skip
        except DuplicateJobError as exc:
            if ignore and exc.existing_job_id:  # unique on_conflict="ignore": the existing job
                return msgspec.structs.replace(job, id=exc.existing_job_id)
            raise
        except SEND_FAILURES as exc:
            raise push_error(exc, job) from exc
        try:
            return await self.publish(job, idempotency_key, reply_to, deadline)
        except BaseException:
            # Free the key, so that pushing again can succeed (at least once, as everywhere).
            with anyio.CancelScope(shield=True):
                try:
                    await release(await self._client.channel(), lock)
                except (amqp.AMQPError, OSError) as exc:
                    log.warning(
                        "could not release idempotency key %r of job %s: %s", idempotency_key, job.id, exc
                    )
            raise

    async def publish(
        self,
        job: Job,
        idempotency_key: str | None,
        reply_to: str | None = None,
        deadline: SendDeadline | None = None,
    ) -> Job:
        client = self._client
        conn = client.conn
        now = datetime.now(UTC)
        route = self.ready_route(job, now)
        if route is None:
            if deadline is None:
                deadline = SendDeadline(conn)
            try:
                with before_sending(deadline):
                    route = await self.resolve_route(job, now)
            except UNAVAILABLE as exc:
                raise push_error(exc, job) from exc
        # The message's trace headers are written inside the PRODUCER span, so the worker's
        # CONSUMER span becomes its child (001 §12.2).
        with _tracing.producer_span(job, route.exchange):
            try:
                pushed, props, body = enqueued_message(
                    job, route, now, idempotency_key=idempotency_key, reply_to=reply_to,
                    trace_headers=_tracing.inject_headers(),
                )  # fmt: skip
                if deadline is None and conn.is_open:
                    # The hot path: nothing waited so far, nothing to wait for; a deadline
                    # (publish_timeout from the moment the connection is found away) only
                    # when there is.
                    ch = await client.channel()
                    timeout = conn.publish_timeout
                else:
                    if deadline is None:
                        deadline = SendDeadline(conn)
                    with before_sending(deadline):
                        ch = await client.channel()
                    timeout = deadline.left()
                await ch.publish(
                    body,
                    exchange=route.exchange,
                    routing_key=route.routing_key,
                    properties=props,
                    mandatory=route.mandatory,
                    timeout=timeout,
                    confirm_timeout=client.confirm_timeout,
                )
            except SEND_FAILURES as exc:
                raise push_error(exc, job) from exc
        return pushed

    async def batch(self, jobs: Iterable[Job], *, max_in_flight: int = 1024) -> list[PushResult]:
        """PUSH many jobs pipelined on one channel (one round trip's latency, not one per job).

        Returns one :class:`PushResult` per job, in order; a failed job doesn't stop the others.
        Errors are :meth:`push`'s: while the connection is away, the first job waits up to
        ``publish_timeout`` and every job not sent gets :class:`PushNotSentError` (the others
        at once); the confirms are awaited up to ``confirm_timeout`` after the last job was sent.
        """
        jobs = list(jobs)
        if self.hooks:
            jobs = [await self._through_hooks(job) for job in jobs]
        for job in jobs:
            check_pushable(job)
        # One publish_timeout for the waits before a job is sent, restarted by each job
        # sent: while the connection stays away, the first job waits and the rest fail at once.
        deadline = SendDeadline(self._client.conn)
        try:
            with before_sending(deadline):
                for queue in {j.queue for j in jobs}:
                    await self._client.declare_queue(queue)
                ch = await self._client.channel()
        except UNAVAILABLE as exc:
            return [PushResult(job, push_error(exc, job)) for job in jobs]
        window = ch.publish_window(max_in_flight=max_in_flight)
        handles: list[amqp.PublishHandle | PushError] = []
        sent: list[Job] = []  # each job as its result reports it: as enqueued once sent
        direct = self._client.names.direct_exchange
        conn = self._client.conn
        # Asked once a batch, not per job: a tracer provider installed meanwhile records
        # from the next push on.
        spans = _tracing.recording()
        for job in jobs:
            pushed = job
            with _tracing.producer_span(job, direct) if spans else NO_SPAN as span:
                try:
                    now = datetime.now(UTC)
                    route = self.ready_route(job, now)
                    if route is None:
                        with before_sending(deadline):
                            route = await self.resolve_route(job, now)
                    pushed, props, body = enqueued_message(
                        job, route, now, trace_headers=_tracing.inject_headers()
                    )
                    if route.exchange != direct:
                        span.set_attribute("messaging.destination.name", route.exchange)
                    handles.append(
                        await window.publish(
                            body,
                            exchange=route.exchange,
                            routing_key=route.routing_key,
                            properties=props,
                            mandatory=route.mandatory,
                            # deadline.left(), without the call while nothing waited
                            timeout=deadline.limit
                            if deadline.ends_at is None and conn.is_open
                            else deadline.left(),
                        )
                    )
                    if deadline.ends_at is not None:
                        deadline.restart()
                except SEND_FAILURES as exc:
                    pushed = job  # not sent: the job as built
                    handles.append(push_error(exc, job))
            sent.append(pushed)
        await window.wait_all(self._client.confirm_timeout)
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

        return await build_push_chain(self.hooks, record)(job)

    async def resolve_route(self, job: Job, now: datetime) -> Route:
        """Where ``job`` goes now, with what it needs declared (the Declarer's).

        A scheduled job's scheduler is settled first (``"auto"``: asked of the broker once);
        a route whose entities were declared just now is worked out again, so the time
        spent declaring is not added to the job's wait."""
        scheduler = self._client.scheduler
        if scheduler != "levels" and isinstance(job.scheduled_at, str):
            scheduler = await self._client.resolve_scheduler()
        resolved: Literal["levels", "plugin"] = "plugin" if scheduler == "plugin" else "levels"
        found = route(job, now, resolved, self._client.names)
        declarer = self._client.declarer
        if declarer.missing(found.needs) and await declarer.ensure(found.needs) and found.delay_ms:
            found = route(job, datetime.now(UTC), resolved, self._client.names)
        return found

    def ready_route(self, job: Job, now: datetime) -> Route | None:
        """:meth:`resolve_route` when it has nothing to wait for (the hot path: a job due
        now, or on the delay levels, whose entities are declared), else None."""
        if job.scheduled_at is not UNSET and self._client.scheduler != "levels":
            return None  # the scheduler may have to be asked of the broker first
        found = route(job, now, "levels", self._client.names)
        return None if self._client.declarer.missing(found.needs) else found

    # ------------------------------------------------- control plane (001 §5.6-5.8)


def _claims_nothing(job: Job, idempotency_key: str | None, window: DurationLike | None) -> bool:
    """Whether :meth:`Pusher.claim_and_publish` goes straight to the publish: no unique
    policy, and no idempotency key with a window (a key alone is only written to the
    message's header)."""
    return job.unique is UNSET and (idempotency_key is None or window is None)


def enqueued_message(
    job: Job,
    route: Route,
    now: datetime,
    *,
    idempotency_key: str | None = None,
    reply_to: str | None = None,
    trace_headers: dict[str, str] | None,
) -> tuple[Job, BasicProperties, bytes]:
    """``job`` pushed along ``route`` at ``now``: the job as push returns it (``as_enqueued``)
    and the properties and body it is published with (``_wire.job_message``), the moment
    formatted once for both.  No I/O: every push builds its message here."""
    stamp = format_timestamp(now)
    pushed = as_enqueued(job, route, stamp)  # what the body carries, and push returns
    props, body = job_message(
        pushed, route, enqueued_at=stamp, idempotency_key=idempotency_key, reply_to=reply_to,
        trace_headers=trace_headers,
    )  # fmt: skip
    return pushed, props, body


def as_enqueued(job: Job, route: Route, stamp: str) -> Job:
    """``job`` as push returns it: with ``enqueued_at`` = ``stamp`` (the moment's text, as
    the message's header carries it), ``created_at`` (as the message carries it) and its
    ``state`` (``scheduled`` when it waits for its time, else ``available``), as the OJS
    conformance suite expects of a PUSH's answer.

    A copy with three fields set, not ``msgspec.structs.replace``: the values set are valid
    by construction (``stamp`` is ``format_timestamp``'s, the state a literal), so the
    struct's checks, which ``replace`` runs again on every field, are not (0.25 µs, not 1)."""
    pushed: Job = job.__copy__()  # type: ignore[attr-defined]  # (msgspec's stubs omit it)
    if not isinstance(job.created_at, str):  # absent: created as it is enqueued
        _set(pushed, "created_at", stamp)
    _set(pushed, "enqueued_at", stamp)
    _set(pushed, "state", "scheduled" if route.delay_ms else "available")
    return pushed


_set = msgspec.structs.force_setattr
