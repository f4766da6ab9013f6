"""The worker's control plane: CANCEL, BEAT and INFO (OJS AMQP binding §5.6-5.8).

Control messages reach every worker of a queue, whoever sent them (DECISIONS 6): each
worker consumes the durable ``ojs.queue.control.{q}`` as a competing consumer and relays
each message, unchanged, to the broadcast exchange ``ojs.exchange.control`` (confirmed,
then acked), and reads its own exclusive queue bound there.  :class:`WorkerControl` owns
that task, the heartbeat loop, and the state they keep (bounded): jobs cancelled before
they arrived, liveness seen through BEATs, jobs finished recently (for INFO), and which
``reply_to`` queues a reply may go to.  It reads the worker through :class:`ControlledWorker`
(public names only).  The client's side (sending CANCEL, BEAT, INFO) is ``Client``'s.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final, Protocol

import anyio
import anyio.abc
import msgspec

from .. import amqp
from .._pipeline import model_json
from ._context import JobContext, JobOutcome
from ._envelope import format_timestamp
from ._failures import error_from_headers, error_history
from ._startup import through_cuts
from ._topology import Names

__all__ = [
    "CONTROL_CANCEL", "CONTROL_HEARTBEAT", "CONTROL_INFO", "SYNC_CANCEL_DETAIL", "ControlClient",
    "ControlledWorker", "WorkerControl", "remember",
]  # fmt: skip

log = logging.getLogger("ojs_anyio.worker")

#: ``type`` of the control messages (001 §5.6-5.8).
CONTROL_CANCEL = "ojs.control.cancel"
CONTROL_HEARTBEAT = "ojs.control.heartbeat"
CONTROL_INFO = "ojs.control.info"
#: What INFO says of a running sync handler that was asked to cancel.
SYNC_CANCEL_DETAIL = (
    "cancel requested; the handler is synchronous and cannot be interrupted: it runs to completion"
)

_json = msgspec.json.Encoder(enc_hook=model_json)  # results: pydantic models as JSON
_json_decode = msgspec.json.Decoder()


class ControlClient(Protocol):
    """What the control plane uses of the worker's client (``Client`` is one)."""

    conn: amqp.Connection
    names: Names

    async def declare_control_queue(self, queue: str) -> None: ...

    def owns_reply_queue(self, name: str) -> bool: ...


class ControlledWorker(Protocol):
    """What the control plane reads of its worker (``Worker`` is one)."""

    worker_id: str
    queues: list[str]
    republish: amqp.RepublishPolicy
    heartbeat_interval: float
    cancel_memory: float
    info_details: bool

    @property
    def active(self) -> Mapping[str, JobContext]: ...

    def cancel_job(self, job_id: str) -> bool: ...

    def interruptible(self, ctx: JobContext) -> bool: ...


