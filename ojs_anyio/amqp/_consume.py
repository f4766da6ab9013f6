"""Consuming and settling: :class:`Consuming`, the part of a channel that consumes
(``consume``, ``get``, QoS, Basic.Recover, and the reader's delivery handler), the bounded
:class:`Consumer` stream, and :class:`IncomingMessage` with its batched acks.

The part owns the channel's :class:`~._consumers.ConsumerRegistry`; a message settles
through the shared :class:`~._channel_state.ChannelState` and the link, not its channel."""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, NoReturn, cast

import anyio
import anyio.lowlevel
from anyio.streams.memory import MemoryObjectStreamStatistics
from pamqp import commands

from ojs_codec import AMQPError, Delivery, GetOk, UsageError

from . import _metrics, _park
from ._channel_state import ChannelState, Settle
from ._consumers import ChannelView, ConsumerFeed, ConsumerRegistry
from ._errors import ConsumerCancelledError, DeliveryAlreadySettledError, StaleDeliveryError

if TYPE_CHECKING:
    from ._calls import Calls
    from ._channel import Channel
    from ._link import ChannelLink

__all__ = ["Consumer", "Consuming", "IncomingMessage", "property_text"]

log = logging.getLogger("ojs_anyio.amqp")

#: A consumer takes buffered deliveries without a checkpoint (no yield to the event loop,
#: no cancellation check), but checkpoints fully at least once every this many messages:
#: the bound on how long a cancelled ``async for`` over a full buffer goes on.
_YIELD_EVERY = 32
# The per-queue counters, bumped inline on the delivery and ack paths (see _metrics).
_CONSUMED = _metrics.stats.consumed
_ACKED = _metrics.stats.acked
_NACKED = _metrics.stats.nacked
_tag_counter = itertools.count(1)
_TAG_PREFIX = f"ojs-{os.getpid()}-"


