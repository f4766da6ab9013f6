"""Presence: who is running, said every few seconds on the broker (for dashboards).

BEAT (OJS AMQP binding §5.7) exists only while a job runs, and says only which worker
runs which job.  An operator's page also wants the workers that are idle, their host,
pid, queues and concurrency, and which scheduler instance leads its group.  So every
:class:`Worker` and :class:`Scheduler` publishes a small JSON message every
``interval`` seconds, and a last one with ``state: "stopped"`` when it stops:

* exchange ``{prefix}ojs.exchange.control`` (the library's broadcast exchange, direct),
  routing key :data:`PRESENCE_KEY` (``ojs.presence``), not mandatory, not persistent;
* ``type`` :data:`WORKER_PRESENCE` or :data:`SCHEDULER_PRESENCE`, ``content_type``
  ``application/json``, ``app_id`` ``ojs``.

No OJS queue can be named ``ojs.presence`` (names beginning with ``ojs.`` are refused), so
no worker's broadcast queue is bound with that key: workers never receive these
messages, and the broker drops them when nobody listens.  An observer binds a queue of
its own with that key.  They never reach ``ojs.queue.control.{q}``, so a consumer that
follows the binding never sees them either.

Whoever can publish to the vhost can publish a presence message: it is information for
a page, never an input to a decision (:func:`decode_presence` validates the shape).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Literal, Protocol

import anyio
import msgspec

from .. import amqp
from .._common import current_backend
from ._envelope import format_timestamp

if TYPE_CHECKING:
    from ._client import Client
    from ._context import JobContext
    from ._schedule import Schedule, SchedulerEvent, SchedulerStatistics

__all__ = [
    "MAX_PRESENCE_BYTES",
    "PRESENCE_INTERVAL",
    "PRESENCE_KEY",
    "SCHEDULER_PRESENCE",
    "WORKER_PRESENCE",
    "Presence",
    "RunningJob",
    "ScheduleState",
    "SchedulerPresence",
    "WorkerPresence",
    "Wake",
    "announce",
    "decode_presence",
    "worker_presence",
]

log = logging.getLogger("ojs_anyio.jobs")

#: The routing key of presence messages on ``ojs.exchange.control``.
PRESENCE_KEY = "ojs.presence"
WORKER_PRESENCE = "ojs.presence.worker"
SCHEDULER_PRESENCE = "ojs.presence.scheduler"
#: A scheduler's presence interval (a worker uses its ``heartbeat_interval``).
PRESENCE_INTERVAL = 5.0
#: At most this many running jobs / schedules are listed in one message (the totals are
#: still given), so a message stays small whatever the worker does.
MAX_LISTED = 200
#: Larger presence messages are ignored by :func:`decode_presence`.
MAX_PRESENCE_BYTES = 256 * 1024
#: How long the last message (``state: "stopped"``) may take when a worker stops.
GOODBYE_TIMEOUT = 1.0

_Text = Annotated[str, msgspec.Meta(max_length=512)]
_Count = Annotated[int, msgspec.Meta(ge=0)]
State = Literal["running", "stopping", "stopped"]


class RunningJob(msgspec.Struct, frozen=True, kw_only=True):
    """A job a worker runs: ``age`` is seconds since its handler started, when sent."""

    job_id: _Text
    type: _Text
    queue: _Text
    attempt: _Count
    age: Annotated[float, msgspec.Meta(ge=0)]


class WorkerPresence(msgspec.Struct, frozen=True, kw_only=True):
    """What a worker says of itself every ``interval`` seconds."""

    v: int = 1
    worker_id: _Text
    host: _Text
    pid: _Count
    queues: Annotated[list[_Text], msgspec.Meta(max_length=MAX_LISTED)]
    concurrency: _Count
    backend: _Text
    state: State
    interval: Annotated[float, msgspec.Meta(gt=0)]
    sent_at: _Text
    running: Annotated[list[RunningJob], msgspec.Meta(max_length=MAX_LISTED)]
    running_total: _Count
    #: The worker's outcome counters since it started (``Worker.counts``): completed,
    #: retried, dead_lettered, cancelled...; a reader takes differences for rates.
    counts: dict[_Text, _Count]


class ScheduleState(msgspec.Struct, frozen=True, kw_only=True):
    name: _Text
    cron: _Text
    job_type: _Text
    queue: _Text
    timezone: _Text
    last_fired: _Text | None = None
    next_tick: _Text | None = None


class SchedulerPresence(msgspec.Struct, frozen=True, kw_only=True):
    """What a scheduler instance says of itself: whether it leads its group."""

    v: int = 1
    group: _Text
    instance_id: _Text
    host: _Text
    pid: _Count
    leader: bool
    leader_since: _Text | None = None
    state: State
    interval: Annotated[float, msgspec.Meta(gt=0)]
    sent_at: _Text
    schedules: Annotated[list[ScheduleState], msgspec.Meta(max_length=MAX_LISTED)]
    fired: _Count
    failed: _Count


Presence = WorkerPresence | SchedulerPresence

_encode = msgspec.json.Encoder()
_decoders: dict[str, msgspec.json.Decoder[WorkerPresence] | msgspec.json.Decoder[SchedulerPresence]] = {
    WORKER_PRESENCE: msgspec.json.Decoder(WorkerPresence),
    SCHEDULER_PRESENCE: msgspec.json.Decoder(SchedulerPresence),
}


def decode_presence(kind: str | None, body: bytes) -> Presence | None:
    """The presence message of ``type`` ``kind`` in ``body``, or None when it is not one
    (another type, too large, or not the shape above)."""
    decoder = _decoders.get(kind or "")
    if decoder is None or len(body) > MAX_PRESENCE_BYTES:
        return None
    try:
        return decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None


def _now() -> str:
    return format_timestamp(datetime.now(UTC))


class WorkerView(Protocol):
    """What a presence message reads of a worker (``Worker`` is one)."""

    worker_id: str
    queues: list[str]
    concurrency: int
    heartbeat_interval: float
    counts: dict[str, int]

    @property
    def active(self) -> Mapping[str, JobContext]: ...

    @property
    def stopping(self) -> bool: ...


def worker_presence(worker: WorkerView, stopped: bool = False) -> WorkerPresence:
    """``worker``'s presence now (``stopped``: the last one, with no running job)."""
    now = time.time()
    active = [] if stopped else list(worker.active.values())
    state: State = "stopped" if stopped else "stopping" if worker.stopping else "running"
    return WorkerPresence(
        worker_id=worker.worker_id,
        host=socket.gethostname(),
        pid=os.getpid(),
        queues=list(worker.queues)[:MAX_LISTED],
        concurrency=worker.concurrency,
        backend=current_backend(),
        state=state,
        interval=worker.heartbeat_interval,
        sent_at=_now(),
        running=[
            RunningJob(
                job_id=ctx.id,
                type=ctx.job.type,
                queue=ctx.queue,
                attempt=ctx.attempt,
                age=max(0.0, now - ctx.started_time),
            )
            for ctx in active[:MAX_LISTED]
        ],
        running_total=len(active),
        counts=dict(worker.counts),
    )


