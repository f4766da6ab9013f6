"""Periodic (cron) jobs, fired by exactly one scheduler instance per tick (issue 6).

::

    sched = ojs.Scheduler(name="default")        # the leadership group
    sched.add("reports.daily", "0 3 * * *", args=["eu"], queue="reports", timezone="Europe/Paris")

    async with ojs.connect() as client:
        await sched.run(client)                  # until cancelled, or sched.stop()

Cron expressions are parsed and iterated by croniter: five fields, or six with *seconds as
the last field* (croniter's default, ``second_at_beginning=False``: ``"* * * * * */5"`` is
every five seconds), plus ``@daily`` and friends and Jenkins-style ``H`` (hashed on the
schedule's name).  Ticks are computed in the schedule's ``timezone`` (DST is croniter's).

Leadership
----------
Every instance of a group consumes one durable queue,
``{prefix}ojs.queue.scheduler.{group}.leader``, declared with
``x-single-active-consumer: true`` (RabbitMQ 3.8+).  The queue holds one *token* message.
Each instance consumes it with prefetch 1 and manual acks, so the broker delivers the
token only to the single active consumer, and that consumer keeps it unacked: **holding
an unacked token is being the leader**.  When the leader's channel or connection dies,
the broker requeues the token and activates the next consumer, which receives it at once
(no polling, no lease to expire).  The leader knows it lost leadership synchronously: a
connection listener clears the held token on :class:`~ojs_anyio.amqp.ConnectionLost` (and
:class:`~ojs_anyio.amqp.Reconnecting`), and a token is only trusted while no transport was
lost since it was accepted and its channel is open.  Right before each push the leader
checks that it still holds the token.

The token is created by an instance that declares the queue and sees it without
messages *and* without consumers (so nobody can be holding it).  Two instances starting
together may both see that and both publish a token.  That is harmless: only the active
consumer receives tokens, one at a time (prefetch 1), and an instance that receives a
token while the queue still has ready messages merges its state and acks it (drops the
duplicate) until it holds the last one.  Duplicates therefore never make two leaders;
they live at most until the leader's next token swap.

State: what was fired
---------------------
The token's body carries the last fired tick of every schedule (JSON:
``{"v": 1, "group": …, "fired": {schedule: tick}, …}``).  After each fire the leader
*swaps* the token: it publishes the updated token (persistent, confirmed) and only then
acks the one it holds (publish, confirm, then ack, as for retries): a crash in between
leaves two tokens, never none, and the duplicate is merged as above (per schedule, the
later tick wins).  So the next leader knows what was fired, and so does an instance
restarted after a full outage (the queue is durable, the token persistent).  We keep the state in
the token rather than elsewhere because it then moves with leadership atomically, from
the broker, without another queue or a store; in the body rather than in headers because
schedule names are free-form (table keys are short strings) and the body has no limits.
The leader also swaps the token every ``token_refresh`` seconds (60 by default) when
nothing fires: RabbitMQ closes a channel whose delivery stays unacked longer than its
``consumer_timeout`` (30 min by default; RabbitMQ has no visibility timeout), so a token held through a daily
schedule would otherwise cost the leader its channel.

A leader never fires a tick twice: it fires a tick only when it is later than the last
fired tick of its schedule (the token's, merged with its own memory).

Missed ticks (``misfire``)
--------------------------
When a new leader takes over (after a failover, a leadership gap, or a full outage), the
ticks between the last fired one and the moment it became leader were missed.

* ``"skip"`` (default): fire only ticks at or after becoming leader; missed ones are dropped.
* ``"once"``: fire the most recent missed tick once, right away, if it is at most
  ``misfire_grace`` old (1 hour by default); older ones are dropped.  Never for a schedule
  that has never fired (there is nothing it could have missed).

A leader that falls behind while leading (its loop was blocked past several ticks) fires
only the most recent due tick and logs the coalesced ones.

Double fires and idempotency
----------------------------
Each job carries the idempotency key ``{schedule}:{tick}`` (``x-ojs-idempotency-key``,
tick in UTC RFC 3339, e.g. ``reports.daily:2026-02-15T02:00:00.000Z``), the same from any
instance.  Two fires of one tick are possible, only across a leadership change: a leader
whose push was confirmed but whose token swap was not (it died in between) leaves the old
state, and a ``"once"`` successor fires that tick again; a leader the broker declared dead
(missed heartbeats) while it still ran may fire the tick its successor also fires.
Downstream dedupes on the key.

Failures.  A push the broker refused (queue full, unroutable) is logged, reported in
:class:`Fired` with its ``error``, and counts as fired (no retry storm).  A push whose
outcome is unknown (connection lost; or leadership lost while it waited, which cancels it)
is not recorded: the tick is then missed, and ``misfire`` decides.  A channel error on the
leadership channel drops leadership and re-joins after ``retry_delay``; a connection that
fails for good ends :meth:`Scheduler.run` with its error.  If the token disappears while
we lead (the queue was deleted, or purged during a swap: the leader's publish is
unroutable, or the swapped token doesn't come back within ``SWAP_TIMEOUT``), the leader
steps down, re-declares the queue and creates a token if it has none.

Structure.  :meth:`Scheduler.run` owns a task group with two tasks: the leadership task
(consumes tokens, drops duplicates) and the fire loop (sleeps to the next tick, pushes,
swaps).  Nothing outlives ``run()``; cancellation propagates; the swap and giving the token
back on the way out are shielded and bounded.  The cron and misfire logic
(:class:`Schedule`, :func:`due_tick`) is pure: time is passed in.

Operational notes: the leader queue has no job-queue arguments and is left in place when
the schedulers stop (it holds the record); delete it to forget what was fired.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import anyio
import msgspec

from ojs_anyio.amqp import AMQPError, UsageError

from .. import amqp
from .._common import single_error
from ._client import Client
from ._durations import DurationLike, duration_seconds
from ._envelope import format_timestamp, new_job, parse_timestamp
from ._errors import PushError, PushNotSentError, PushOutcomeUnknownError, TopologyConflictError
from ._presence import MAX_LISTED, PRESENCE_INTERVAL, SchedulerPresence, ScheduleState, Wake, announce
from ._retry import RetryPolicy
from ._schedule import (
    H_SCHEDULER,
    MAX_STATE_ENTRIES,
    MISFIRE_POLICIES,
    STATE_RETENTION,
    SWAP_TIMEOUT,
    TOKEN_TYPE,
    Fired,
    Leadership,
    LeadershipChanged,
    Misfire,
    Schedule,
    SchedulerEvent,
    SchedulerStatistics,
    TokenState,
    check_name,
    due_tick,
    leader_queue_name,
    merge_fired,
    token_decoder,
    token_encoder,
)
from ._topology import quorum_queue_arguments

__all__ = [
    "Fired",
    "LeadershipChanged",
    "Misfire",
    "Schedule",
    "Scheduler",
    "SchedulerEvent",
    "SchedulerStatistics",
    "due_tick",
    "leader_queue_name",
]

log = logging.getLogger("ojs_anyio.scheduler")

# ------------------------------------------------------------------ the clock seam


class SchedulerClock(Protocol):
    """Where a :class:`Scheduler` reads the time and waits for its next tick.  The default is
    the wall clock; ``ojs_anyio.testing`` supplies a virtual one (time moves when a test says)."""

    def now(self) -> datetime: ...

    async def wait(self, changed: anyio.Event, seconds: float) -> None:
        """Return when ``changed`` is set or ``seconds`` have passed (whichever is first)."""
        ...


class WallClock:
    """The default :class:`SchedulerClock`: ``datetime.now(UTC)`` and the event loop's timeouts."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def wait(self, changed: anyio.Event, seconds: float) -> None:
        with anyio.move_on_after(seconds):
            await changed.wait()