def property_text(value: object) -> str | None:
    """A message property or header value as text, for logs and listings: ``None`` stays
    ``None``, a ``str`` is itself, ``bytes`` (which a malformed message may hold where
    text belongs) are decoded as UTF-8 with backslash escapes for what is not UTF-8
    (``b"id\\xff"`` gives ``"id\\xff"``), and anything else is its ``repr``."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "backslashreplace")
    return repr(value)


class IncomingMessage:
    """A message from a consumer or ``Channel.get``.

    Settle it once with :meth:`ack`, :meth:`nack` or :meth:`reject` (unless it was
    consumed with ``no_ack=True``).  Settling twice raises
    :class:`DeliveryAlreadySettledError` locally, before the broker would close the
    channel.  Settling a message received before a reconnect raises
    :class:`StaleDeliveryError`: the broker redelivers it with ``redelivered=True``.

    ``malformed`` is ``None``, or why the message's content header is valid AMQP that
    the codec's strict rules refuse (a short-string property or header key that is not
    UTF-8, headers nested deeper than 64 levels, a timestamp out of range, a header
    larger than ``frame_max``).  Such a message is still delivered, so that it can be
    settled, but its properties may hold ``bytes`` where a ``str`` is expected (an
    ``int`` for a timestamp, ``ojs_codec.NESTED_TOO_DEEP`` for a table) and it cannot be
    published again as it is.
    """

    __slots__ = (
        "_channel",
        "_consumer",
        "_generation",
        "_label",
        "_link",
        "_settled",
        "_state",
        "body",
        "consumer_tag",
        "delivery_tag",
        "exchange",
        "malformed",
        "message_count",
        "properties",
        "queue",
        "redelivered",
        "routing_key",
    )

    def __init__(
        self,
        channel: ChannelView,
        consumer: ConsumerFeed | None,
        ev: Delivery | GetOk,
        settled: bool,
        queue: str,
        label: str,
        state: ChannelState,
        link: ChannelLink,
    ) -> None:
        self._channel = channel
        #: The connection's verbs, to settle it.
        self._link = link
        #: The channel's state: its generation tells whether this delivery is stale.
        self._state = state
        self._consumer = consumer
        #: The queue it came from (the consumer's, or the one given to ``get``).
        self.queue = queue
        #: Its metric label (the queue if it is a known one, see _metrics).
        self._label = label
        self._generation = state.generation
        self._settled = settled
        self.body = ev.body
        self.properties = ev.properties
        self.exchange = ev.exchange
        self.routing_key = ev.routing_key
        self.redelivered = ev.redelivered
        self.delivery_tag = ev.delivery_tag
        self.malformed = ev.malformed
        if type(ev) is Delivery:
            self.consumer_tag = ev.consumer_tag
            self.message_count = -1
        else:
            self.consumer_tag = ""
            self.message_count = ev.message_count  # type: ignore[union-attr]

    @property
    def settled(self) -> bool:
        return self._settled

    @property
    def channel(self) -> Channel:
        return cast("Channel", self._channel)

    @property
    def is_stale(self) -> bool:
        """True when the channel it came on has closed or been recovered since: settling it
        would raise :class:`StaleDeliveryError` (the broker redelivers it)."""
        return self._state.is_stale(self._generation)

    def _begin_settle(self, multiple: bool = False) -> int:
        """Check and record settling this delivery; its channel's wire id."""
        state = self._state
        verdict = Settle.OK
        if not self._settled:
            verdict = state.settle(self.delivery_tag, self._generation, multiple)
            if verdict == Settle.ALREADY:
                self._settled = True  # covered by an earlier multiple=True ack/nack on this channel
        if self._settled:
            raise DeliveryAlreadySettledError(
                f"delivery {self.delivery_tag} was already acked, nacked or rejected "
                "(or consumed with no_ack)"
            )
        if verdict == Settle.STALE:
            raise StaleDeliveryError(
                f"delivery {self.delivery_tag} belongs to a channel that closed or was recovered since; "
                "the broker will redeliver it"
            )
        self._settled = True
        if self._consumer is not None:
            self._consumer.unacked -= 1
        elif state.get_unacked:
            state.settled_got(self._label)
        return state.cid

    async def ack(self, multiple: bool = False) -> None:
        cid = self._begin_settle(multiple)
        link = self._link
        consumer = self._consumer  # _batching, inline: the hot path
        tag = self.delivery_tag
        write = link.ack(
            cid,
            tag,
            multiple,
            consumer is not None and 0 < consumer.buffered != consumer.half_window,
            self._state.floor >= tag,
        )
        q = self._label
        try:
            _ACKED[q] += 1  # no call once the queue was counted
        except KeyError:
            _ACKED[q] = 1
        if write:
            await link.flush()

    async def nack(self, requeue: bool = True, multiple: bool = False) -> None:
        cid = self._begin_settle(multiple)
        link = self._link
        write = link.nack(cid, self.delivery_tag, multiple, requeue, self._batching())
        q = self._label
        _NACKED[q] = _NACKED.get(q, 0) + 1
        if write:
            await link.flush()

    async def reject(self, requeue: bool = True) -> None:
        cid = self._begin_settle()
        link = self._link
        write = link.reject(cid, self.delivery_tag, requeue, self._batching())
        q = self._label
        _NACKED[q] = _NACKED.get(q, 0) + 1
        if write:
            await link.flush()

    def _batching(self) -> bool:
        """Whether the settle just made may wait to be written: while the consumer still has
        deliveries buffered, the consumer sends it before it waits for the broker again,
        and the connection's flusher within ~2 ms at the latest.  Except when half the
        prefetch window is left buffered: then it goes now, so the broker sends the next
        deliveries while the consumer works through the rest (a pipeline, not stop-and-wait)."""
        consumer = self._consumer
        return consumer is not None and 0 < consumer.buffered != consumer.half_window

    def __repr__(self) -> str:
        return (
            f"<IncomingMessage tag={self.delivery_tag} exchange={self.exchange!r} "
            f"routing_key={self.routing_key!r} redelivered={self.redelivered} body=<{len(self.body)} bytes>"
            f"{'' if self.malformed is None else f' malformed={self.malformed!r}'}>"
        )