class WorkerControl:
    """A worker's control plane (see the module docstring)."""

    def __init__(self, worker: ControlledWorker, rng: random.Random) -> None:
        self._worker = worker
        self._rng = rng
        #: Jobs cancelled before they reached this worker: job id -> when (monotonic); bounded.
        self.cancelled: OrderedDict[str, float] = OrderedDict()
        #: Liveness seen through BEAT messages: job id -> (worker id, monotonic time); bounded.
        self.liveness: OrderedDict[str, tuple[str, float]] = OrderedDict()
        #: Jobs this worker finished recently, for INFO: job id -> (outcome, when); bounded.
        self.recent: OrderedDict[str, tuple[JobOutcome, float]] = OrderedDict()
        #: reply_to queue names checked by may_reply_to: name -> allowed; bounded.
        self._reply_targets: OrderedDict[str, bool] = OrderedDict()
        #: The control channel while :meth:`serve` runs (BEATs go out on it).
        self._ch: amqp.Channel | None = None
        #: The broadcast queue of this worker while :meth:`serve` runs (server-named).
        self._own: amqp.QueueInfo | None = None
        #: :meth:`serve`'s scope, cancelled by the worker when its queues are done (made by
        #: the worker's run(): a scope needs a running event loop).
        self.scope: anyio.CancelScope | None = None

    def finished(self, outcome: JobOutcome) -> None:
        """Remember what became of a job, for INFO (the answer is built only if INFO asks:
        this runs once per job)."""
        if outcome.id:
            remember(self.recent, outcome.id, (outcome, time.time()), limit=RECENT_LIMIT)

    def _recent_answer(self, outcome: JobOutcome, finished: float) -> dict[str, Any]:
        """The INFO answer about a job this worker finished at ``finished`` (epoch seconds)."""
        return {
            "job_id": outcome.id,
            "state": _OUTCOME_STATE.get(outcome.outcome, outcome.outcome),
            "attempt": outcome.attempt,
            "worker_id": self._worker.worker_id,
            "started_at": _epoch_text(finished - outcome.duration),
            "finished_at": _epoch_text(finished),
            **({"error": outcome.error} if outcome.error is not None else {}),
            **({"result": outcome.result} if _small_json(outcome.result) else {}),
        }

    async def serve(self, client: ControlClient, started: anyio.Event) -> None:
        """Control messages reach every worker of a queue, whoever sent them.

        Clients following the OJS AMQP binding publish CANCEL, BEAT and INFO to the durable
        ``ojs.queue.control.{q}`` (through the default exchange or ``ojs.exchange.direct``),
        where each message reaches one consumer only.  So every worker consumes that queue
        as a competing consumer and relays each message, unchanged, to the broadcast
        exchange ``ojs.exchange.control`` with key ``q`` (confirmed, then acked), and reads
        its own exclusive queue bound there.  The durable queue is not bound to the
        broadcast exchange, so a relayed copy never comes back to it (no loop), and each
        message is relayed once (no duplicates, but for a relay interrupted between its
        publish and its ack)."""
        assert self.scope is not None, "WorkerControl.serve() runs in a scope the worker makes"
        with self.scope:
            try:
                step = functools.partial(self._serve, client, started)
                await through_cuts(step, started.is_set, "opening its control plane", self._worker.worker_id)
            finally:
                self._ch = self._own = None

    async def _serve(self, client: ControlClient, started: anyio.Event) -> None:
        """:meth:`serve`'s start-up and run: one run of it (a start-up step, ``_startup.py``)."""
        names = client.names
        async with client.conn.channel(confirms=True) as ch:
            self._ch = ch
            await ch.exchange_declare(names.control_exchange, "direct", durable=True)
            # Declared once: a run again after a cut binds the same queue (recovery brought
            # it back, under a new name), and no unread queue is left bound behind it.
            own = self._own = self._own or await ch.queue_declare("", exclusive=True, auto_delete=True)
            for queue in self._worker.queues:
                await client.declare_control_queue(queue)
                await ch.queue_bind(own.name, names.control_exchange, queue)
            async with anyio.create_task_group() as tg:
                for queue in self._worker.queues:
                    await tg.start(self._relay, client, queue)
                async with ch.consume(own.name, prefetch=64) as messages:
                    started.set()
                    async for msg in messages:
                        await self._message(client, ch, msg)

    async def _relay(
        self, client: ControlClient, queue: str, *, task_status: anyio.abc.TaskStatus[None]
    ) -> None:
        names = client.names
        async with (
            client.conn.channel(confirms=True) as ch,
            ch.consume(names.control_queue(queue), prefetch=64) as messages,
        ):
            task_status.started()
            async for msg in messages:
                if msg.malformed is not None:
                    _drop_malformed_control(msg, names.control_queue(queue))  # it cannot be relayed
                    await msg.ack()
                    continue
                try:
                    await self._relay_one(ch, names.control_exchange, queue, msg)
                except amqp.DELIVERY_LOST_ERRORS as exc:
                    kind = msg.properties.type
                    log.warning("control message %r on %s not relayed (%s); it comes again", kind, queue, exc)

    async def _relay_one(
        self, ch: amqp.Channel, exchange: str, queue: str, msg: amqp.IncomingMessage
    ) -> None:
        relayed = await amqp.republish(
            ch, msg.body, exchange=exchange, routing_key=queue,
            properties=msg.properties, policy=self._worker.republish, rng=self._rng,
        )  # fmt: skip
        kind = msg.properties.type
        if relayed.gave_up:
            # Back to the durable queue, for this relay or another worker's to try again.
            log.warning("control message %r on %s not relayed: %s; requeued", kind, queue, relayed.reason)
            await msg.nack(requeue=True)
            return
        if relayed.final:
            why = relayed.reason
            log.warning("control message %r on %s cannot be relayed: %s; dropped", kind, queue, why)
        await msg.ack()

    async def _message(self, client: ControlClient, ch: amqp.Channel, msg: amqp.IncomingMessage) -> None:
        """One relayed control message, acked whatever it holds: no message stops the
        control plane (the broadcast queue has no dead-letter queue: a bad one is logged)."""
        try:
            await self._on_message(client, ch, msg)
            await msg.ack()
        except amqp.DELIVERY_LOST_ERRORS as exc:
            kind = msg.properties.type
            log.warning("control message %r not settled (%s); the broker delivers it again", kind, exc)
        except Exception:
            log.exception("control message %r (%d bytes) failed; dropped", msg.properties.type, len(msg.body))
            await msg.ack()

    async def _on_message(self, client: ControlClient, ch: amqp.Channel, msg: amqp.IncomingMessage) -> None:
        if msg.malformed is not None:  # published straight to the broadcast exchange
            _drop_malformed_control(msg, msg.queue)
            return
        kind = msg.properties.type
        try:
            data = _json_decode.decode(msg.body)
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
            why = type(exc).__name__
            log.warning("ignoring malformed control message %r (%s): %r", kind, why, msg.body[:200])
            return
        job_id = data.get("job_id") if isinstance(data, dict) else None
        if not isinstance(job_id, str):
            log.warning("ignoring control message %r without a job_id", kind)
            return
        now = time.monotonic()
        if kind == CONTROL_CANCEL:
            if self._worker.cancel_job(job_id):
                ctx = self._worker.active.get(job_id)
                if ctx is not None and not self._worker.interruptible(ctx):
                    log.info("job %s: %s", job_id, SYNC_CANCEL_DETAIL)
                else:
                    log.info("job %s: cancel requested, handler cancelled", job_id)
            else:
                remember(self.cancelled, job_id, now, limit=10_000)
        elif kind == CONTROL_HEARTBEAT:
            worker_id = data.get("worker_id")
            if isinstance(worker_id, str):
                remember(self.liveness, job_id, (worker_id, now), limit=10_000)
        elif kind == CONTROL_INFO:
            answer = self.info(job_id)
            reply_to = msg.properties.reply_to
            if answer is not None and reply_to and await self.may_reply_to(client, reply_to):
                await ch.publish(
                    _json.encode(answer),
                    exchange="",
                    routing_key=reply_to,
                    properties=amqp.BasicProperties(
                        correlation_id=msg.properties.correlation_id,
                        content_type="application/json",
                        app_id="ojs",
                    ),
                )

    def info(self, job_id: str) -> dict[str, Any] | None:
        """The INFO answer about ``job_id`` (None: not known here); without the result
        and the backtraces when ``info_details`` is off."""
        answer = self._info_answer(job_id)
        if answer is not None and not self._worker.info_details:
            answer.pop("result", None)
            error = answer.get("error")
            if isinstance(error, dict) and "backtrace" in error:
                answer["error"] = {k: v for k, v in error.items() if k != "backtrace"}
        return answer

    def _info_answer(self, job_id: str) -> dict[str, Any] | None:
        ctx = self._worker.active.get(job_id)
        if ctx is not None:
            answer: dict[str, Any] = {
                "job_id": job_id,
                "state": "active",
                "attempt": ctx.attempt,
                "worker_id": self._worker.worker_id,
                "started_at": ctx.started_wall,
                "interruptible": self._worker.interruptible(ctx),
            }
            if ctx.cancel_requested:
                answer["cancel_requested"] = True
                if not answer["interruptible"]:
                    answer["detail"] = SYNC_CANCEL_DETAIL
            previous = error_from_headers(ctx.message.properties.headers)  # the last attempt's
            if previous is not None:
                answer["error"] = previous
            history = error_history(ctx.message.properties.headers)
            if history:
                answer["errors"] = history
            return answer
        recent = self.recent.get(job_id)
        if recent is None:
            return None
        outcome, finished = recent
        if time.time() - finished > RECENT_MAX_AGE:
            del self.recent[job_id]  # past the retention: as if never seen here
            return None
        return self._recent_answer(outcome, finished)

    def was_cancelled(self, job_id: str) -> bool:
        when = self.cancelled.get(job_id)
        if when is None:
            return False
        if time.monotonic() - when > self._worker.cancel_memory:
            del self.cancelled[job_id]
            return False
        return True

    async def beat_loop(self, client: ControlClient, scope: anyio.CancelScope) -> None:
        """BEAT (001 §5.7): every ``heartbeat_interval``, one heartbeat per running job."""
        with scope:
            while True:
                await anyio.sleep(self._worker.heartbeat_interval)
                ch = self._ch
                if ch is None:
                    continue
                for ctx in list(self._worker.active.values()):
                    try:
                        await ch.publish(
                            _json.encode({"job_id": ctx.id, "worker_id": self._worker.worker_id}),
                            exchange=client.names.direct_exchange,
                            routing_key=client.names.control_routing_key(ctx.queue),
                            properties=amqp.BasicProperties(
                                type=CONTROL_HEARTBEAT, content_type="application/json", app_id="ojs"
                            ),
                        )
                    except amqp.PublishError as exc:
                        log.warning("heartbeat for job %s not confirmed: %s", ctx.id, exc)

    async def may_reply_to(self, client: ControlClient, reply_to: str) -> bool:
        """Whether a reply (a result, an INFO answer) may go to queue ``reply_to``.

        ``reply_to`` comes from the message, which any client of the vhost can write, and
        the reply goes out with this worker's credentials.  So replies go only where a
        requester is waiting: a queue exclusive to another connection (a passive declare
        answers 405 RESOURCE_LOCKED), a reply queue of the client this worker runs on, or
        RabbitMQ's direct reply-to.  A durable or shared queue named there gets nothing.
        Checked once per name (bounded memory)."""
        if reply_to.startswith("amq.rabbitmq.reply-to") or client.owns_reply_queue(reply_to):
            return True
        known = self._reply_targets.get(reply_to)
        if known is None:
            try:
                async with client.conn.channel(confirms=False) as probe:
                    await probe.queue_declare(reply_to, passive=True)
            except amqp.ResourceLocked:
                known = True  # exclusive to another connection: a waiting requester
            except amqp.NotFound:
                return False  # gone (the requester left): nothing to send
            except ValueError:  # not a queue name at all (pamqp's check, or ours)
                known = False
            else:
                known = False  # any client could read it
            remember(self._reply_targets, reply_to, known, limit=1000)
        return known


