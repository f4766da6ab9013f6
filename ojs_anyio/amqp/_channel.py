"""Channels: synchronous methods, publishing with confirms, consumers.

``async with conn.channel() as ch:`` scopes a channel to its block.  A channel the broker
closes (403/404/405/406…) fails only its own operations, with the typed error from
:mod:`ojs_codec`; the connection and other channels carry on.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, NoReturn

import anyio
import anyio.lowlevel
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from pamqp import commands

from ojs_codec import (
    AMQPError,
    BasicProperties,
    ChannelClosed,
    ChannelLevelError,
    ChannelOpened,
    Confirmed,
    Delivery,
    GetOk,
    MethodReply,
    Returned,
    UsageError,
)

from . import _metrics, _park
from ._errors import (
    ChannelClosedError,
    ConnectionLostError,
    ConsumerCancelledError,
    DeliveryAlreadySettledError,
    PublishNackedError,
    PublishOutcomeUnknownError,
    StaleDeliveryError,
    TransactionLostError,
    UnroutableError,
)
from ._events import ConsumerRecovered, TopologyRecoveryFailed
from ._topology import queue_exists

if TYPE_CHECKING:
    from ._connection import Connection

__all__ = ["Channel", "Consumer", "IncomingMessage", "PublishHandle", "PublishWindow", "QueueInfo"]

log = logging.getLogger("ojs_anyio.amqp")

_FLUSH_THRESHOLD = 64 * 1024
#: A consumer takes buffered deliveries without yielding to the event loop, but checkpoints
#: fully at least once every this many messages.
_YIELD_EVERY = 32
# The per-queue counters, bumped inline on the delivery and ack paths (see _metrics).
_CONSUMED = _metrics.stats.consumed
_ACKED = _metrics.stats.acked
_NACKED = _metrics.stats.nacked
#: At most one confirm-latency sample per channel per this many seconds (an SDK histogram
#: record costs microseconds; at low rates every Basic.Ack frame is sampled).
_CONFIRM_SAMPLE_INTERVAL = 0.001
_tag_counter = itertools.count(1)
_TAG_PREFIX = f"ojs-{os.getpid()}-"


class QueueInfo:
    """Result of ``queue_declare``.  For a server-named queue, ``name`` follows the queue
    across reconnections (the broker gives it a new name each time)."""

    __slots__ = ("consumer_count", "message_count", "name")

    def __init__(self, name: str, message_count: int, consumer_count: int) -> None:
        self.name = name
        self.message_count = message_count
        self.consumer_count = consumer_count

    def __repr__(self) -> str:
        return (
            f"QueueInfo(name={self.name!r}, message_count={self.message_count}, "
            f"consumer_count={self.consumer_count})"
        )


class _Waiter:
    __slots__ = ("error", "event", "result")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class PublishHandle:
    """The outcome of one publish: pending until the broker confirms it.

    ``await handle.wait()`` returns when the broker acked it, and raises
    :class:`UnroutableError`, :class:`PublishNackedError` or
    :class:`PublishOutcomeUnknownError` otherwise.
    """

    __slots__ = ("_event", "_result", "_waiter", "_window", "exchange", "routing_key", "sent_at", "tag")

    def __init__(self, tag: int, exchange: str, routing_key: str, window: PublishWindow | None) -> None:
        self.tag = tag
        self.exchange = exchange
        self.routing_key = routing_key
        self._result: BaseException | bool | None = None
        #: The task waiting for the confirm (see _park): no Event per publish.
        self._waiter: Any = None
        #: Only when a second task waits on the same handle.
        self._event: anyio.Event | None = None
        self._window = window
        self.sent_at = 0.0

    @property
    def done(self) -> bool:
        return self._result is not None

    @property
    def error(self) -> BaseException | None:
        r = self._result
        return r if isinstance(r, BaseException) else None

    def _resolve(self, result: BaseException | bool) -> None:
        if self._result is not None:
            return
        self._result = result
        _park.wake(self)
        if self._event is not None:
            self._event.set()
        if self._window is not None:
            self._window._on_done(self)

    async def wait(self) -> None:
        if self._result is None:
            if self._waiter is None:
                await _park.wait(self)
            else:
                if self._event is None:
                    self._event = anyio.Event()
                await self._event.wait()
        if isinstance(self._result, BaseException):
            raise self._result

    def __repr__(self) -> str:
        state = "pending" if self._result is None else ("ok" if self._result is True else repr(self._result))
        return f"<PublishHandle tag={self.tag} {self.exchange!r}/{self.routing_key!r} {state}>"


class PublishWindow:
    """Keep up to ``max_in_flight`` publishes unconfirmed from one task, without a task per message.

    ::

        window = ch.publish_window(max_in_flight=1024)
        for body in bodies:
            await window.publish(body, exchange="", routing_key="q")  # waits only when full
        failed = await window.wait_all()  # [] when every publish was confirmed

    ``publish`` returns a :class:`PublishHandle`; ``wait_all`` flushes and waits until
    every publish of the window is resolved, and returns the handles that failed.
    """

    def __init__(self, channel: Channel, max_in_flight: int = 1024) -> None:
        if max_in_flight < 1:
            raise UsageError("max_in_flight must be >= 1")
        self.channel = channel
        self.max_in_flight = max_in_flight
        self.in_flight = 0
        self.failures: list[PublishHandle] = []
        self._wakeup: anyio.Event | None = None
        self._wake_at = 0

    async def publish(
        self,
        body: bytes,
        *,
        exchange: str = "",
        routing_key: str = "",
        properties: BasicProperties | None = None,
        mandatory: bool = False,
        timeout: float | None = None,
    ) -> PublishHandle:
        if self.in_flight >= self.max_in_flight:
            await self._wait_below(self.max_in_flight - 1)
        ch = self.channel
        handle = await ch._publish_nowait(body, exchange, routing_key, properties, mandatory, timeout, self)
        if handle._result is None:
            self.in_flight += 1
        if ch._conn._proto.has_data_to_send and len(ch._conn._proto._out) >= _FLUSH_THRESHOLD:
            await ch._flush_publish()
        return handle

    async def flush(self) -> None:
        await self.channel._flush_publish()

    async def wait_all(self) -> list[PublishHandle]:
        """Flush, wait until no publish of this window is pending; return the failed ones."""
        await self.flush()
        await self._wait_below(0)
        failed, self.failures = self.failures, []
        return failed

    async def _wait_below(self, limit: int) -> None:
        while self.in_flight > limit:
            # Armed before flushing: confirms that arrive while the flush is sending must
            # find it, or nothing would wake us once the last one is in.
            wakeup = self._wakeup = anyio.Event()
            self._wake_at = limit
            await self.channel._flush_publish()
            await wakeup.wait()

    def _on_done(self, handle: PublishHandle) -> None:
        self.in_flight -= 1
        if isinstance(handle._result, BaseException):
            self.failures.append(handle)
        if self._wakeup is not None and self.in_flight <= self._wake_at:
            self._wakeup.set()
            self._wakeup = None


class IncomingMessage:
    """A message from a consumer or ``Channel.get``.

    Settle it once with :meth:`ack`, :meth:`nack` or :meth:`reject` (unless it was
    consumed with ``no_ack=True``).  Settling twice raises
    :class:`DeliveryAlreadySettledError` locally, before the broker would close the
    channel.  Settling a message received before a reconnect raises
    :class:`StaleDeliveryError`: the broker redelivers it with ``redelivered=True``.
    """

    __slots__ = (
        "_channel",
        "_consumer",
        "_generation",
        "_settled",
        "body",
        "consumer_tag",
        "delivery_tag",
        "exchange",
        "message_count",
        "properties",
        "queue",
        "redelivered",
        "routing_key",
    )

    def __init__(
        self,
        channel: Channel,
        consumer: Consumer | None,
        ev: Delivery | GetOk,
        settled: bool,
        queue: str = "",
    ) -> None:
        self._channel = channel
        self._consumer = consumer
        #: The queue it came from (the consumer's, or the one given to ``get``); for metrics.
        self.queue = queue
        self._generation = channel._generation
        self._settled = settled
        self.body = ev.body
        self.properties = ev.properties
        self.exchange = ev.exchange
        self.routing_key = ev.routing_key
        self.redelivered = ev.redelivered
        self.delivery_tag = ev.delivery_tag
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
        return self._channel

    @property
    def is_stale(self) -> bool:
        """True when the channel it came on has closed or been recovered since: settling it
        would raise :class:`StaleDeliveryError` (the broker redelivers it)."""
        ch = self._channel
        return self._generation != ch._generation or ch._cid == 0

    def _begin_settle(self, multiple: bool = False) -> Channel:
        ch = self._channel
        if not self._settled and self.delivery_tag <= ch._settled_upto and self._generation == ch._generation:
            self._settled = True  # covered by an earlier multiple=True ack/nack on this channel
        if self._settled:
            raise DeliveryAlreadySettledError(
                f"delivery {self.delivery_tag} was already acked, nacked or rejected "
                "(or consumed with no_ack)"
            )
        if self._generation != ch._generation or ch._cid == 0:
            raise StaleDeliveryError(
                f"delivery {self.delivery_tag} belongs to a channel that closed or was recovered since; "
                "the broker will redeliver it"
            )
        self._settled = True
        if multiple and self.delivery_tag > ch._settled_upto:
            # Delivery tags grow per channel: this settles every earlier delivery too.
            ch._settled_upto = self.delivery_tag
        if self._consumer is not None:
            self._consumer._unacked -= 1
        elif ch._get_unacked:
            ch._get_unacked[self.queue] = ch._get_unacked.get(self.queue, 1) - 1
        return ch

    async def ack(self, multiple: bool = False) -> None:
        ch = self._begin_settle(multiple)
        conn = ch._conn
        conn._proto.ack(ch._cid, self.delivery_tag, multiple)
        q = self.queue
        _ACKED[q] = _ACKED.get(q, 0) + 1
        await self._send_settle(conn)

    async def nack(self, requeue: bool = True, multiple: bool = False) -> None:
        ch = self._begin_settle(multiple)
        conn = ch._conn
        conn._proto.nack(ch._cid, self.delivery_tag, multiple, requeue)
        q = self.queue
        _NACKED[q] = _NACKED.get(q, 0) + 1
        await self._send_settle(conn)

    async def reject(self, requeue: bool = True) -> None:
        ch = self._begin_settle()
        conn = ch._conn
        conn._proto.reject(ch._cid, self.delivery_tag, requeue)
        q = self.queue
        _NACKED[q] = _NACKED.get(q, 0) + 1
        await self._send_settle(conn)

    async def _send_settle(self, conn: Connection) -> None:
        """Write the ack/nack/reject just queued.  While the consumer still has deliveries
        buffered, the write is batched instead: the consumer sends it before it waits for
        the broker again, and the connection's flusher within ~2 ms at the latest."""
        consumer = self._consumer
        if consumer is not None and consumer._buffered > 0 and len(conn._proto._out) < _FLUSH_THRESHOLD:
            conn._defer_flush()
            return
        if not conn._writing:
            await conn._flush()

    def __repr__(self) -> str:
        return (
            f"<IncomingMessage tag={self.delivery_tag} exchange={self.exchange!r} "
            f"routing_key={self.routing_key!r} redelivered={self.redelivered} body=<{len(self.body)} bytes>>"
        )