class Consumer:
    """An async iterator of :class:`IncomingMessage`, bounded by the prefetch window.

    Ends normally when the consumer is cancelled by us; raises
    :class:`ConsumerCancelledError` when the broker cancelled it (and recovery is off),
    or :class:`ChannelClosedError` / :class:`ConnectionLostError` when its channel died.

    Taking the next message is a checkpoint when it waits for one, and at least once
    every 32 messages otherwise: a message already buffered is handed over without a
    cancellation check (one costs a walk up the task's cancel scopes, more than the rest
    of the take).  So a cancelled ``async for`` whose body never awaits anything that
    checkpoints takes at most 32 more buffered messages before it is cancelled.
    """

    def __init__(self, channel: ChannelView, feed: ConsumerFeed) -> None:
        self.channel = cast("Channel", channel)
        #: The channel's side of this consumer: its parameters and delivery buffer.
        self._feed = feed
        self._since_yield = 0

    # What was asked for (the queue's current name after a recovery renamed it).

    @property
    def queue(self) -> str:
        return self._feed.queue

    @property
    def consumer_tag(self) -> str:
        return self._feed.consumer_tag

    @property
    def prefetch(self) -> int | None:
        return self._feed.prefetch

    @property
    def no_ack(self) -> bool:
        return self._feed.no_ack

    @property
    def exclusive(self) -> bool:
        return self._feed.exclusive

    @property
    def arguments(self) -> dict[str, Any] | None:
        return self._feed.arguments

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> IncomingMessage:
        feed = self._feed
        buffer = feed.buffer
        if buffer and self._since_yield < _YIELD_EVERY:
            # A delivery is already buffered: take it without a checkpoint (see the class
            # docstring); a full one every _YIELD_EVERY messages keeps other tasks running
            # and bounds how long a cancellation waits.
            self._since_yield += 1
        else:
            self._since_yield = 0
            if not buffer:
                # About to wait for the broker: send the acks batched meanwhile first.
                await feed.link.flush_deferred()
            if buffer:
                await anyio.lowlevel.checkpoint()
            while not buffer:
                if feed.ended or feed.closed:
                    return self._finish()
                # Parked until push, the reader before us, or end wakes us (in FIFO order:
                # see ConsumerFeed.wake_reader).
                try:
                    await _park.wait_in(feed.waiters)
                finally:
                    feed.waking = False
        if feed.closed:
            return self._finish()
        if not buffer:
            # Another reader took it while this one checkpointed: wait like the others.
            return await self.__anext__()
        feed.buffered -= 1
        msg = buffer.popleft()
        if buffer and feed.waiters and not feed.waking:
            feed.wake_reader()  # more to take and readers parked: the next one, before our job
        return msg

    def _finish(self) -> NoReturn:
        feed = self._feed
        if feed.waiters:
            _park.wake_all(feed.waiters)  # every reader sees the end, not only the first
        if feed.error is not None:
            raise feed.error  # as it is: "from None" would erase its __cause__
        raise StopAsyncIteration

    def statistics(self) -> MemoryObjectStreamStatistics:
        """The buffer's fill (``current_buffer_used``), its bound and the parked readers."""
        feed = self._feed
        return MemoryObjectStreamStatistics(
            current_buffer_used=len(feed.buffer),
            max_buffer_size=feed.max_buffer,
            open_send_streams=0 if feed.ended or feed.closed else 1,
            open_receive_streams=0 if feed.closed else 1,
            tasks_waiting_send=0,
            tasks_waiting_receive=len(feed.waiters),
        )

    @property
    def unacked(self) -> int:
        return self._feed.unacked

    def _end(self, error: BaseException | None) -> None:
        """End the iteration, as when the broker cancels (for tests)."""
        self._feed.end(error)


