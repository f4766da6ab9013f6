"""The dashboard's data layer: what it shows, read from the broker with the public API only.

* Queue depths: AMQP passive declares (:class:`ojs_anyio.jobs.QueueProbe`), every
  ``refresh`` seconds, whatever the number of open pages.
* Workers and schedulers: their presence messages, and BEAT for running jobs, read from an
  exclusive queue of our own bound to ``ojs.exchange.control`` (docs/jobs.md, "Presence").
* Throughput: differences of the workers' own outcome counters (``Worker.counts``, carried
  by each presence message) between two polls.
* Dead letters, cancel, INFO: :class:`ojs_anyio.DeadLetters` and :class:`ojs_anyio.Client`.

Everything kept is bounded: at most :data:`MAX_QUEUES` queues, :data:`MAX_WORKERS` workers,
:data:`MAX_SCHEDULERS` scheduler instances, :data:`MAX_BEATS` BEATs and ``history``
samples per series.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import anyio
import anyio.abc
import msgspec

from .. import Client, DeadJob, JobInfo, amqp
from ..jobs import (
    CONTROL_HEARTBEAT,
    DELAY_LEVELS,
    PRESENCE_KEY,
    RETRY_LADDER_MS,
    QueueProbe,
    SchedulerPresence,
    ScheduleState,
    WorkerPresence,
    decode_presence,
    error_from_headers,
)

__all__ = [
    "DeadRow",
    "Observer",
    "Overview",
    "QueueRow",
    "RunningRow",
    "SchedulerGroup",
    "SchedulerRow",
    "WorkerRow",
    "observe",
]

log = logging.getLogger("ojs_anyio.dashboard")

MAX_QUEUES = 64
MAX_WORKERS = 500
MAX_SCHEDULERS = 200
MAX_BEATS = 10_000
#: A worker or scheduler silent for this many of its own intervals is shown as lost.
LOST_AFTER_INTERVALS = 3
#: Stopped and lost workers and schedulers stay on the page this long, then go.
FORGET_AFTER = 300.0
#: A missing retry queue or delay level is looked for again after this long.
ABSENT_RECHECK = 30.0
#: The throughput series, from the workers' outcome counters.
SERIES = ("completed", "retried", "dead_lettered")
#: The observer's own queue holds at most this many messages (drop-head) if it falls behind.
WATCH_MAX_LENGTH = 10_000

_decode_beat = msgspec.json.Decoder()


# ------------------------------------------------------------------ what a page shows


@dataclass(frozen=True, slots=True)
class QueueRow:
    """One OJS queue: ``None`` where the broker has no such queue (yet)."""

    queue: str
    exists: bool
    ready: int | None = None
    consumers: int | None = None
    running: int = 0
    retrying: int | None = None
    dead: int | None = None
    #: Ready jobs at each of the last polls, oldest first.
    history: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class RunningRow:
    job_id: str
    type: str
    queue: str
    attempt: int
    age: float
    worker_id: str
    #: Seconds since the last BEAT for this job was seen (None: none yet).
    beat_ago: float | None


@dataclass(frozen=True, slots=True)
class WorkerRow:
    presence: WorkerPresence
    #: live | stopping | stopped | lost
    status: str
    seen_ago: float
    running: tuple[RunningRow, ...]


@dataclass(frozen=True, slots=True)
class SchedulerRow:
    presence: SchedulerPresence
    status: str  # live | stopped | lost
    seen_ago: float


@dataclass(frozen=True, slots=True)
class SchedulerGroup:
    group: str
    leader: SchedulerRow | None
    instances: tuple[SchedulerRow, ...]
    #: The leader's schedules (else the most recent instance's).
    schedules: tuple[ScheduleState, ...]


@dataclass(frozen=True, slots=True)
class Overview:
    queues: tuple[QueueRow, ...]
    #: Jobs waiting in the scheduling delay levels, which every queue shares (None: no level exists).
    scheduled: int | None
    workers: tuple[WorkerRow, ...]
    schedulers: tuple[SchedulerGroup, ...]
    #: Jobs per second at each of the last polls, per series in :data:`SERIES`, oldest first.
    throughput: dict[str, tuple[float, ...]]
    refresh: float
    #: What went wrong at the last poll or with the observer's queue (None: all is well).
    error: str | None
    polled_ago: float | None


@dataclass(frozen=True, slots=True)
class DeadRow:
    job_id: str | None
    type: str | None
    attempt: int
    reason: str
    died_at: datetime | None
    malformed: str | None
    #: The last failed attempt's error object (type, message, backtrace), when it travelled.
    error: dict[str, Any] | None


@dataclass(slots=True)
class _Seen:
    presence: Any
    at: float


@dataclass(slots=True)
class _Series:
    size: int
    values: dict[str, deque[float]] = field(default_factory=dict)

    def add(self, key: str, value: float) -> None:
        self.values.setdefault(key, deque(maxlen=self.size)).append(value)

    def get(self, key: str) -> tuple[float, ...]:
        return tuple(self.values.get(key, ()))


# ------------------------------------------------------------------ the observer


class Observer:
    """Keeps the dashboard's picture of the broker; see the module docstring.

    Made by :func:`observe`, which owns its tasks.  ``queues`` are always shown; with
    ``discover`` the queues live workers announce are shown too (at most
    :data:`MAX_QUEUES` in all).
    """

    def __init__(
        self,
        client: Client,
        *,
        queues: Sequence[str] = (),
        refresh: float = 2.0,
        history: int = 150,
        discover: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for q in queues:
            client.names.job_queue(q)  # refuses a name that cannot be an OJS queue
        self.client = client
        self.configured: tuple[str, ...] = tuple(dict.fromkeys(queues))[:MAX_QUEUES]
        self.refresh = refresh
        self.discover = discover
        self._clock = clock
        self._workers: OrderedDict[str, _Seen] = OrderedDict()
        self._schedulers: OrderedDict[tuple[str, str], _Seen] = OrderedDict()
        #: job id -> (worker id, when its last BEAT was seen)
        self._beats: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._rows: dict[str, QueueRow] = {}
        self._depths = _Series(history)
        self._rates = _Series(history)
        self._scheduled: int | None = None
        self._absent: dict[str, float] = {}
        self._accounted: dict[str, dict[str, int]] = {}
        self._last_tick: float | None = None
        self._polled_at: float | None = None
        self._poll_error: str | None = None
        self._watch_error: str | None = None
        self._probe = QueueProbe(client)
        self._poll_lock = anyio.Lock()
        self._heard = anyio.Event()

    # -------------------------------------------------------------- reading

    def queues(self) -> list[str]:
        """The queues shown: the configured ones, then those live workers consume."""
        out = dict.fromkeys(self.configured)
        if self.discover:
            for seen in self._workers.values():
                if len(out) >= MAX_QUEUES:
                    break
                if self._status(seen) in ("stopped", "lost"):
                    continue
                for q in seen.presence.queues:
                    if q not in out and len(out) < MAX_QUEUES and _valid_queue(self.client, q):
                        out[q] = None
        return list(out)

    def overview(self) -> Overview:
        now = self._clock()
        workers = self.workers()
        running: dict[str, int] = {}
        for w in workers:
            if w.status in ("live", "stopping"):
                for r in w.running:
                    running[r.queue] = running.get(r.queue, 0) + 1
        rows = []
        for q in self.queues():
            row = self._rows.get(q, QueueRow(q, exists=False))
            rows.append(
                QueueRow(
                    q,
                    row.exists,
                    row.ready,
                    row.consumers,
                    running.get(q, 0),
                    row.retrying,
                    row.dead,
                    tuple(int(v) for v in self._depths.get(q)),
                )
            )
        errors = [e for e in (self._poll_error, self._watch_error) if e]
        return Overview(
            queues=tuple(rows),
            scheduled=self._scheduled,
            workers=tuple(workers),
            schedulers=tuple(self.scheduler_groups()),
            throughput={key: self._rates.get(key) for key in SERIES},
            refresh=self.refresh,
            error="; ".join(errors) if errors else None,
            polled_ago=None if self._polled_at is None else now - self._polled_at,
        )

    def workers(self) -> list[WorkerRow]:
        """Every worker heard from (newest first), with its running jobs."""
        now = self._clock()
        out = []
        for seen in sorted(self._workers.values(), key=self._order):
            p: WorkerPresence = seen.presence
            status = self._status(seen)
            ago = now - seen.at
            jobs: tuple[RunningRow, ...] = ()
            if status not in ("stopped", "lost"):
                jobs = tuple(
                    RunningRow(
                        r.job_id,
                        r.type,
                        r.queue,
                        r.attempt,
                        r.age + ago,
                        p.worker_id,
                        self._beat_ago(r.job_id, now),
                    )
                    for r in p.running
                )
            out.append(WorkerRow(p, status, ago, jobs))
        return out

    def scheduler_groups(self) -> list[SchedulerGroup]:
        now = self._clock()
        groups: dict[str, list[SchedulerRow]] = {}
        for seen in sorted(self._schedulers.values(), key=self._order):
            p: SchedulerPresence = seen.presence
            groups.setdefault(p.group, []).append(SchedulerRow(p, self._status(seen), now - seen.at))
        out = []
        for group in sorted(groups):
            rows = groups[group]
            leaders = [r for r in rows if r.status == "live" and r.presence.leader]
            leader = leaders[0] if leaders else None
            source = leader or rows[0]
            out.append(SchedulerGroup(group, leader, tuple(rows), tuple(source.presence.schedules)))
        return out

    def running_job(self, job_id: str) -> RunningRow | None:
        for w in self.workers():
            for r in w.running:
                if r.job_id == job_id:
                    return r
        return None

    def _order(self, seen: _Seen) -> tuple[bool, str, int, str]:
        """Stable rows: the ones still there first, then by host, pid and id."""
        p = seen.presence
        ident = p.worker_id if isinstance(p, WorkerPresence) else p.instance_id
        return (self._status(seen) in ("stopped", "lost"), p.host, p.pid, ident)

    def _status(self, seen: _Seen) -> str:
        p = seen.presence
        if p.state == "stopped":
            return "stopped"
        if self._clock() - seen.at > LOST_AFTER_INTERVALS * p.interval + 1.0:
            return "lost"
        return "stopping" if p.state == "stopping" else "live"

    def _beat_ago(self, job_id: str, now: float) -> float | None:
        beat = self._beats.get(job_id)
        return None if beat is None else now - beat[1]

    async def wait_heard(self) -> None:
        """Wait until the next presence message or BEAT is taken in (for tests and pages)."""
        await self._heard.wait()

    # -------------------------------------------------------------- polling

    async def poll(self, *, sample: bool = True) -> None:
        """Read every queue's depths now (also done every ``refresh`` seconds).

        ``sample``: also add a point to the sparklines (the depths and the throughput).
        A poll made right after an action does not, so the points stay evenly spaced
        and a rate is never taken over a few milliseconds."""
        async with self._poll_lock:
            try:
                await self._poll(sample)
            except amqp.UsageError:
                raise
            except amqp.AMQPError as exc:
                self._poll_error = f"cannot read the queues: {exc}"
                raise
            self._poll_error = None

    async def _poll(self, sample: bool) -> None:
        names = self.client.names
        now = self._clock()
        rows: dict[str, QueueRow] = {}
        for q in self.queues():
            job = await self._probe.queue(names.job_queue(q))
            if job is None:
                rows[q] = QueueRow(q, exists=False)
                continue
            dead = await self._probe_cached(names.dlx_queue(q), now)
            retrying = 0
            for ms in RETRY_LADDER_MS:
                info = await self._probe_cached(names.retry_queue(q, ms), now)
                retrying += info.message_count if info is not None else 0
            rows[q] = QueueRow(
                q,
                exists=True,
                ready=job.message_count,
                consumers=job.consumer_count,
                retrying=retrying,
                dead=None if dead is None else dead.message_count,
            )
            if sample:
                self._depths.add(q, job.message_count)
        scheduled = None
        for k in range(DELAY_LEVELS):
            info = await self._probe_cached(names.delay_queue(k), now)
            if info is not None:
                scheduled = (scheduled or 0) + info.message_count
        self._rows = rows
        self._scheduled = scheduled
        if sample:
            self._tick(now)
        self._polled_at = now
        self._forget(now)

    async def _probe_cached(self, name: str, now: float) -> amqp.QueueInfo | None:
        """A passive declare, except for a queue found missing less than ABSENT_RECHECK ago
        (each miss costs a channel: the broker closes it with 404)."""
        missing = self._absent.get(name)
        if missing is not None and now - missing < ABSENT_RECHECK:
            return None
        info = await self._probe.queue(name)
        if info is None:
            self._absent[name] = now
        else:
            self._absent.pop(name, None)
        return info

    def _tick(self, now: float) -> None:
        """One throughput sample: what the workers' counters grew by since the last poll,
        per second.  A worker's first message is its baseline (its past is not a spike)."""
        totals = dict.fromkeys(SERIES, 0)
        for worker_id, seen in self._workers.items():
            counts = seen.presence.counts
            base = self._accounted.get(worker_id)
            if base is not None:
                for key in SERIES:
                    totals[key] += max(0, counts.get(key, 0) - base.get(key, 0))
            self._accounted[worker_id] = dict(counts)
        if self._last_tick is not None and now > self._last_tick:
            for key in SERIES:
                self._rates.add(key, totals[key] / (now - self._last_tick))
        self._last_tick = now

    def _forget(self, now: float) -> None:
        for worker_id, seen in list(self._workers.items()):
            if self._gone(seen, now):
                del self._workers[worker_id]
                self._accounted.pop(worker_id, None)
        for key, seen in list(self._schedulers.items()):
            if self._gone(seen, now):
                del self._schedulers[key]
        shown = set(self.queues())
        for q in list(self._depths.values):
            if q not in shown:
                del self._depths.values[q]

    def _gone(self, seen: _Seen, now: float) -> bool:
        return self._status(seen) in ("stopped", "lost") and now - seen.at > FORGET_AFTER

    async def _poll_loop(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        started = False
        while True:
            try:
                await self.poll()
            except amqp.UsageError:
                raise
            except amqp.AMQPError as exc:
                log.warning("dashboard: %s", exc)  # and shown on the page until a poll works
            if not started:
                task_status.started()
                started = True
            await anyio.sleep(self.refresh)

    # -------------------------------------------------------------- watching

    async def _watch_loop(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        ready = False

        def mark_ready() -> None:
            nonlocal ready
            if not ready:
                ready = True
                task_status.started()

        while True:
            try:
                await self._watch(mark_ready)
            except amqp.UsageError:
                raise
            except amqp.AMQPError as exc:
                self._watch_error = f"not receiving presence messages: {exc}"
                log.warning("dashboard: %s", self._watch_error)
            mark_ready()  # the page says what is wrong meanwhile
            await anyio.sleep(self.refresh)

    async def _watch(self, mark_ready: Callable[[], None]) -> None:
        names = self.client.names
        async with self.client.conn.channel(confirms=False) as ch:
            await ch.exchange_declare(names.control_exchange, "direct", durable=True)
            own = await ch.queue_declare(
                "",
                exclusive=True,
                auto_delete=True,
                arguments={"x-max-length": WATCH_MAX_LENGTH, "x-overflow": "drop-head"},
            )
            await ch.queue_bind(own.name, names.control_exchange, PRESENCE_KEY)
            bound: set[str] = set()
            await self._bind_beats(ch, own.name, bound)
            async with ch.consume(own.name, prefetch=256) as messages, anyio.create_task_group() as tg:
                tg.start_soon(self._keep_bound, ch, own.name, bound)
                self._watch_error = None
                mark_ready()
                async for msg in messages:
                    self._take(msg)
                    await msg.ack()

    async def _bind_beats(self, ch: amqp.Channel, queue: str, bound: set[str]) -> None:
        """BEATs are relayed to ``ojs.exchange.control`` with the OJS queue as routing key."""
        for q in self.queues():
            if q not in bound:
                await ch.queue_bind(queue, self.client.names.control_exchange, q)
                bound.add(q)

    async def _keep_bound(self, ch: amqp.Channel, queue: str, bound: set[str]) -> None:
        while True:
            await anyio.sleep(self.refresh)
            await self._bind_beats(ch, queue, bound)

    def _take(self, msg: amqp.IncomingMessage) -> None:
        """One message of the observer's queue: a presence message or a BEAT; anything else
        (CANCEL, INFO, another client's messages) is not ours to read."""
        if msg.malformed is not None:
            return
        kind = msg.properties.type
        now = self._clock()
        if kind == CONTROL_HEARTBEAT:
            try:
                data = _decode_beat.decode(msg.body)
            except (msgspec.DecodeError, RecursionError):
                return
            if isinstance(data, dict):
                job_id, worker_id = data.get("job_id"), data.get("worker_id")
                if isinstance(job_id, str) and isinstance(worker_id, str):
                    _remember(self._beats, job_id, (worker_id, now), MAX_BEATS)
                    self._hear()
            return
        presence = decode_presence(kind, msg.body)
        if isinstance(presence, WorkerPresence):
            _remember(self._workers, presence.worker_id, _Seen(presence, now), MAX_WORKERS)
            self._hear()
        elif isinstance(presence, SchedulerPresence):
            key = (presence.group, presence.instance_id)
            _remember(self._schedulers, key, _Seen(presence, now), MAX_SCHEDULERS)
            self._hear()

    def _hear(self) -> None:
        heard, self._heard = self._heard, anyio.Event()
        heard.set()

    # -------------------------------------------------------------- acting

    async def dead_jobs(self, queue: str, limit: int = 50) -> tuple[int | None, list[DeadRow]]:
        """``(how many dead jobs, the oldest `limit` of them)``; ``(None, [])`` when the
        queue has no dead-letter queue.  Nothing is removed (``DeadLetters.peek``)."""
        name = self.client.names.dlx_queue(queue)
        async with self._poll_lock:
            info = await self._probe.queue(name)
        if info is None:
            return None, []
        jobs = await self.client.dead_letters(queue).peek(limit)
        return info.message_count, [_dead_row(j) for j in jobs]

    async def requeue(self, queue: str, ids: Iterable[str] | None, *, reset_attempts: bool) -> int:
        """Move dead jobs (those of ``ids``, or all) back to their queue:
        ``DeadLetters.requeue`` (publish, confirm, then ack: never lost)."""
        wanted = None if ids is None else list(ids)
        # The job queue as it is (QueueNotFoundError if missing): requeue would otherwise
        # declare it with default options, which a queue declared with others refuses.
        await self.client.use_existing_queue(queue)
        moved = await self.client.dead_letters(queue).requeue(ids=wanted, reset_attempts=reset_attempts)
        await self._poll_quietly()
        return moved

    async def purge(self, queue: str) -> int:
        """Delete every dead job of ``queue`` (``Queue.Purge``: whole or not at all)."""
        purged = await self.client.dead_letters(queue).purge()
        await self._poll_quietly()
        return purged

    async def cancel(self, job_id: str, queue: str) -> None:
        """CANCEL (OJS AMQP binding §5.6) to the workers of ``queue``."""
        await self.client.cancel(job_id, queue=queue)

    async def info(self, job_id: str, queue: str | None, timeout: float = 2.0) -> tuple[str | None, JobInfo]:
        """INFO about ``job_id``: asked of the workers of ``queue``, else of the queue a
        worker says it runs it in, else of each queue shown in turn.  ``(queue, answer)``;
        the answer's state is ``unknown`` when no worker answered."""
        if queue is not None:
            candidates = [queue]
        else:
            running = self.running_job(job_id)
            candidates = [running.queue] if running is not None else self.queues()
            candidates = [q for q in candidates if q in self._rows and self._rows[q].exists]
        for q in candidates:
            answer = await self.client.info(job_id, queue=q, timeout=timeout)
            if answer.state != "unknown":
                return q, answer
        return queue, JobInfo(id=job_id, state="unknown")

    async def _poll_quietly(self) -> None:
        """Poll after an action, so the page shows its effect; a failure shows on the page."""
        try:
            await self.poll(sample=False)
        except amqp.UsageError:
            raise
        except amqp.AMQPError:
            pass  # kept in the page's error line until the next poll works


def _valid_queue(client: Client, queue: str) -> bool:
    try:
        client.names.job_queue(queue)
    except amqp.UsageError:  # TopologyError too: a name no OJS queue can have
        return False
    return True


def _remember(table: OrderedDict[Any, Any], key: Any, value: Any, limit: int) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > limit:
        table.popitem(last=False)


def _dead_row(job: DeadJob) -> DeadRow:
    return DeadRow(
        job_id=job.id,
        type=job.type,
        attempt=job.attempt,
        reason=job.reason,
        died_at=job.died_at,
        malformed=job.malformed,
        error=error_from_headers(job.headers),
    )


@asynccontextmanager
async def observe(
    client: Client,
    *,
    queues: Sequence[str] = (),
    refresh: float = 2.0,
    history: int = 150,
    discover: bool = True,
) -> AsyncIterator[Observer]:
    """An :class:`Observer` of ``client``'s broker, polling and watching for the block.

    Returns once the first poll is done and the observer's queue is bound (or failed: the
    page then says why, and both are tried again every ``refresh`` seconds)."""
    observer = Observer(client, queues=queues, refresh=refresh, history=history, discover=discover)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(observer._watch_loop)
            await tg.start(observer._poll_loop)
            try:
                yield observer
            finally:
                tg.cancel_scope.cancel()
    finally:
        await observer._probe.aclose()