#: How many finished jobs a worker remembers for INFO (their state, error and result), and
#: for how long (seconds): the retention of results read from any process
#: (``client.info``, ``client.result``, ``ojs-anyio info``).  docs/job-api.md.
RECENT_LIMIT: Final = 1000
RECENT_MAX_AGE: Final = 3600.0

_OUTCOME_STATE = {
    "completed": "completed",
    "retried": "retryable",
    "dead_lettered": "discarded",
    "cancelled": "cancelled",
    "abandoned": "available",
    "requeued": "available",
    "deferred": "scheduled",
}


def _drop_malformed_control(msg: amqp.IncomingMessage, queue: str) -> None:
    """A control message with a malformed content header (``msg.malformed``) is acked
    unread: its properties cannot be trusted, it cannot be relayed, and no control queue
    has a dead-letter queue.  Logged at WARNING with the reason."""
    log.warning(
        "dropping control message %s (type %s) from %s: malformed message: %s",
        amqp.property_text(msg.properties.message_id), amqp.property_text(msg.properties.type),
        queue, msg.malformed,
    )  # fmt: skip


def _epoch_text(seconds: float) -> str:
    """Epoch seconds as an OJS timestamp."""
    return format_timestamp(datetime.fromtimestamp(seconds, UTC))


def remember(table: OrderedDict[str, Any], key: str, value: Any, *, limit: int) -> None:
    """``table[key] = value``, the oldest entries dropped past ``limit``."""
    if key in table:
        table.move_to_end(key)
    table[key] = value
    for _ in range(len(table) - limit):
        table.popitem(last=False)


def _small_json(value: Any) -> bool:
    """Whether a result may be kept for INFO answers (JSON, at most 4 KiB encoded)."""
    if value is None:
        return False
    try:
        return len(_RESULT_ENCODER.encode(value)) <= 4096
    except (TypeError, ValueError, OverflowError):
        return False


_RESULT_ENCODER = msgspec.json.Encoder(enc_hook=model_json)
