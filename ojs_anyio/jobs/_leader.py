"""The cron scheduler's leadership token: the I/O half of leadership (issue 6).

:class:`LeaderToken` consumes the group's leader queue, holds the token, swaps it after a
fire and gives it back on the way out; whether that makes this instance the leader is the
pure table ``_schedule.Leadership``, which the :class:`~ojs_anyio.jobs.Scheduler` keeps and
feeds from the ``gained`` / ``lost`` callbacks given here.  The record of fired ticks
(``fired``) is the scheduler's dict, merged and pruned in place.

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

Operational notes: the leader queue has no job-queue arguments and is left in place when
the schedulers stop (it holds the record); delete it to forget what was fired.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from datetime import UTC, datetime
from typing import Any, Protocol

import anyio
import msgspec

from ojs_anyio.amqp import AMQPError

from .. import amqp
from ._envelope import format_timestamp, parse_timestamp
from ._errors import TopologyConflictError
from ._schedule import (
    H_SCHEDULER,
    MAX_STATE_ENTRIES,
    STATE_RETENTION,
    SWAP_TIMEOUT,
    TOKEN_TYPE,
    TokenState,
    merge_fired,
    token_decoder,
    token_encoder,
)

__all__ = ["LeaderToken", "SchedulerClock", "WallClock"]

log = logging.getLogger("ojs_anyio.scheduler")


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


class LeaderToken:
    """One scheduler instance's side of its group's leader queue (see the module docstring).

    ``gained()`` is called when a token is delivered to us, ``lost(reason, level)`` when a
    token we may hold is gone, ``wake()`` when the fire loop should look again;
    ``live_schedules()`` names the schedules whose record is never pruned.
    """

    def __init__(
        self,
        group: str,
        instance_id: str,
        *,
        clock: SchedulerClock,
        fired: dict[str, datetime],
        live_schedules: Callable[[], Collection[str]],
        gained: Callable[[], None],
        lost: Callable[[str, int], None],
        wake: Callable[[], None],
        token_refresh: float,
        retry_delay: float,
    ) -> None:
        self.group = group
        self.instance_id = instance_id
        self._clock = clock
        self._fired = fired
        self._live_schedules = live_schedules
        self._gained = gained
        self._on_lost = lost
        self._wake = wake
        self.token_refresh = token_refresh
        self.retry_delay = retry_delay
        self.queue = ""
        self.arguments: dict[str, Any] = {"x-single-active-consumer": True}
        self._held: amqp.IncomingMessage | None = None
        self._held_losses = 0
        self._losses = 0  # transports lost since reset()
        #: Our record is ahead of the held token's.
        self.dirty = False
        #: When (monotonic) to swap the token even if nothing fired.
        self.refresh_at = 0.0
        #: Serialises a token swap (publish, confirm, ack) with giving the token back.
        self.lock = anyio.Lock()
        #: The leadership channel, and when we acked a token in a swap (monotonic): the
        #: broker should hand us the new one at once (see :meth:`await_return`).
        self._channel: amqp.Channel | None = None
        self._swapped_at: float | None = None
        self.duplicates = 0
        self.swaps = 0

    # ------------------------------------------------------------ state

    def reset(self, queue: str, arguments: dict[str, Any]) -> None:
        """Before a run: the leader queue and its arguments; no transport lost yet."""
        self.queue, self.arguments = queue, arguments
        self._losses = 0
        self.lock = anyio.Lock()

    def drop(self) -> None:
        """Forget the token (after a run, or when it is known to be gone)."""
        self._held = None
        self._swapped_at = None
        self._channel = None

    def _lose(self, reason: str, level: int = logging.WARNING) -> None:
        self._swapped_at = None
        self._on_lost(reason, level)

    def on_connection_event(self, event: amqp.RecoveryEvent) -> None:
        """A connection listener.  Synchronous, from the connection's reader/supervisor:
        before any task of ours runs again, the token we held is known to be gone (the
        broker requeues it)."""
        if isinstance(event, amqp.ConnectionLost | amqp.Reconnecting):
            self._losses += 1
            self._held = None
            self._lose(f"connection lost: {event.error}")

    def holding(self) -> amqp.IncomingMessage | None:
        """The token, if we hold it and it is still valid (same transport, open channel)."""
        held = self._held
        if held is None or self._held_losses != self._losses or not held.channel.is_open:
            return None
        return held

    def swap_due(self, fired: bool) -> bool:
        """Whether to swap the held token now: something fired, our record is ahead of
        it, or it was held for ``token_refresh`` seconds."""
        return fired or self.dirty or anyio.current_time() >= self.refresh_at

    # ------------------------------------------------------------ the leader queue

    async def serve(self, conn: amqp.Connection) -> None:
        """Consume the leader queue (prefetch 1, manual acks); re-join after a channel
        error.  A connection that failed for good raises out of here."""
        while True:
            try:
                async with conn.channel(confirms=True) as ch:
                    self._channel = ch
                    await self._declare(ch)
                    try:
                        async with ch.consume(self.queue, prefetch=1) as tokens:
                            async for msg in tokens:
                                await self._accept(ch, msg)
                    finally:
                        # Our consumer is cancelled (the next one is active): requeue the
                        # token now rather than when the channel closes.
                        with anyio.CancelScope(shield=True):
                            await self.give_back()
            except (
                amqp.ChannelClosedError,
                amqp.ChannelLevelError,
                amqp.ConsumerCancelledError,
                amqp.OperationTimeoutError,  # the connection stayed away longer than publish_timeout
            ) as exc:
                self._held = None
                self._lose(f"leadership channel failed: {exc}")
                log.warning("scheduler %s: re-joining in %.1fs after %s", self.group, self.retry_delay, exc)
            await anyio.sleep(self.retry_delay)

    async def _declare(self, ch: amqp.Channel) -> None:
        info = await self._declare_queue(ch)
        if info.message_count == 0 and info.consumer_count == 0:
            # Nobody consumes, so nobody holds a token: create it.  Racing instances may
            # each create one; the leader drops the extras (see _accept).
            log.info("scheduler %s: creating the leadership token in %s", self.group, self.queue)
            await self._publish_token(ch)

    async def _declare_queue(self, ch: amqp.Channel) -> amqp.QueueInfo:
        arguments = self.arguments
        try:
            return await ch.queue_declare(self.queue, durable=True, arguments=arguments)
        except amqp.PreconditionFailed as exc:
            raise TopologyConflictError(
                f"scheduler queue {self.queue!r} exists with other arguments; ours are {arguments!r}, "
                f"the broker says: {exc.reply_text}",
                queue=self.queue,
                ours=arguments,
                broker_text=exc.reply_text,
            ) from exc

    async def recover(self, reason: str) -> None:
        """Our token is gone while we still lead (the queue was deleted, or purged during
        a swap): step down, re-declare the queue and, if it has no token, create one.
        Whoever is the active consumer then (maybe us) leads; a duplicate is merged."""
        log.error("scheduler %s: leadership token lost (%s); re-creating it", self.group, reason)
        self._held = None
        self._lose(reason)
        ch = self._channel
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
            log.warning("scheduler %s: re-creating the token failed (%s); re-joining", self.group, exc)

    async def _publish_token(self, ch: amqp.Channel) -> None:
        now = self._clock.now()
        self._prune(now)
        state = TokenState(
            group=self.group,
            fired={name: format_timestamp(tick) for name, tick in self._fired.items()},
            by=self.instance_id,
            at=format_timestamp(now),
        )
        await ch.publish(
            token_encoder.encode(state),
            exchange="",
            routing_key=self.queue,
            properties=amqp.BasicProperties(
                content_type="application/json",
                delivery_mode=2,
                type=TOKEN_TYPE,
                app_id="ojs",
                headers={H_SCHEDULER: self.group},
            ),
            mandatory=True,
        )

    def _merge(self, body: bytes) -> bool:
        """Merge a token's record into ours; return True when ours is ahead of it."""
        try:
            state = token_decoder.decode(body)
            entries = state.fired
        except msgspec.DecodeError:
            log.warning("scheduler %s: unreadable token %r; treating it as empty", self.group, body[:200])
            entries = {}
        theirs: dict[str, datetime] = {}
        for name, stamp in entries.items():
            try:
                theirs[name] = parse_timestamp(stamp)
            except (TypeError, ValueError):
                log.warning("scheduler %s: bad tick %r for %r in the token", self.group, stamp, name)
        return merge_fired(self._fired, theirs)

    def _prune(self, now: datetime) -> None:
        """Bound the record (in place): schedules gone for ``STATE_RETENTION``, then the
        oldest beyond ``MAX_STATE_ENTRIES``."""
        fired = self._fired
        cutoff = now - STATE_RETENTION
        live = self._live_schedules()
        for name in [n for n, t in fired.items() if n not in live and t < cutoff]:
            del fired[name]
        if len(fired) > MAX_STATE_ENTRIES:
            newest = sorted(fired.items(), key=lambda item: item[1], reverse=True)[:MAX_STATE_ENTRIES]
            fired.clear()
            fired.update(newest)

    async def _accept(self, ch: amqp.Channel, msg: amqp.IncomingMessage) -> None:
        """A token was delivered: we are the active consumer.  Keep it, unless more tokens
        are waiting behind it (a creation race or a crash mid-swap): then merge and drop it."""
        losses = self._losses
        ahead = self._merge(msg.body)
        self._gained()
        try:
            info = await ch.queue_declare(self.queue, passive=True)
        except AMQPError:
            if self._losses != losses:
                return  # the transport died meanwhile: this delivery is stale
            raise
        if self._losses != losses:
            return
        if info.message_count > 0:
            self.duplicates += 1
            log.info(
                "scheduler %s: dropping a duplicate token (%d more queued)", self.group, info.message_count
            )
            self.dirty = True  # persist the merged record with the next swap
            try:
                await msg.ack()
            except amqp.StaleDeliveryError:
                pass
            return
        self._held = msg
        self._held_losses = losses
        self._swapped_at = None
        self.dirty = self.dirty or ahead
        self.refresh_at = anyio.current_time() + self.token_refresh
        self._wake()

    async def swap_if_held(self, held: amqp.IncomingMessage) -> None:
        """Swap ``held`` if we still hold it.  Shielded: a swap cut between its confirm and
        its ack would leave a duplicate token (harmless, but avoidable).  Bounded."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(SWAP_TIMEOUT):
            async with self.lock:
                if self.holding() is held:
                    await self._swap(held)

    async def _swap(self, held: amqp.IncomingMessage) -> None:
        """Publish the updated token, wait for its confirm, then ack the held one."""
        losses = self._held_losses
        try:
            await self._publish_token(held.channel)
        except amqp.UnroutableError:
            await self.recover("the leadership queue was deleted")
            return
        except AMQPError:
            if self._losses != losses or not held.channel.is_open:
                return  # leadership is gone with the transport; the listener said so
            raise
        if self._held is not held or self.holding() is None:
            return  # lost meanwhile: the new token is a harmless duplicate
        self._held = None  # until the broker hands us the new one (we stay active consumer)
        self._swapped_at = anyio.current_time()
        self.dirty = False
        self.swaps += 1
        try:
            await held.ack()
        except amqp.StaleDeliveryError:
            # Delivered on a transport that died before we saw it die: we did not hold it.
            self._lose("token was stale")

    async def await_return(self, changed: anyio.Event) -> None:
        """We hold no token: wait for ``changed``.  Right after a swap (we still lead) the
        broker hands the new token to us at once, unless it is gone (queue deleted or
        purged meanwhile): after ``SWAP_TIMEOUT`` without it, :meth:`recover`."""
        swapped_at = self._swapped_at
        if swapped_at is None:
            await changed.wait()
            return
        remaining = swapped_at + SWAP_TIMEOUT - anyio.current_time()
        if remaining > 0:
            with anyio.move_on_after(remaining):
                await changed.wait()
            return
        async with self.lock:
            if self._swapped_at == swapped_at and self._held is None:
                await self.recover("the swapped token did not come back")

    async def give_back(self) -> None:
        """On the way out: requeue the token now (the channel's close would anyway), after
        any swap in progress, so a swap is never cut between its confirm and its ack."""
        async with self.lock:
            held = self.holding()
            self._held = None
            self._lose("left the leadership queue", logging.INFO)
            if held is not None:
                try:
                    await held.reject(requeue=True)
                except (AMQPError, amqp.StaleDeliveryError):
                    pass  # gone with its channel: the broker requeued it