async def _publish(client: Client, presence: Presence) -> None:
    ch = await client.channel()
    await ch.publish(
        _encode.encode(presence),
        exchange=client.names.control_exchange,
        routing_key=PRESENCE_KEY,
        properties=amqp.BasicProperties(
            type=WORKER_PRESENCE if isinstance(presence, WorkerPresence) else SCHEDULER_PRESENCE,
            content_type="application/json",
            app_id="ojs",
        ),
    )


#: What a presence message may meet while the connection recovers or the broker refuses
#: it: skipped (the next one follows).  Anything else is the owner's to handle.
_SKIPPED = (amqp.PublishError, amqp.OperationTimeoutError, amqp.ChannelClosedError, amqp.ConnectionLostError)


class Wake:
    """Cuts :func:`announce`'s wait short: :meth:`set` (synchronous, from any task of the
    loop) makes the next presence message go at once."""

    def __init__(self) -> None:
        self._event: anyio.Event | None = None

    def set(self) -> None:
        if self._event is not None:
            self._event.set()

    async def sleep(self, seconds: float) -> None:
        event = self._event = anyio.Event()
        with anyio.move_on_after(seconds):
            await event.wait()


async def announce(
    client: Client,
    snapshot: Callable[[bool], Presence],
    interval: float,
    scope: anyio.CancelScope | None = None,
    *,
    wake: Wake | None = None,
) -> None:
    """Publish ``snapshot(False)`` now and every ``interval`` seconds until ``scope`` (or
    the caller's task) is cancelled, then ``snapshot(True)`` once (shielded, at most
    :data:`GOODBYE_TIMEOUT`), so observers see the stop at once rather than after a few
    silent intervals.

    A message that cannot be sent (the connection is recovering, the broker refused it)
    is skipped, not retried: the next one follows ``interval`` seconds later, and the
    connection's own log says what is wrong.  Presence is for observers; nothing in the
    worker or scheduler depends on it.
    """
    declared = False
    try:
        with scope if scope is not None else anyio.CancelScope():
            while True:
                try:
                    if not declared:  # the worker declared it already; a scheduler may not have
                        ch = await client.channel()
                        await ch.exchange_declare(client.names.control_exchange, "direct", durable=True)
                        declared = True
                    await _publish(client, snapshot(False))
                except _SKIPPED as exc:
                    log.debug("presence message skipped: %s", exc)
                await (wake or Wake()).sleep(interval)
    finally:
        if declared:
            with anyio.CancelScope(shield=True), anyio.move_on_after(GOODBYE_TIMEOUT):
                try:
                    await _publish(client, snapshot(True))
                except amqp.AMQPError as exc:  # stopping anyway: observers time the silence out
                    log.debug("last presence message not sent: %s", exc)