# ------------------------------------------------------------------ the scheduler


class Scheduler:
    """Pushes jobs on cron schedules; among the instances of a group, only the leader fires.

    :param name: the leadership group: instances with the same name (and client prefix)
        share one leader and one record of fired ticks.
    :param misfire: default missed-tick policy of the schedules (``"skip"`` or ``"once"``).
    :param misfire_grace: default bound on how old a missed tick ``"once"`` still fires.
    :param token_refresh: seconds between token swaps when nothing fires (well under the
        broker's ``consumer_timeout``).
    :param retry_delay: seconds before re-joining after the leadership channel failed.
    :param clock: where ticks are read and waited for (default: the wall clock); tests pass
        ``JobTester.scheduler_clock`` to fire ticks on a virtual clock.
    """

    def __init__(
        self,
        name: str = "default",
        *,
        misfire: Misfire = "skip",
        misfire_grace: DurationLike = timedelta(hours=1),
        token_refresh: DurationLike = 60.0,
        retry_delay: DurationLike = 1.0,
        instance_id: str | None = None,
        clock: SchedulerClock | None = None,
    ) -> None:
        self.name = check_name("scheduler name", name)
        self._clock: SchedulerClock = clock or WallClock()
        if misfire not in MISFIRE_POLICIES:
            raise UsageError(f"misfire must be 'skip' or 'once', not {misfire!r}")
        self.misfire: Misfire = misfire
        # Durations: seconds, a timedelta or ISO 8601 (the forms every option takes).
        self.misfire_grace = timedelta(seconds=duration_seconds(misfire_grace, "misfire_grace"))
        self.token_refresh = duration_seconds(token_refresh, "token_refresh", allow_zero=False)
        self.retry_delay = duration_seconds(retry_delay, "retry_delay")
        self.instance_id = instance_id or uuid.uuid4().hex[:12]
        self._schedules: dict[str, Schedule] = {}
        self._listeners: list[Callable[[SchedulerEvent], None]] = []
        #: Last fired tick per schedule name: the token's, merged with what we fired.
        self._fired: dict[str, datetime] = {}
        # leadership
        self._queue = ""
        self._arguments: dict[str, Any] = {"x-single-active-consumer": True}
        #: Whether this instance leads (the pure table of ``_schedule.Leadership``).
        self._leadership = Leadership()
        self._held: amqp.IncomingMessage | None = None
        self._held_losses = 0
        self._losses = 0  # transports lost since run() began
        self._dirty = False  # our state is ahead of the held token's
        self._refresh_at = 0.0
        self._changed: anyio.Event | None = None
        #: Serialises a token swap (publish, confirm, ack) with giving the token back.
        self._token_lock: anyio.Lock | None = None
        #: The leadership channel, and when we acked a token in a swap (monotonic): the
        #: broker should hand us the new one at once (see _fire_loop's watchdog).
        self._lead_channel: amqp.Channel | None = None
        self._swapped_at: float | None = None
        #: The push in flight: cancelled when leadership is lost (see _lose).
        self._push_scope: anyio.CancelScope | None = None
        self._scope: anyio.CancelScope | None = None
        self._running = False
        self._stop_requested = False
        # statistics
        self._n_fired = 0
        self._n_failed = 0
        self._n_duplicates = 0
        self._n_swaps = 0

    # ------------------------------------------------------------ configuration

    def add(
        self,
        job_type: str,
        cron: str,
        *,
        args: Sequence[Any] = (),
        name: str | None = None,
        queue: str = "default",
        timezone: str = "UTC",
        misfire: Misfire | None = None,
        misfire_grace: timedelta | None = None,
        priority: int | None = None,
        timeout: int | None = None,
        retry: RetryPolicy | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Schedule:
        """Push a ``job_type`` job with ``args`` to ``queue`` on every tick of ``cron``.

        ``name`` (default: ``job_type``) identifies the schedule: it keys the record of
        fired ticks and the idempotency key, so give two schedules of one job type
        different names.  The job is validated now (``InvalidJobError``), not at the tick.
        """
        # Validate the job now (InvalidJobError), not at the first tick.
        new_job(job_type, args, queue=queue, meta=meta, priority=priority, timeout=timeout, retry=retry)
        schedule = Schedule(
            name=name if name is not None else job_type,
            cron=cron,
            job_type=job_type,
            args=tuple(args),
            queue=queue,
            timezone=timezone,
            misfire=misfire if misfire is not None else self.misfire,
            misfire_grace=misfire_grace if misfire_grace is not None else self.misfire_grace,
            priority=priority,
            timeout=timeout,
            retry=retry,
            meta=meta,
        )
        if schedule.name in self._schedules:
            raise UsageError(f"scheduler {self.name!r} already has a schedule named {schedule.name!r}")
        self._schedules[schedule.name] = schedule
        self._wake()  # a running fire loop recomputes its next wake-up
        return schedule

    def remove(self, name: str) -> None:
        """Stop firing schedule ``name`` (its record stays in the token for a while)."""
        del self._schedules[name]
        self._wake()

    @property
    def schedules(self) -> list[Schedule]:
        return list(self._schedules.values())

    def add_listener(self, callback: Callable[[SchedulerEvent], None]) -> Callable[[], None]:
        """Call ``callback`` (synchronously) on each :class:`Fired` and :class:`LeadershipChanged`.
        Returns a function that removes it."""
        self._listeners.append(callback)

        def remove() -> None:
            if callback in self._listeners:
                self._listeners.remove(callback)

        return remove

    # ------------------------------------------------------------ introspection

    @property
    def is_leader(self) -> bool:
        """True while this instance is its group's active consumer (it fires the ticks)."""
        return self._leadership.leading

    @property
    def leader_since(self) -> datetime | None:
        return self._leadership.since if self._leadership.leading else None

    def last_fired(self, schedule: str) -> datetime | None:
        """The last fired tick of ``schedule`` this instance knows of."""
        return self._fired.get(schedule)

    def statistics(self) -> SchedulerStatistics:
        return SchedulerStatistics(
            leader=self._leadership.leading,
            leader_since=self.leader_since,
            fired=self._n_fired,
            failed=self._n_failed,
            leader_changes=self._leadership.changes,
            duplicate_tokens=self._n_duplicates,
            token_swaps=self._n_swaps,
        )

    # ------------------------------------------------------------ running

    async def run(self, client: Client) -> None:
        """Join the group and fire while leader, until cancelled or :meth:`stop`.

        Everything runs in a task group owned by this call.  On the way out the token (if
        held) goes back to the queue for the next instance.  A connection that fails for
        good raises its error here.
        """
        if self._running:
            raise UsageError("this Scheduler is already running")
        self._running = True
        self._queue = leader_queue_name(client.names, self.name)
        # A quorum client (one QueueOptions for every queue) gets a quorum leader queue, so
        # leadership survives the loss of the node a classic queue would live on.
        shared = client.shared_queue_options
        self._arguments = quorum_queue_arguments({"x-single-active-consumer": True}, shared)
        try:
            # Fail fast on a queue declared with other arguments (TopologyConflictError).
            for queue in sorted({s.queue for s in self._schedules.values()}):
                await client.declare_queue(queue)
        except BaseException:
            self._running = False
            raise
        self._losses = 0
        self._changed = anyio.Event()
        self._token_lock = anyio.Lock()
        remove_listener = client.conn.add_listener(self._on_connection_event)
        try:
            with anyio.CancelScope() as scope:
                self._scope = scope
                if self._stop_requested:
                    scope.cancel()
                try:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(self._serve_leadership, client, name="ojs-scheduler-leadership")
                        tg.start_soon(self._fire_loop, client, name="ojs-scheduler-fire")
                        tg.start_soon(announce_scheduler, self, client)  # for observers: docs/jobs.md
                except BaseExceptionGroup as eg:
                    raise (single_error(eg) or eg) from None
        finally:
            remove_listener()
            self._scope = None
            self._running = False
            self._stop_requested = False
            self._held = None
            self._lose("scheduler stopped", logging.INFO)
            self._changed = None  # add()/remove() outside run() have nothing to wake
            self._lead_channel = None

    def stop(self) -> None:
        """Make :meth:`run` return (the token goes back to the queue).  Idempotent."""
        self._stop_requested = True
        if self._scope is not None:
            self._scope.cancel()

    # ------------------------------------------------------------ leadership

    def _emit(self, event: SchedulerEvent) -> None:
        for cb in list(self._listeners):
            try:
                cb(event)
            except Exception:
                log.exception("scheduler listener %r raised", cb)

    def _wake(self) -> None:
        changed = self._changed
        if changed is not None:
            self._changed = anyio.Event()
            changed.set()

    def _on_connection_event(self, event: amqp.RecoveryEvent) -> None:
        # Synchronous, from the connection's reader/supervisor: before any task of ours
        # runs again, the token we held is known to be gone (the broker requeues it).
        if isinstance(event, amqp.ConnectionLost | amqp.Reconnecting):
            self._losses += 1
            self._held = None
            self._lose(f"connection lost: {event.error}")

    def _lose(self, reason: str, level: int = logging.WARNING) -> None:
        self._swapped_at = None
        if self._push_scope is not None:
            self._push_scope.cancel()  # a push in flight is no longer ours to make
        changed = self._leadership.lost(self._clock.now(), reason)
        if changed is not None:
            log.log(level, "scheduler %s/%s is no longer leader: %s", self.name, self.instance_id, reason)
            self._emit(changed)
        self._wake()

    def _holding(self) -> amqp.IncomingMessage | None:
        """The token, if we hold it and it is still valid (same transport, open channel)."""
        held = self._held
        if held is None or self._held_losses != self._losses or not held.channel.is_open:
            return None
        return held

    async def _serve_leadership(self, client: Client) -> None:
        """Consume the leadership queue (prefetch 1, manual acks); re-join after a channel
        error.  A connection that failed for good raises out of here."""
        while True:
            try:
                async with client.conn.channel(confirms=True) as ch:
                    self._lead_channel = ch
                    await self._declare(ch)
                    try:
                        async with ch.consume(self._queue, prefetch=1) as tokens:
                            async for msg in tokens:
                                await self._accept(ch, msg)
                    finally:
                        # Our consumer is cancelled (the next one is active): requeue the
                        # token now rather than when the channel closes.
                        with anyio.CancelScope(shield=True):
                            await self._give_back()
            except (
                amqp.ChannelClosedError,
                amqp.ChannelLevelError,
                amqp.ConsumerCancelledError,
                amqp.OperationTimeoutError,  # the connection stayed away longer than publish_timeout
            ) as exc:
                self._held = None
                self._lose(f"leadership channel failed: {exc}")
                log.warning("scheduler %s: re-joining in %.1fs after %s", self.name, self.retry_delay, exc)
            await anyio.sleep(self.retry_delay)

    async def _declare(self, ch: amqp.Channel) -> None:
        info = await self._declare_queue(ch)
        if info.message_count == 0 and info.consumer_count == 0:
            # Nobody consumes, so nobody holds a token: create it.  Racing instances may
            # each create one; the leader drops the extras (see _accept).
            log.info("scheduler %s: creating the leadership token in %s", self.name, self._queue)
            await self._publish_token(ch)

    async def _declare_queue(self, ch: amqp.Channel) -> amqp.QueueInfo:
        arguments = self._arguments
        try:
            return await ch.queue_declare(self._queue, durable=True, arguments=arguments)
        except amqp.PreconditionFailed as exc:
            raise TopologyConflictError(
                f"scheduler queue {self._queue!r} exists with other arguments; ours are {arguments!r}, "
                f"the broker says: {exc.reply_text}",
                queue=self._queue,
                ours=arguments,
                broker_text=exc.reply_text,
            ) from exc

    async def _recover_token(self, reason: str) -> None:
        """Our token is gone while we still lead (the queue was deleted, or purged during
        a swap): step down, re-declare the queue and, if it has no token, create one.
        Whoever is the active consumer then (maybe us) leads; a duplicate is merged."""
        log.error("scheduler %s: leadership token lost (%s); re-creating it", self.name, reason)
        self._held = None
        self._lose(reason)
        ch = self._lead_channel
        if ch is None or not ch.is_open:
            return  # the leadership task re-joins, which declares and creates the token
        try:
            info = await self._declare_queue(ch)
            if info.message_count == 0:
                await self._publish_token(ch)
        except (
            amqp.ChannelClosedError,
            amqp.ChannelLevelError,
            amqp.PublishError,
            amqp.OperationTimeoutError,
        ) as exc:
            log.warning("scheduler %s: re-creating the token failed (%s); re-joining", self.name, exc)

    async def _publish_token(self, ch: amqp.Channel) -> None:
        now = self._clock.now()
        self._prune(now)
        state = TokenState(
            group=self.name,
            fired={name: format_timestamp(tick) for name, tick in self._fired.items()},
            by=self.instance_id,
            at=format_timestamp(now),
        )
        await ch.publish(
            token_encoder.encode(state),
            exchange="",
            routing_key=self._queue,
            properties=amqp.BasicProperties(
                content_type="application/json",
                delivery_mode=2,
                type=TOKEN_TYPE,
                app_id="ojs",
                headers={H_SCHEDULER: self.name},
            ),
            mandatory=True,
        )

    def _merge(self, body: bytes) -> bool:
        """Merge a token's record into ours; return True when ours is ahead of it."""
        try:
            state = token_decoder.decode(body)
            entries = state.fired
        except msgspec.DecodeError:
            log.warning("scheduler %s: unreadable token %r; treating it as empty", self.name, body[:200])
            entries = {}
        theirs: dict[str, datetime] = {}
        for name, stamp in entries.items():
            try:
                theirs[name] = parse_timestamp(stamp)
            except (TypeError, ValueError):
                log.warning("scheduler %s: bad tick %r for %r in the token", self.name, stamp, name)
        return merge_fired(self._fired, theirs)

    def _prune(self, now: datetime) -> None:
        cutoff = now - STATE_RETENTION
        for name in [n for n, t in self._fired.items() if n not in self._schedules and t < cutoff]:
            del self._fired[name]
        if len(self._fired) > MAX_STATE_ENTRIES:
            by_age = sorted(self._fired.items(), key=lambda item: item[1], reverse=True)
            self._fired = dict(by_age[:MAX_STATE_ENTRIES])

    async def _accept(self, ch: amqp.Channel, msg: amqp.IncomingMessage) -> None:
        """A token was delivered: we are the active consumer.  Keep it, unless more tokens
        are waiting behind it (a creation race or a crash mid-swap): then merge and drop it."""
        losses = self._losses
        ahead = self._merge(msg.body)
        changed = self._leadership.gained(self._clock.now())
        if changed is not None:
            log.info("scheduler %s/%s became leader", self.name, self.instance_id)
            self._emit(changed)
        try:
            info = await ch.queue_declare(self._queue, passive=True)
        except AMQPError:
            if self._losses != losses:
                return  # the transport died meanwhile: this delivery is stale
            raise
        if self._losses != losses:
            return
        if info.message_count > 0:
            self._n_duplicates += 1
            log.info(
                "scheduler %s: dropping a duplicate token (%d more queued)", self.name, info.message_count
            )
            self._dirty = True  # persist the merged record with the next swap
            try:
                await msg.ack()
            except amqp.StaleDeliveryError:
                pass
            return
        self._held = msg
        self._held_losses = losses
        self._swapped_at = None
        self._dirty = self._dirty or ahead
        self._refresh_at = anyio.current_time() + self.token_refresh
        self._wake()

    async def _swap(self, held: amqp.IncomingMessage) -> None:
        """Publish the updated token, wait for its confirm, then ack the held one."""
        losses = self._held_losses
        try:
            await self._publish_token(held.channel)
        except amqp.UnroutableError:
            await self._recover_token("the leadership queue was deleted")
            return
        except AMQPError:
            if self._losses != losses or not held.channel.is_open:
                return  # leadership is gone with the transport; the listener said so
            raise
        if self._held is not held or self._holding() is None:
            return  # lost meanwhile: the new token is a harmless duplicate
        self._held = None  # until the broker hands us the new one (we stay active consumer)
        self._swapped_at = anyio.current_time()
        self._dirty = False
        self._n_swaps += 1
        try:
            await held.ack()
        except amqp.StaleDeliveryError:
            # Delivered on a transport that died before we saw it die: we did not hold it.
            self._lose("token was stale")

    async def _give_back(self) -> None:
        """On the way out: requeue the token now (the channel's close would anyway), after
        any swap in progress, so a swap is never cut between its confirm and its ack."""
        assert self._token_lock is not None
        async with self._token_lock:
            held = self._holding()
            self._held = None
            self._lose("left the leadership queue", logging.INFO)
            if held is not None:
                try:
                    await held.reject(requeue=True)
                except (AMQPError, amqp.StaleDeliveryError):
                    pass  # gone with its channel: the broker requeued it

    # ------------------------------------------------------------ firing

    async def _fire_loop(self, client: Client) -> None:
        while True:
            changed = self._changed
            assert changed is not None
            held = self._holding()
            if held is None or self._leadership.since is None:
                swapped_at = self._swapped_at
                if swapped_at is None:
                    await changed.wait()
                    continue
                # We swapped and still lead: the broker hands the new token to us at once,
                # unless it is gone (queue deleted or purged meanwhile).
                remaining = swapped_at + SWAP_TIMEOUT - anyio.current_time()
                if remaining > 0:
                    with anyio.move_on_after(remaining):
                        await changed.wait()
                    continue
                assert self._token_lock is not None
                async with self._token_lock:
                    if self._swapped_at == swapped_at and self._held is None:
                        await self._recover_token("the swapped token did not come back")
                continue
            now = self._clock.now()
            fired = False
            for schedule in list(self._schedules.values()):
                tick, late = due_tick(
                    schedule,
                    last_fired=self._fired.get(schedule.name),
                    leader_since=self._leadership.since,
                    now=now,
                )
                if tick is None:
                    continue
                if self._holding() is not held:
                    break
                fired |= await self._fire(client, schedule, tick, late)
            held_now = self._holding()
            if held_now is not held or held_now is None:
                continue
            if fired or self._dirty or anyio.current_time() >= self._refresh_at:
                # Shielded: a swap cut between its confirm and its ack would leave a
                # duplicate token (harmless, but avoidable).  Bounded, not unlimited.
                assert self._token_lock is not None
                with anyio.CancelScope(shield=True), anyio.move_on_after(SWAP_TIMEOUT):
                    async with self._token_lock:
                        if self._holding() is held_now:
                            await self._swap(held_now)
                continue
            await self._sleep_until_due(changed)

    async def _sleep_until_due(self, changed: anyio.Event) -> None:
        """Until the next tick (on the scheduler's clock), the token's refresh (on the event
        loop's clock) or a change, whichever is first.  The refresh is the broker's wall-clock
        matter (its ``consumer_timeout``) and the ticks the scheduler clock's: on a virtual
        clock, timing one by the other woke the loop every ``token_refresh`` of virtual time
        (60 times per virtual hour) for nothing."""
        now = self._clock.now()
        ticks = [(schedule.next_tick(now) - now).total_seconds() for schedule in self._schedules.values()]
        with anyio.move_on_after(max(self._refresh_at - anyio.current_time(), 0.001)):
            if ticks:
                await self._clock.wait(changed, max(min(ticks), 0.001))
            else:
                await changed.wait()

    async def _fire(self, client: Client, schedule: Schedule, tick: datetime, late: bool) -> bool:
        """Push one tick's job.  True when the tick is done with (pushed, or refused)."""
        key = schedule.idempotency_key(tick)
        last = self._fired.get(schedule.name)
        first_due = schedule.next_tick(last) if last is not None and not late else tick
        if first_due < tick:
            since = self._leadership.since
            if since is not None and first_due >= since:
                log.warning(
                    "scheduler %s: schedule %s fell behind; firing %s, coalescing the ticks since %s",
                    self.name, schedule.name, format_timestamp(tick), format_timestamp(first_due),
                )  # fmt: skip
            else:
                log.info(
                    "scheduler %s: schedule %s missed ticks from %s while nobody led (misfire=%s)",
                    self.name, schedule.name, format_timestamp(first_due), schedule.misfire,
                )  # fmt: skip
        error: Exception | None = None
        job_id: str | None = None
        scope = self._push_scope = anyio.CancelScope()
        try:
            with scope:
                if self._holding() is None:
                    scope.cancel()
                built = client.build(
                    schedule.job_type,
                    list(schedule.args),
                    queue=schedule.queue,
                    priority=schedule.priority,
                    timeout=schedule.timeout,
                    retry=schedule.retry,
                    meta=dict(schedule.meta) if schedule.meta is not None else None,
                )
                # The public push path, so the client's around_push middleware sees every
                # scheduled job.  The key is a label of the tick (x-ojs-idempotency-key,
                # claimed by nobody: window None); the leader lease, not the key, is what
                # keeps a tick from firing twice.
                job = await client.push_job(built, idempotency_key=key, idempotency_window=None)
                job_id = job.id
        except (PushOutcomeUnknownError, PushNotSentError) as exc:
            # Not sent, or maybe not: the tick is not recorded, and fires again.
            log.warning("scheduler %s: %s not confirmed (%s); not recorded", self.name, key, exc)
            if self._holding() is not None:
                await anyio.sleep(self.retry_delay)  # still leader (e.g. publish timeout): pace retries
            return False
        except (PushError, TopologyConflictError) as exc:
            log.error("scheduler %s: the broker refused %s: %s", self.name, key, exc)
            error = exc
        finally:
            self._push_scope = None
        if scope.cancelled_caught:
            # Leadership was lost mid-push (e.g. while waiting out a reconnect): the job may
            # or may not have reached the broker; the tick is not ours to record.
            log.warning("scheduler %s: leadership lost while pushing %s; not recorded", self.name, key)
            return False
        if last is None or tick > last:
            self._fired[schedule.name] = tick
        if error is None:
            self._n_fired += 1
            log.info(
                "scheduler %s fired %s%s (job %s)", self.name, key, " (missed tick)" if late else "", job_id
            )
        else:
            self._n_failed += 1
        self._emit(
            Fired(
                schedule=schedule.name, tick=tick, idempotency_key=key, job_id=job_id, late=late, error=error
            )
        )
        return True


def scheduler_presence(scheduler: Scheduler, stopped: bool = False) -> SchedulerPresence:
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



async def announce_scheduler(scheduler: Scheduler, client: Client) -> None:
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