class Consumer:
    """An async iterator of :class:`IncomingMessage`, bounded by the prefetch window.

    Ends normally when the consumer is cancelled by us; raises
    :class:`ConsumerCancelledError` when the broker cancelled it (and recovery is off),
    or :class:`ChannelClosedError` / :class:`ConnectionLostError` when its channel died.
    """

    def __init__(
        self,
        channel: Channel,
        queue: str,
        *,
        consumer_tag: str,
        prefetch: int | None,
        no_ack: bool,
        exclusive: bool,
        arguments: dict[str, Any] | None,
        max_buffer: int,
    ) -> None:
        self.channel = channel
        self.queue = queue
        self.consumer_tag = consumer_tag
        self.prefetch = prefetch
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.arguments = arguments
        self._send: MemoryObjectSendStream[IncomingMessage]
        self._receive: MemoryObjectReceiveStream[IncomingMessage]
        self._send, self._receive = anyio.create_memory_object_stream[IncomingMessage](max_buffer)
        self._error: BaseException | None = None
        self._active = False
        self._unacked = 0
        #: Deliveries pushed into the stream and not yet handed to the user.
        self._buffered = 0
        self._since_yield = 0
        self._resubscribe_scope: anyio.CancelScope | None = None
        _metrics.consumers.add(self)

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> IncomingMessage:
        if self._buffered == 0:
            conn = self.channel._conn
            if conn._deferred_flush:
                # About to wait for the broker: send the acks batched meanwhile first.
                await conn._flush_quietly()
        elif self._since_yield < _YIELD_EVERY:
            # A delivery is already buffered: take it without a trip through the event loop
            # (still a cancellation point); a full checkpoint every _YIELD_EVERY messages
            # keeps other tasks running.
            self._since_yield += 1
            await anyio.lowlevel.checkpoint_if_cancelled()
            try:
                msg = self._receive.receive_nowait()
            except anyio.WouldBlock:
                pass
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                return self._finish()
            else:
                self._buffered -= 1
                return msg
        self._since_yield = 0
        try:
            msg = await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            return self._finish()
        self._buffered -= 1
        return msg

    def _finish(self) -> NoReturn:
        if self._error is not None:
            raise self._error  # as it is: "from None" would erase its __cause__
        raise StopAsyncIteration

    def statistics(self) -> Any:
        return self._receive.statistics()

    @property
    def unacked(self) -> int:
        return self._unacked

    def _metrics_unacked(self) -> list[tuple[str, int, int]]:
        """``[(queue, unsettled deliveries, prefetch window or 0)]`` for the gauges."""
        if self.channel._closed:
            return []
        window = 0
        if self._active and not self.no_ack:
            window = self.prefetch if self.prefetch is not None else (self.channel.prefetch or 0)
        return [(self.queue, self._unacked, window)]

    def _push(self, msg: IncomingMessage) -> bool:
        try:
            self._send.send_nowait(msg)
        except anyio.WouldBlock:
            return False
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return False
        self._buffered += 1
        if not msg._settled:
            self._unacked += 1
        return True

    def _end(self, error: BaseException | None) -> None:
        if error is not None and self._error is None:
            self._error = error
        self._active = False
        self._send.close()

    def _drop_buffered(self) -> list[IncomingMessage]:
        dropped = []
        while True:
            try:
                dropped.append(self._receive.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                self._buffered = 0
                return dropped


class Channel:
    """An AMQP channel.  Use ``async with conn.channel() as ch:``."""

    def __init__(self, conn: Connection, *, confirms: bool = True, prefetch: int | None = None) -> None:
        self._conn = conn
        self.confirms = confirms
        self.prefetch = prefetch
        #: Set by tx_select; recovery selects tx again on the new channel.
        self.transactional = False
        #: Times the channel was opened on a transport; a transaction belongs to one.
        self._openings = 0
        self._tx_opening = 0
        self._cid = 0
        self._generation = 0
        #: Highest delivery tag settled with multiple=True in this generation.
        self._settled_upto = 0
        self._opened_once = False
        self._closed = False
        self._closed_error: BaseException | None = None
        self._waiter: _Waiter | None = None
        self._pending: dict[int, PublishHandle] = {}
        self._consumers: dict[str, Consumer] = {}
        self._returns_without_confirm: list[Returned] = []
        #: Unsettled Basic.Get deliveries of this transport, by queue (for the unacked gauge).
        self._get_unacked: dict[str, int] = {}
        #: Time publishes for the confirm-latency histogram (an SDK is installed).
        self._timing = False
        self._next_sample = 0.0
        self._internal = False
        #: While recovery re-opens it, a broker close only resets it (see _on_closed).
        self._recovering = False
        #: Set while aclose() waits for Close-Ok (and the waiter it waits on).
        self._close_waiter: _Waiter | None = None

    def __repr__(self) -> str:
        return f"<Channel id={self._cid} {'closed' if self._closed else 'open'}>"

    # ------------------------------------------------------------ lifecycle

    @property
    def channel_id(self) -> int:
        return self._cid

    @property
    def is_open(self) -> bool:
        return not self._closed and self._cid != 0

    @property
    def closed_error(self) -> BaseException | None:
        return self._closed_error

    def _metrics_unacked(self) -> list[tuple[str, int, int]]:
        """Unsettled Basic.Get deliveries by queue, for the unacked gauge (no prefetch)."""
        if self._closed:
            return []
        return [(queue, n, 0) for queue, n in self._get_unacked.items()]

    async def __aenter__(self) -> Channel:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def open(self) -> None:
        if self._opened_once:
            raise UsageError("a Channel object is opened once; ask the connection for a new one")
        self._opened_once = True
        await self._conn.wait_connected(self._conn.publish_timeout)
        self._conn._register(self)
        _metrics.stats.channels_active += 1
        try:
            await self._open_on_wire(internal=False)
        except BaseException:
            self._closed = True
            self._conn._unregister(self)
            _metrics.stats.channels_active -= 1
            if self._cid:
                # Cancelled (or failed) after Channel.Open went out: close it at the broker
                # rather than leak its id.  The Close-Ok still finds it in _by_id.
                self._conn._proto.close_channel(self._cid)
                with anyio.CancelScope(shield=True):
                    await self._conn._flush_quietly()
            raise

    async def _open_on_wire(self, *, internal: bool) -> None:
        conn = self._conn
        cid = conn._proto.open_channel()
        self._cid = cid
        self._generation += 1
        self._openings += 1
        self._settled_upto = 0
        self._timing = _metrics.timing_enabled()
        conn._by_id[cid] = self
        await self._call(None, internal=True)
        if self.confirms:
            await self._call(commands.Confirm.Select(), internal=True)
        if self.transactional:
            await self._call(commands.Tx.Select(), internal=True)
        if self.prefetch is not None:
            await self._call(commands.Basic.Qos(prefetch_count=self.prefetch), internal=True)

    async def aclose(self) -> None:
        """Close the channel (idempotent).  Pending confirms fail with "outcome unknown"."""
        if self._closed:
            return
        conn = self._conn
        with anyio.CancelScope(shield=True):
            try:
                with anyio.move_on_after(conn.close_timeout):
                    for consumer in list(self._consumers.values()):
                        await self._cancel_consumer(consumer)
                    if self._close_waiter is not None:
                        await self._close_waiter.event.wait()  # another task is closing it
                    elif self._cid and conn._connected.is_set() and not self._closed:
                        conn._proto.close_channel(self._cid)
                        # The codec drops replies once Close is out: fail the call waiting
                        # for one (calls queued behind it see _close_waiter and fail too).
                        waiter = self._close_waiter = _Waiter()
                        interrupted, self._waiter = self._waiter, waiter
                        if interrupted is not None:
                            interrupted.error = ChannelClosedError("channel closed before the broker replied")
                            interrupted.event.set()
                        await conn._flush()
                        await waiter.event.wait()
            except AMQPError:
                pass  # the connection failed meanwhile; the channel is gone with it
            finally:
                self._mark_closed(ChannelClosedError("channel closed"))

    def _mark_closed(self, error: BaseException) -> None:
        if self._closed:
            return
        self._closed = True
        if self._closed_error is None:
            self._closed_error = error
        conn = self._conn
        if self._cid and conn._by_id.get(self._cid) is self:
            del conn._by_id[self._cid]
        self._cid = 0
        self._generation += 1
        self._settled_upto = 0
        self._get_unacked = {}
        conn._unregister(self)
        _metrics.stats.channels_active -= 1
        self._fail_pending(error, outcome_unknown=True)
        for consumer in list(self._consumers.values()):
            self._stop_resubscribe(consumer)
            consumer._end(error if not isinstance(error, ChannelClosedError) or error.__cause__ else None)
        self._consumers.clear()

    def _fail_pending(self, error: BaseException, *, outcome_unknown: bool) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter.error = error
            waiter.event.set()
        if self._pending:
            pending, self._pending = self._pending, {}
            for handle in pending.values():
                exc = PublishOutcomeUnknownError(
                    f"publish to {handle.exchange!r}/{handle.routing_key!r} has no confirm: {error}"
                )
                exc.__cause__ = error
                handle._resolve(exc)

    # -------------------------------------------------- events from the reader

    def _on_reply(self, ev: object) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is None:
            return
        if type(ev) is GetOk:
            waiter.result = ev
        elif type(ev) is MethodReply:
            waiter.result = ev.method
        elif type(ev) is ChannelOpened:
            waiter.result = ev
        waiter.event.set()

    def _on_closed(self, ev: object) -> None:
        if self._recovering and isinstance(ev, ChannelClosed):
            # Recovery re-opens the channel without what the broker refused (see _recover).
            self._on_connection_gone(ev.error, final=False)
            return
        if isinstance(ev, ChannelClosed):
            err: BaseException = ev.error
            log.info("broker closed channel %d: %s", ev.channel_id, err)
            waiter, self._waiter = self._waiter, None
            if waiter is not None:
                waiter.error = err  # the RPC that caused it gets the typed error itself
                waiter.event.set()
            closed = ChannelClosedError(f"channel closed by broker: {err}")
            closed.__cause__ = err
            self._closed_error = err
            self._mark_closed(closed)
        else:  # our Close-Ok
            waiter, self._waiter = self._waiter, None
            if waiter is not None:
                waiter.event.set()

    def _on_confirmed(self, ev: Confirmed) -> None:
        pending = self._pending
        returned = ev.returned
        if ev.ack:
            if self._timing:
                # Sampled: the oldest publish a Basic.Ack frame confirms, at most once per
                # _CONFIRM_SAMPLE_INTERVAL (under load a frame covers many publishes).
                now = time.monotonic()
                if now >= self._next_sample:
                    first = pending.get(ev.tags[0]) if ev.tags else None
                    if first is not None and first.sent_at:
                        self._next_sample = now + _CONFIRM_SAMPLE_INTERVAL
                        _metrics.confirm_latency.record(now - first.sent_at, {"queue": first.routing_key})
            for tag in ev.tags:
                handle = pending.pop(tag, None)
                if handle is None:
                    continue
                if returned is not None and tag in returned:
                    r = returned[tag]
                    _metrics.bump(_metrics.stats.returned, r.routing_key)
                    handle._resolve(
                        UnroutableError(
                            f"message to exchange {r.exchange!r} with routing key {r.routing_key!r} "
                            f"was returned: {r.reply_code} {r.reply_text}",
                            reply_code=r.reply_code,
                            reply_text=r.reply_text,
                            exchange=r.exchange,
                            routing_key=r.routing_key,
                            properties=r.properties,
                        )
                    )
                else:
                    handle._resolve(True)
        else:
            for tag in ev.tags:
                handle = pending.pop(tag, None)
                if handle is not None:
                    handle._resolve(
                        PublishNackedError(
                            f"broker rejected the message to {handle.exchange!r}/{handle.routing_key!r} "
                            "(basic.nack: for example, the queue is full with x-overflow=reject-publish)",
                            exchange=handle.exchange,
                            routing_key=handle.routing_key,
                        )
                    )

    def _on_returned(self, ev: Returned) -> None:
        # Only on channels without confirms: nothing to tie it to.  Keep a bounded log.
        _metrics.bump(_metrics.stats.returned, ev.routing_key)
        log.warning("unroutable message returned on channel %d: %r", ev.channel_id, ev)
        self._returns_without_confirm.append(ev)
        del self._returns_without_confirm[:-100]

    def _on_delivery(self, ev: Delivery) -> None:
        consumer = self._consumers.get(ev.consumer_tag)
        if consumer is None or not consumer._active:
            # Sent before our Basic.Cancel took effect: give it back to the queue.
            if consumer is None or not consumer.no_ack:
                self._conn._proto.reject(self._cid, ev.delivery_tag, True)
            return
        q = consumer.queue
        msg = IncomingMessage(self, consumer, ev, consumer.no_ack, q)
        if consumer._push(msg):
            _CONSUMED[q] = _CONSUMED.get(q, 0) + 1
        else:
            # Only possible without a prefetch bound (no_ack consumers): fail loudly rather
            # than buffer without limit.
            log.error("consumer %s on %s overflowed its buffer", consumer.consumer_tag, consumer.queue)
            consumer._end(
                ConsumerCancelledError(
                    f"consumer on {consumer.queue!r} could not keep up: its buffer of "
                    f"{consumer._send.statistics().max_buffer_size} messages is full (set a prefetch)",
                    consumer_tag=consumer.consumer_tag,
                    queue=consumer.queue,
                )
            )
            proto = self._conn._proto
            if not consumer.no_ack:
                proto.reject(self._cid, ev.delivery_tag, True)
            # Nothing takes deliveries any more: stop the broker sending them (else they
            # would bounce between it and us until the consume block is left).
            cancel = commands.Basic.Cancel(consumer_tag=consumer.consumer_tag, nowait=True)
            proto.send_method(self._cid, cancel)

    def _on_consumer_cancelled(self, consumer_tag: str) -> None:
        consumer = self._consumers.get(consumer_tag)
        if consumer is None:
            return
        log.warning("broker cancelled consumer %s on queue %r", consumer_tag, consumer.queue)
        conn = self._conn
        if conn.recovery.enabled and conn._tg is not None:
            consumer._active = False
            scope = anyio.CancelScope()
            consumer._resubscribe_scope = scope
            conn._tg.start_soon(self._resubscribe, consumer, scope)
            return
        self._consumers.pop(consumer_tag, None)
        consumer._end(
            ConsumerCancelledError(
                f"broker cancelled the consumer on queue {consumer.queue!r} (queue deleted or failed over)",
                consumer_tag=consumer_tag,
                queue=consumer.queue,
            )
        )

    async def _resubscribe(self, consumer: Consumer, scope: anyio.CancelScope) -> None:
        """Re-register a consumer the broker cancelled, once its queue exists again.

        Every ``consumer_resubscribe_delay`` seconds: wait for the connection, check the
        queue with a passive declare on a scratch channel (a 404 there leaves this channel
        alone), then Basic.Consume with the consumer's own prefetch, tag and arguments.
        A reconnect meanwhile leaves this consumer to this task (see _recover).
        """
        conn = self._conn
        delay = conn.recovery.consumer_resubscribe_delay
        with scope:
            while not self._closed and consumer.consumer_tag in self._consumers:
                await anyio.sleep(delay)
                try:
                    await self._ready()
                    consumer.queue = conn.topology.current_name(consumer.queue)
                    if not await queue_exists(conn, consumer.queue):
                        continue
                    if consumer.prefetch is not None and not consumer.no_ack:
                        await self._call(commands.Basic.Qos(prefetch_count=consumer.prefetch))
                    if self._cid == 0 or not conn._connected.is_set():
                        continue  # lost again meanwhile
                    await self._basic_consume(consumer, internal=True)
                except ChannelClosedError:
                    return  # the channel is gone for good; its closing ended the consumer
                except AMQPError as exc:
                    log.info("re-registering consumer on %r failed (%s); retrying", consumer.queue, exc)
                    continue
                consumer._resubscribe_scope = None
                conn._events.emit(
                    ConsumerRecovered(
                        queue=consumer.queue, consumer_tag=consumer.consumer_tag, reason="broker-cancel"
                    )
                )
                return

    def _stop_resubscribe(self, consumer: Consumer) -> None:
        if consumer._resubscribe_scope is not None:
            consumer._resubscribe_scope.cancel()
            consumer._resubscribe_scope = None

    def _on_connection_gone(self, err: BaseException, *, final: bool) -> None:
        """The transport died.  Fail what can't survive; keep what recovery restores."""
        if self._closed:
            return
        lost = err if isinstance(err, AMQPError) else ConnectionLostError(str(err))
        if final:
            # Consumers end with the connection's own error (RecoveryFailedError when
            # recovery gave up), before closing the channel ends them more vaguely.
            for consumer in list(self._consumers.values()):
                consumer._end(lost)
            closed = ChannelClosedError(f"connection lost: {err}")
            closed.__cause__ = err
            self._mark_closed(closed)
            return
        self._cid = 0
        self._generation += 1  # deliveries handed out so far are stale (StaleDeliveryError)
        self._settled_upto = 0
        self._get_unacked = {}
        self._fail_pending(lost, outcome_unknown=True)
        for consumer in self._consumers.values():
            # The broker requeues every unacked delivery of the dead channel; those still
            # buffered will come again (redelivered=True), those handed out are stale.
            consumer._drop_buffered()
            consumer._unacked = 0

    async def _recover(self) -> None:
        """Re-open this channel on a new transport with its confirms, QoS and consumers
        (same tag, prefetch, arguments; server-named queues under their new names).

        A consumer the broker refuses (404: its queue is gone; 405: exclusive elsewhere),
        or whose queue's re-declaration failed, ends with that typed error, is reported as
        :class:`TopologyRecoveryFailed`, and the channel is recovered without it.  If the
        channel itself can't be re-opened, it is closed with the error.
        """
        if self._closed or self._internal:
            return
        # A call cancelled while it waited for its reply on an earlier transport (recovery
        # itself is cancelled when a transport dies) leaves its waiter; no reply will come.
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter.error = ConnectionLostError("the connection was lost before the reply")
            waiter.event.set()
        conn = self._conn
        topo = conn.topology
        self._recovering = True
        try:
            while True:
                current: Consumer | None = None
                recovered: list[Consumer] = []
                try:
                    await self._open_on_wire(internal=True)
                    for consumer in list(self._consumers.values()):
                        if consumer._resubscribe_scope is not None:
                            continue  # cancelled by the broker earlier: _resubscribe owns it
                        if self._consumers.get(consumer.consumer_tag) is not consumer:
                            continue  # its consume() block ended while we were recovering
                        current = consumer
                        consumer.queue = topo.current_name(consumer.queue)
                        failure = topo.failure(consumer.queue)
                        if failure is not None:
                            self._drop_consumer(consumer, failure, f"queue {consumer.queue!r} not restored")
                            continue
                        if consumer.prefetch is not None and not consumer.no_ack:
                            qos = commands.Basic.Qos(prefetch_count=consumer.prefetch)
                            await self._call(qos, internal=True)
                        if await self._basic_consume(consumer, internal=True):
                            recovered.append(consumer)
                except ChannelLevelError as exc:
                    # The broker closed the channel (_on_closed reset it): go again without
                    # the consumer it refused.
                    if current is None:
                        conn._events.emit(TopologyRecoveryFailed(what="re-opening a channel", error=exc))
                        closed = ChannelClosedError(f"channel could not be recovered: {exc}")
                        closed.__cause__ = exc
                        self._mark_closed(closed)
                        return
                    self._drop_consumer(current, exc, "re-registering it failed")
                    continue
                # A consume() block that ended while its consumer was being re-registered
                # found no broker-side consumer to cancel yet: cancel it now, or the broker
                # would keep delivering to a consumer nobody reads.
                current = None
                for consumer in recovered:
                    if self._consumers.get(consumer.consumer_tag) is not consumer:
                        cancel = commands.Basic.Cancel(consumer_tag=consumer.consumer_tag)
                        await self._call(cancel, internal=True)
                recovered = [c for c in recovered if self._consumers.get(c.consumer_tag) is c]
                break
        finally:
            self._recovering = False
        for consumer in recovered:
            conn._events.emit(
                ConsumerRecovered(
                    queue=consumer.queue, consumer_tag=consumer.consumer_tag, reason="reconnect"
                )
            )

    def _drop_consumer(self, consumer: Consumer, error: BaseException, why: str) -> None:
        """Recovery could not restore ``consumer``: end its iteration with ``error``."""
        what = f"consumer {consumer.consumer_tag} on queue {consumer.queue!r}"
        log.error("recovery: %s: %s (%s)", what, why, error)
        self._consumers.pop(consumer.consumer_tag, None)
        consumer._active = False
        consumer._end(error)
        self._conn._events.emit(TopologyRecoveryFailed(what=what, error=error))

    # ----------------------------------------------------------- plumbing

    async def _ready(self, timeout: float | None = None) -> None:
        """Wait while the connection recovers, up to ``timeout`` (default: the connection's
        ``publish_timeout``), then raise ``PublishTimeoutError``."""
        if self._closed:
            raise ChannelClosedError(f"channel is closed: {self._closed_error}") from self._closed_error
        if self._close_waiter is not None:
            raise ChannelClosedError("channel is closing")
        if self._cid == 0 or not self._conn._connected.is_set():
            await self._conn.wait_connected(timeout if timeout is not None else self._conn.publish_timeout)
            if self._closed:
                raise ChannelClosedError(f"channel is closed: {self._closed_error}") from self._closed_error

    async def _call(self, method: Any, *, internal: bool = False) -> Any:
        """Send a synchronous method and wait for its reply (``None``: Channel.Open)."""
        if not internal:
            await self._ready()
        conn = self._conn
        while self._waiter is not None:
            # An earlier call (maybe cancelled) still waits for its reply; AMQP allows one.
            await self._waiter.event.wait()
            if self._closed:
                raise ChannelClosedError(f"channel is closed: {self._closed_error}") from self._closed_error
        if self._close_waiter is not None:
            raise ChannelClosedError("channel is closing")
        waiter = _Waiter()
        self._waiter = waiter
        try:
            if method is not None:
                expects = conn._proto.send_method(self._cid, method)
                if not expects:
                    self._waiter = None
                    await conn._flush()
                    return None
            await conn._flush()
        except BaseException:
            if self._waiter is waiter:
                self._waiter = None
            raise
        await waiter.event.wait()
        if waiter.error is not None:
            err = waiter.error
            if isinstance(err, ChannelLevelError):
                raise err
            raise err
        return waiter.result

    async def _flush_publish(self) -> None:
        conn = self._conn
        try:
            await conn._flush()
        except ConnectionLostError:
            pass  # pending handles are failed with "outcome unknown" by the supervisor

    async def _publish_nowait(
        self,
        body: bytes,
        exchange: str,
        routing_key: str,
        properties: BasicProperties | None,
        mandatory: bool,
        timeout: float | None,
        window: PublishWindow | None,
    ) -> PublishHandle:
        conn = self._conn
        limit = timeout if timeout is not None else conn.publish_timeout
        if self._cid == 0 or self._closed or self._close_waiter is not None or not conn._connected.is_set():
            await self._ready(limit)  # recovering: wait for it, up to the caller's timeout
        if not conn._unblocked.is_set():
            await conn.wait_unblocked(limit)
            await self._ready(limit)
        tag = conn._proto.publish(
            self._cid, exchange, routing_key, body, properties, mandatory=mandatory
        )
        handle = PublishHandle(tag, exchange, routing_key, window)
        _metrics.bump(_metrics.stats.published, routing_key)
        if tag:
            if self._timing:
                handle.sent_at = time.monotonic()
            self._pending[tag] = handle
        else:
            handle._result = True
        return handle

    # ----------------------------------------------------------- publishing

    async def publish(
        self,
        body: bytes,
        *,
        exchange: str = "",
        routing_key: str = "",
        properties: BasicProperties | None = None,
        mandatory: bool = False,
        timeout: float | None = None,
    ) -> None:
        """Publish one message.  With confirms on, return once the broker acked it.

        Raises :class:`UnroutableError` (mandatory and no queue matched),
        :class:`PublishNackedError`, :class:`PublishOutcomeUnknownError` (the channel or
        connection died first), or :class:`BlockedTimeoutError` / ``PublishTimeoutError``
        when ``timeout`` passes while the broker blocks publishers or the connection is
        recovering.  ``properties`` are never modified.
        """
        handle = await self._publish_nowait(body, exchange, routing_key, properties, mandatory, timeout, None)
        try:
            await self._conn._flush()
        except ConnectionLostError as exc:
            if handle.tag:
                self._pending.pop(handle.tag, None)
            raise PublishOutcomeUnknownError(f"connection failed while sending the publish: {exc}") from exc
        if handle.tag:
            await handle.wait()

    def publish_window(self, max_in_flight: int = 1024) -> PublishWindow:
        """The bulk path: many publishes in flight from one task (see :class:`PublishWindow`)."""
        return PublishWindow(self, max_in_flight)

    @property
    def unconfirmed(self) -> int:
        return len(self._pending)

    # ------------------------------------------------------------ exchanges

    async def exchange_declare(
        self,
        exchange: str,
        exchange_type: str = "direct",
        *,
        passive: bool = False,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        method = commands.Exchange.Declare(
            exchange=exchange,
            exchange_type=exchange_type,
            passive=passive,
            durable=durable,
            auto_delete=auto_delete,
            internal=internal,
            arguments=arguments,
        )
        await self._call(method)
        if not passive:
            self._conn.topology.record(("exchange", exchange), method)

    async def exchange_delete(self, exchange: str, *, if_unused: bool = False) -> None:
        await self._call(commands.Exchange.Delete(exchange=exchange, if_unused=if_unused))
        self._conn.topology.forget_exchange(exchange)

    async def exchange_bind(
        self, destination: str, source: str, routing_key: str = "", arguments: dict[str, Any] | None = None
    ) -> None:
        method = commands.Exchange.Bind(
            destination=destination, source=source, routing_key=routing_key, arguments=arguments
        )
        await self._call(method)
        self._conn.topology.record(("e2e", destination, source, routing_key, _key(arguments)), method)

    async def exchange_unbind(
        self, destination: str, source: str, routing_key: str = "", arguments: dict[str, Any] | None = None
    ) -> None:
        await self._call(
            commands.Exchange.Unbind(
                destination=destination, source=source, routing_key=routing_key, arguments=arguments
            )
        )
        self._conn.topology.forget(("e2e", destination, source, routing_key, _key(arguments)))

    # --------------------------------------------------------------- queues

    async def queue_declare(
        self,
        queue: str = "",
        *,
        passive: bool = False,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> QueueInfo:
        """Declare a queue; ``queue=""`` asks the broker for a name (see ``QueueInfo.name``)."""
        method = commands.Queue.Declare(
            queue=queue,
            passive=passive,
            durable=durable,
            exclusive=exclusive,
            auto_delete=auto_delete,
            arguments=arguments,
        )
        reply = await self._call(method)
        info = QueueInfo(reply.queue, reply.message_count, reply.consumer_count)
        if not passive:
            self._conn.topology.record_queue(info, method)
        return info

    async def queue_bind(
        self, queue: str, exchange: str, routing_key: str = "", arguments: dict[str, Any] | None = None
    ) -> None:
        method = commands.Queue.Bind(
            queue=queue, exchange=exchange, routing_key=routing_key, arguments=arguments
        )
        await self._call(method)
        self._conn.topology.record(("bind", queue, exchange, routing_key, _key(arguments)), method)

    async def queue_unbind(
        self, queue: str, exchange: str, routing_key: str = "", arguments: dict[str, Any] | None = None
    ) -> None:
        await self._call(
            commands.Queue.Unbind(
                queue=queue, exchange=exchange, routing_key=routing_key, arguments=arguments
            )
        )
        self._conn.topology.forget(("bind", queue, exchange, routing_key, _key(arguments)))

    async def queue_purge(self, queue: str) -> int:
        reply = await self._call(commands.Queue.Purge(queue=queue))
        return int(reply.message_count)

    async def queue_delete(self, queue: str, *, if_unused: bool = False, if_empty: bool = False) -> int:
        reply = await self._call(commands.Queue.Delete(queue=queue, if_unused=if_unused, if_empty=if_empty))
        self._conn.topology.forget_queue(queue)
        return int(reply.message_count)

    # ---------------------------------------------------------------- basic

    async def basic_qos(self, prefetch_count: int, *, prefetch_size: int = 0, global_: bool = False) -> None:
        await self._call(
            commands.Basic.Qos(prefetch_count=prefetch_count, prefetch_size=prefetch_size, global_=global_)
        )
        if not global_:
            self.prefetch = prefetch_count

    async def get(self, queue: str, *, no_ack: bool = False) -> IncomingMessage | None:
        """Basic.Get: one message, or ``None`` when the queue is empty (for polling uses)."""
        reply = await self._call(commands.Basic.Get(queue=queue, no_ack=no_ack))
        if type(reply) is GetOk:
            _metrics.bump(_metrics.stats.consumed, queue)
            if not no_ack:
                self._get_unacked[queue] = self._get_unacked.get(queue, 0) + 1
                _metrics.consumers.add(self)
            return IncomingMessage(self, None, reply, no_ack, queue)
        return None

    async def recover(self, requeue: bool = True) -> None:
        """Basic.Recover: redeliver this channel's unacknowledged messages.

        Deliveries received before it can no longer be settled (their tags are void):
        settling one raises :class:`StaleDeliveryError`.
        """
        await self._call(commands.Basic.Recover(requeue=requeue))
        self._generation += 1
        self._settled_upto = 0

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
        consumer = Consumer(
            self,
            queue,
            consumer_tag=consumer_tag or f"{_TAG_PREFIX}{next(_tag_counter)}",
            prefetch=prefetch,
            no_ack=no_ack,
            exclusive=exclusive,
            arguments=arguments,
            max_buffer=max(size, 1),
        )
        try:
            await self._basic_consume(consumer)
        except BaseException:
            consumer._end(None)
            consumer._receive.close()
            raise
        try:
            yield consumer
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(self._conn.close_timeout):
                await self._cancel_consumer(consumer)

    async def _basic_consume(self, consumer: Consumer, *, internal: bool = False) -> bool:
        """Basic.Consume for ``consumer``; False when it was not sent (see below)."""
        if internal:
            # Re-registering (recovery, resubscribe): only a consumer whose consume()
            # block is still open; one that ended meanwhile stays gone.
            if self._consumers.get(consumer.consumer_tag) is not consumer:
                return False
        else:
            self._consumers[consumer.consumer_tag] = consumer
        consumer._active = True
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
            consumer._active = False
            if not internal:
                self._consumers.pop(consumer.consumer_tag, None)
            raise
        return True

    async def _cancel_consumer(self, consumer: Consumer) -> None:
        self._stop_resubscribe(consumer)
        was_active = consumer._active
        consumer._active = False
        try:
            if was_active and self._cid and not self._closed and self._conn._connected.is_set():
                await self._call(commands.Basic.Cancel(consumer_tag=consumer.consumer_tag))
        except AMQPError:
            pass  # channel or connection already gone: the broker requeues by itself
        finally:
            self._consumers.pop(consumer.consumer_tag, None)
            self._conn.topology.consumer_gone(self._conn, consumer.queue)  # auto-delete queues
            consumer._end(None)
            buffered = consumer._drop_buffered()
            consumer._receive.close()  # iteration ends; no stream is left unclosed
            # Give back what was buffered but never handed to the user.
            if not consumer.no_ack and self._cid and not self._closed:
                returned = 0
                for msg in buffered:
                    if not msg._settled and msg._generation == self._generation:
                        self._conn._proto.reject(self._cid, msg.delivery_tag, True)
                        returned += 1
                if returned:
                    _metrics.bump(_metrics.stats.nacked, consumer.queue, returned)
                    try:
                        await self._conn._flush()
                    except AMQPError:
                        pass  # connection gone: unacked messages return to the queue anyway

    # ------------------------------------------------------------ tx/confirm

    async def confirm_select(self) -> None:
        await self._call(commands.Confirm.Select())
        self.confirms = True

    async def tx_select(self) -> None:
        """Make the channel transactional (recovery restores this on the new channel)."""
        await self._call(commands.Tx.Select())
        self.transactional = True
        self._tx_opening = self._openings

    async def tx_commit(self) -> None:
        """Commit; raises :class:`TransactionLostError` if a reconnect rolled the
        transaction back since it began (then nothing of it was committed)."""
        if self._transaction_lost():
            raise TransactionLostError(
                "the connection was lost during this transaction and the broker rolled it back; "
                "a new transaction has begun on the recovered channel"
            )
        await self._call(commands.Tx.Commit())

    async def tx_rollback(self) -> None:
        if self._transaction_lost():
            return  # the broker already rolled it back
        await self._call(commands.Tx.Rollback())

    def _transaction_lost(self) -> bool:
        """Whether a reconnect rolled the current transaction back; the next one starts
        on the channel as it is now."""
        lost = self.transactional and self._tx_opening != self._openings
        self._tx_opening = self._openings
        return lost


def _key(arguments: dict[str, Any] | None) -> str:
    if not arguments:
        return ""
    return repr(sorted(arguments.items()))