class SchedulerView(Protocol):
    """What a presence message reads of a cron scheduler (``Scheduler`` is one)."""

    name: str
    instance_id: str

    @property
    def is_leader(self) -> bool: ...

    @property
    def leader_since(self) -> datetime | None: ...

    @property
    def schedules(self) -> list[Schedule]: ...

    def last_fired(self, schedule: str) -> datetime | None: ...

    def statistics(self) -> SchedulerStatistics: ...

    def add_listener(self, callback: Callable[[SchedulerEvent], None]) -> Callable[[], None]: ...


def scheduler_presence(scheduler: SchedulerView, stopped: bool = False) -> SchedulerPresence:
    """``scheduler``'s presence now: whether it leads, and its schedules."""
    now = datetime.now(UTC)
    since = scheduler.leader_since
    stats = scheduler.statistics()
    schedules = []
    for s in scheduler.schedules[:MAX_LISTED]:
        last = scheduler.last_fired(s.name)
        schedules.append(
            ScheduleState(
                name=s.name,
                cron=s.cron,
                job_type=s.job_type,
                queue=s.queue,
                timezone=s.timezone,
                last_fired=format_timestamp(last) if last is not None else None,
                next_tick=format_timestamp(s.next_tick(now)),
            )
        )
    return SchedulerPresence(
        group=scheduler.name,
        instance_id=scheduler.instance_id,
        host=socket.gethostname(),
        pid=os.getpid(),
        leader=scheduler.is_leader and not stopped,
        leader_since=format_timestamp(since) if since is not None and not stopped else None,
        state="stopped" if stopped else "running",
        interval=PRESENCE_INTERVAL,
        sent_at=format_timestamp(now),
        schedules=schedules,
        fired=stats.fired,
        failed=stats.failed,
    )


async def announce_scheduler(scheduler: SchedulerView, client: Client) -> None:
    """:func:`announce` for a scheduler: every :data:`PRESENCE_INTERVAL`, and at once
    when it becomes leader or stops being leader (a failover shows without delay)."""
    wake = Wake()
    remove = scheduler.add_listener(lambda event: wake.set() if hasattr(event, "leader") else None)
    try:
        await announce(
            client,
            lambda stopped: scheduler_presence(scheduler, stopped=stopped),
            PRESENCE_INTERVAL,
            wake=wake,
        )
    finally:
        remove()