class Consuming:
    """The consuming part of a channel: its consumers, ``consume``, ``get``, QoS and
    Basic.Recover, and the reader's deliveries."""

    def __init__(self, channel: ChannelView, state: ChannelState, link: ChannelLink, calls: Calls) -> None:
        #: The facade, handed to each Consumer and IncomingMessage (their ``channel``).
        self._channel = channel
        self._state = state
        self._link = link
        self._call = calls.call
        #: The channel's consumers by tag (recovery and closing go through it too).
        self.consumers = ConsumerRegistry()

    def consumes(self, queue: str) -> bool:
        """Whether a consumer of ``queue`` is registered on this channel."""
        return self.consumers.consumes(queue)

    # -------------------------------------------------- events from the reader

    def on_delivery(self, ev: Delivery) -> None:
        try:
            consumer: ConsumerFeed | None = self.consumers.by_tag[ev.consumer_tag]  # no call, the hot path
        except KeyError:
            consumer = None
        if consumer is None or not consumer.active:
            # Sent before our Basic.Cancel took effect: give it back to the queue.
            if consumer is None or not consumer.no_ack:
                self._link.reject(self._state.cid, ev.delivery_tag, True)
            self._state.settled_tag(ev.delivery_tag)
            return
        if consumer.no_ack:
            self._state.settled_tag(ev.delivery_tag)
        q = consumer.label
        msg = IncomingMessage(
            self._channel, consumer, ev, consumer.no_ack, consumer.queue, q, self._state, self._link
        )
        if consumer.push(msg, consumer.no_ack):
            try:
                _CONSUMED[q] += 1  # no call once the queue was counted
            except KeyError:
                _CONSUMED[q] = 1
        else:
            # Only possible without a prefetch bound (no_ack consumers): fail loudly rather
            # than buffer without limit.
            log.error("consumer %s on %s overflowed its buffer", consumer.consumer_tag, consumer.queue)
            consumer.end(
                ConsumerCancelledError(
                    f"consumer on {consumer.queue!r} could not keep up: its buffer of "
                    f"{consumer.max_buffer} messages is full (set a prefetch)",
                    consumer_tag=consumer.consumer_tag,
                    queue=consumer.queue,
                )
            )
            link = self._link
            if not consumer.no_ack:
                link.reject(self._state.cid, ev.delivery_tag, True)
                self._state.settled_tag(ev.delivery_tag)
            # Nothing takes deliveries any more: stop the broker sending them (else they
            # would bounce between it and us until the consume block is left).
            cancel = commands.Basic.Cancel(consumer_tag=consumer.consumer_tag, nowait=True)
            link.send_method(self._state.cid, cancel)

    # ---------------------------------------------------------------- basic

    async def basic_qos(self, prefetch_count: int, *, prefetch_size: int = 0, global_: bool = False) -> None:
        await self._call(
            commands.Basic.Qos(prefetch_count=prefetch_count, prefetch_size=prefetch_size, global_=global_)
        )
        if not global_:
            self._state.set_prefetch(prefetch_count)

    async def get(self, queue: str, *, no_ack: bool = False) -> IncomingMessage | None:
        """Basic.Get: one message, or ``None`` when the queue is empty (for polling uses)."""
        reply = await self._call(commands.Basic.Get(queue=queue, no_ack=no_ack))
        if type(reply) is GetOk:
            label = _metrics.label(queue)
            _metrics.bump(_metrics.stats.consumed, label)
            if no_ack:
                self._state.settled_tag(reply.delivery_tag)
            else:
                self._state.got(label)
                _metrics.consumers.add(self._state)
            return IncomingMessage(self._channel, None, reply, no_ack, queue, label, self._state, self._link)
        return None

    async def recover(self, requeue: bool = True) -> None:
        """Basic.Recover: redeliver this channel's unacknowledged messages.

        Deliveries received before it can no longer be settled (their tags are void):
        settling one raises :class:`StaleDeliveryError`.
        """
        await self._call(commands.Basic.Recover(requeue=requeue))
        self._state.recovered()

    @asynccontextmanager
    async def consume(
        self,
        queue: str,
        *,
        prefetch: int | None = 100,
        no_ack: bool = False,
        exclusive: bool = False,
        arguments: dict[str, Any] | None = None,
        consumer_tag: str | None = None,
        max_buffer: int = 1024,
    ) -> AsyncIterator[Consumer]:
        """``async with ch.consume("q", prefetch=64) as messages: async for m in messages: …``

        The stream holds at most ``prefetch`` messages (the broker sends no more until
        some are acked), so memory is bounded by the prefetch window.  With ``no_ack``
        there is no window; ``max_buffer`` bounds the stream and overflow ends it with an
        error.  Leaving the block cancels the consumer and returns any message it
        buffered but never handed out to the queue.
        """
        if prefetch is not None and not no_ack:
            if prefetch < 1:
                raise UsageError("prefetch must be >= 1 (or None for the channel's QoS)")
            await self._call(commands.Basic.Qos(prefetch_count=prefetch))
        size = max_buffer if (no_ack or prefetch is None) else prefetch
        _metrics.track_queue(queue)
        consumer = ConsumerFeed(
            self._channel,
            self._link,
            queue,
            consumer_tag=consumer_tag or f"{_TAG_PREFIX}{next(_tag_counter)}",
            prefetch=prefetch,
            no_ack=no_ack,
            exclusive=exclusive,
            arguments=arguments,
            max_buffer=max(size, 1),
        )
        try:
            await self.basic_consume(consumer)
        except BaseException:
            consumer.end(None)
            consumer.close()
            raise
        try:
            yield Consumer(self._channel, consumer)
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(self._link.close_timeout):
                await self.cancel_consumer(consumer)

    async def basic_consume(self, consumer: ConsumerFeed, *, internal: bool = False) -> bool:
        """Basic.Consume for ``consumer``; False when it was not sent (see below)."""
        if internal:
            # Re-registering (recovery, resubscribe): only a consumer whose consume()
            # block is still open; one that ended meanwhile stays gone.
            if not self.consumers.holds(consumer):
                return False
        else:
            self.consumers.add(consumer)
        consumer.active = True
        try:
            await self._call(
                commands.Basic.Consume(
                    queue=consumer.queue,
                    consumer_tag=consumer.consumer_tag,
                    no_ack=consumer.no_ack,
                    exclusive=consumer.exclusive,
                    arguments=consumer.arguments,
                ),
                internal=internal,
            )
        except BaseException:
            consumer.active = False
            if not internal:
                self.consumers.remove(consumer.consumer_tag)
            raise
        return True

    async def cancel_consumer(self, consumer: ConsumerFeed) -> None:
        consumer.stop_resubscribe()
        was_active = consumer.active
        consumer.active = False
        try:
            if was_active and self._state.cid and not self._state.closed and self._link.is_connected:
                await self._call(commands.Basic.Cancel(consumer_tag=consumer.consumer_tag))
        except AMQPError:
            pass  # channel or connection already gone: the broker requeues by itself
        finally:
            self.consumers.remove(consumer.consumer_tag)
            # auto-delete queues
            self._link.topology.consumer_gone(consumer.queue, self._link.queue_consumed)
            consumer.end(None)
            buffered = consumer.drop_buffered()
            consumer.close()  # iteration ends
            # Give back what was buffered but never handed to the user.
            if not consumer.no_ack and self._state.cid and not self._state.closed:
                returned = 0
                for msg in buffered:
                    if not msg.settled and not msg.is_stale:
                        self._link.reject(self._state.cid, msg.delivery_tag, True)
                        returned += 1
                if returned:
                    _metrics.bump(_metrics.stats.nacked, consumer.label, returned)
                    try:
                        await self._link.flush()
                    except AMQPError:
                        pass  # connection gone: unacked messages return to the queue anyway
