"""A channel's life: opening, closing, the transport going away, and recovery.

:class:`Lifecycle` is the part of a channel that opens and closes it and carries it
across a lost transport.  It drives the other parts through their public verbs (the
:class:`~._calls.Calls`, the :class:`~._publish.Publisher` whose pending confirms fail
when the channel dies, the :class:`~._consume.Consuming` whose consumers it ends or
re-registers) and moves the shared :class:`~._channel_state.ChannelState` only through its
transitions.  It makes the channel's :class:`~._interfaces.ChannelEndpoint`: the parts'
bound handlers, for the connection to call.

On a new transport the connection re-declares the recorded topology
(:func:`replay_topology`, on a private :class:`ScratchChannel`), then asks each channel to
:meth:`~Lifecycle.recover`: re-open with its confirms, QoS, transaction mode and
consumers.  A consumer the broker cancelled is re-registered by :meth:`~Lifecycle.resubscribe`
once its queue exists again.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
from pamqp import commands

from ojs_codec import AMQPError, ChannelClosed, ChannelLevelError, NotFound, UsageError

from . import _metrics
from ._calls import Calls
from ._channel_state import ChannelState
from ._consume import Consuming
from ._consumers import ConsumerFeed
from ._errors import ChannelClosedError, ConnectionLostError, ConsumerCancelledError
from ._events import ConsumerRecovered, TopologyRecoveryFailed
from ._interfaces import ChannelEndpoint
from ._publish import Publisher

if TYPE_CHECKING:
    from ._link import ChannelLink

__all__ = ["Lifecycle", "ScratchChannel", "queue_exists", "replay_topology", "scratch_channel"]

log = logging.getLogger("ojs_anyio.amqp")


class Lifecycle:
    """Opening, closing and recovering a channel (see the module docstring)."""

    def __init__(
        self, state: ChannelState, link: ChannelLink, calls: Calls, publisher: Publisher, consuming: Consuming
    ) -> None:
        self._state = state
        self._link = link
        self._calls = calls
        self._call = calls.call
        self._publisher = publisher
        self._consuming = consuming
        #: The same registry as ``consuming.consumers`` (recovery re-registers them).
        self._consumers = consuming.consumers
        #: What the connection may call on this channel: the parts' own handlers.
        self.endpoint = ChannelEndpoint(
            on_delivery=consuming.on_delivery,
            on_confirmed=publisher.on_confirmed,
            on_reply=calls.on_reply,
            on_closed=self.on_closed,
            on_consumer_cancelled=self.on_consumer_cancelled,
            on_returned=publisher.on_returned,
            on_connection_gone=self.on_connection_gone,
            consumes=consuming.consumes,
            recover=self.recover,
            aclose=self.aclose,
        )

    async def open(self) -> None:
        if not self._state.open_once():
            raise UsageError("a Channel object is opened once; ask the connection for a new one")
        await self._link.wait_ready(self._link.publish_timeout)
        self._link.register(self.endpoint)
        _metrics.stats.channels_active += 1
        try:
            await self.open_on_wire(internal=False)
        except BaseException:
            self._state.failed_to_open()
            self._link.unregister(self.endpoint)
            _metrics.stats.channels_active -= 1
            if self._state.cid:
                # Cancelled (or failed) after Channel.Open went out: close it at the broker
                # rather than leak its id.  The Close-Ok still finds it attached.
                self._link.close_channel(self._state.cid)
                with anyio.CancelScope(shield=True):
                    await self._link.flush_quietly()
            raise

    async def open_on_wire(self, *, internal: bool) -> None:
        link = self._link
        state = self._state
        cid = link.open_channel()
        state.opened(cid)
        self._publisher.opened()
        link.attach(cid, self.endpoint)
        await self._call(None, internal=True)
        if state.confirms:
            await self._call(commands.Confirm.Select(), internal=True)
        if state.transactional:
            await self._call(commands.Tx.Select(), internal=True)
        if state.prefetch is not None:
            await self._call(commands.Basic.Qos(prefetch_count=state.prefetch), internal=True)

    async def aclose(self) -> None:
        """Close the channel (idempotent).  Pending confirms fail with "outcome unknown"."""
        if self._state.closed:
            return
        link = self._link
        with anyio.CancelScope(shield=True):
            try:
                with anyio.move_on_after(link.close_timeout):
                    for consumer in list(self._consumers):
                        await self._consuming.cancel_consumer(consumer)
                    if self._state.close_waiter is not None:
                        await self._state.close_waiter.event.wait()  # another task is closing it
                    elif self._state.cid and link.is_connected and not self._state.closed:
                        link.close_channel(self._state.cid)
                        # The codec drops replies once Close is out: fail the call waiting
                        # for one (calls queued behind it see _close_waiter and fail too).
                        interrupted = ChannelClosedError("channel closed before the broker replied")
                        self._state.fail_waiter(interrupted)
                        waiter = self._state.closing()
                        await link.flush()
                        await waiter.event.wait()
            except AMQPError:
                pass  # the connection failed meanwhile; the channel is gone with it
            finally:
                self.mark_closed(ChannelClosedError("channel closed"))

    def mark_closed(self, error: BaseException) -> None:
        cid = self._state.closed_for_good(error)
        if cid < 0:
            return  # closed already
        link = self._link
        if cid:
            link.detach(cid, self.endpoint)
        link.unregister(self.endpoint)
        _metrics.stats.channels_active -= 1
        self._publisher.fail_pending(error)
        for consumer in list(self._consumers):
            consumer.stop_resubscribe()
            consumer.end(error if not isinstance(error, ChannelClosedError) or error.__cause__ else None)
        self._consumers.clear()

    # -------------------------------------------------- events from the reader

    def on_closed(self, ev: object) -> None:
        if self._state.recovering and isinstance(ev, ChannelClosed):
            # Recovery re-opens the channel without what the broker refused (see recover).
            self.on_connection_gone(ev.error, final=False)
            return
        if isinstance(ev, ChannelClosed):
            err: BaseException = ev.error
            log.info("broker closed channel %d: %s", ev.channel_id, err)
            self._state.fail_waiter(err)  # the RPC that caused it gets the typed error itself
            closed = ChannelClosedError(f"channel closed by broker: {err}")
            closed.__cause__ = err
            self._state.broker_closed(err)
            self.mark_closed(closed)
        else:  # our Close-Ok
            waiter = self._state.take_waiter()
            if waiter is not None:
                waiter.complete(None)

    def on_consumer_cancelled(self, consumer_tag: str) -> None:
        consumer = self._consumers.get(consumer_tag)
        if consumer is None:
            return
        log.warning("broker cancelled consumer %s on queue %r", consumer_tag, consumer.queue)
        link = self._link
        if link.recovery.enabled:
            scope = anyio.CancelScope()
            if link.spawn(self.resubscribe, consumer, scope):
                consumer.active = False
                consumer.resubscribe_scope = scope
                return
        self._consumers.remove(consumer_tag)
        consumer.end(
            ConsumerCancelledError(
                f"broker cancelled the consumer on queue {consumer.queue!r} (queue deleted or failed over)",
                consumer_tag=consumer_tag,
                queue=consumer.queue,
            )
        )

    # ------------------------------------------------------------- recovery

    async def resubscribe(self, consumer: ConsumerFeed, scope: anyio.CancelScope) -> None:
        """Re-register a consumer the broker cancelled, once its queue exists again.

        Every ``consumer_resubscribe_delay`` seconds: wait for the connection, check the
        queue with a passive declare on a scratch channel (a 404 there leaves this channel
        alone), then Basic.Consume with the consumer's own prefetch, tag and arguments.
        A reconnect meanwhile leaves this consumer to this task (see recover).
        """
        link = self._link
        delay = link.recovery.consumer_resubscribe_delay
        with scope:
            while not self._state.closed and consumer.consumer_tag in self._consumers:
                await anyio.sleep(delay)
                try:
                    await self._calls.ready()
                    consumer.queue = link.topology.current_name(consumer.queue)
                    if not await queue_exists(link, consumer.queue):
                        continue
                    if consumer.prefetch is not None and not consumer.no_ack:
                        await self._call(commands.Basic.Qos(prefetch_count=consumer.prefetch))
                    if self._state.cid == 0 or not link.is_connected:
                        continue  # lost again meanwhile
                    await self._consuming.basic_consume(consumer, internal=True)
                except ChannelClosedError:
                    return  # the channel is gone for good; its closing ended the consumer
                except AMQPError as exc:
                    log.info("re-registering consumer on %r failed (%s); retrying", consumer.queue, exc)
                    continue
                consumer.resubscribe_scope = None
                link.emit(
                    ConsumerRecovered(
                        queue=consumer.queue, consumer_tag=consumer.consumer_tag, reason="broker-cancel"
                    )
                )
                return

    def on_connection_gone(self, err: BaseException, *, final: bool) -> None:
        """The transport died.  Fail what can't survive; keep what recovery restores."""
        if self._state.closed:
            return
        lost = err if isinstance(err, AMQPError) else ConnectionLostError(str(err))
        if final:
            # Consumers end with the connection's own error (RecoveryFailedError when
            # recovery gave up), before closing the channel ends them more vaguely.
            for consumer in list(self._consumers):
                consumer.end(lost)
            closed = ChannelClosedError(f"connection lost: {err}")
            closed.__cause__ = err
            self.mark_closed(closed)
            return
        self._state.lost()  # deliveries handed out so far are stale (StaleDeliveryError)
        self._publisher.fail_pending(lost)
        for consumer in self._consumers:
            # The broker requeues every unacked delivery of the dead channel; those still
            # buffered will come again (redelivered=True), those handed out are stale.
            consumer.drop_buffered()
            consumer.unacked = 0

    async def recover(self) -> None:
        """Re-open this channel on a new transport with its confirms, QoS and consumers
        (same tag, prefetch, arguments; server-named queues under their new names).

        A consumer the broker refuses (404: its queue is gone; 405: exclusive elsewhere),
        or whose queue's re-declaration failed, ends with that typed error, is reported as
        :class:`TopologyRecoveryFailed`, and the channel is recovered without it.  If the
        channel itself can't be re-opened, it is closed with the error.
        """
        if self._state.closed or self._state.internal:
            return
        # A call cancelled while it waited for its reply on an earlier transport (recovery
        # itself is cancelled when a transport dies) leaves its waiter; no reply will come.
        self._state.fail_waiter(ConnectionLostError("the connection was lost before the reply"))
        link = self._link
        topo = link.topology
        self._state.begin_recovery()
        try:
            while True:
                current: ConsumerFeed | None = None
                recovered: list[ConsumerFeed] = []
                try:
                    await self.open_on_wire(internal=True)
                    for consumer in list(self._consumers):
                        if consumer.resubscribe_scope is not None:
                            continue  # cancelled by the broker earlier: resubscribe owns it
                        if not self._consumers.holds(consumer):
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
                        if await self._consuming.basic_consume(consumer, internal=True):
                            recovered.append(consumer)
                except ChannelLevelError as exc:
                    # The broker closed the channel (on_closed reset it): go again without
                    # the consumer it refused.
                    if current is None:
                        link.emit(TopologyRecoveryFailed(what="re-opening a channel", error=exc))
                        closed = ChannelClosedError(f"channel could not be recovered: {exc}")
                        closed.__cause__ = exc
                        self.mark_closed(closed)
                        return
                    self._drop_consumer(current, exc, "re-registering it failed")
                    continue
                # A consume() block that ended while its consumer was being re-registered
                # found no broker-side consumer to cancel yet: cancel it now, or the broker
                # would keep delivering to a consumer nobody reads.
                current = None
                for consumer in recovered:
                    if not self._consumers.holds(consumer):
                        cancel = commands.Basic.Cancel(consumer_tag=consumer.consumer_tag)
                        await self._call(cancel, internal=True)
                recovered = [c for c in recovered if self._consumers.holds(c)]
                break
        finally:
            self._state.end_recovery()
        for consumer in recovered:
            link.emit(
                ConsumerRecovered(
                    queue=consumer.queue, consumer_tag=consumer.consumer_tag, reason="reconnect"
                )
            )

    def _drop_consumer(self, consumer: ConsumerFeed, error: BaseException, why: str) -> None:
        """Recovery could not restore ``consumer``: end its iteration with ``error``."""
        what = f"consumer {consumer.consumer_tag} on queue {consumer.queue!r}"
        log.error("recovery: %s: %s (%s)", what, why, error)
        self._consumers.remove(consumer.consumer_tag)
        consumer.active = False
        consumer.end(error)
        self._link.emit(TopologyRecoveryFailed(what=what, error=error))


class ScratchChannel:
    """A private channel for recovery's own declarations and checks.

    If the broker closes it (404, 406…) its id drops to 0 instead of it being closed for
    good, and the next :meth:`call` re-opens it.  Never recovered itself.  The same parts
    as a :class:`~._channel.Channel`, without the facade: it publishes and consumes nothing.
    """

    def __init__(self, link: ChannelLink) -> None:
        state = self._state = ChannelState(confirms=False, internal=True)
        self._link = link
        calls = Calls(state, link)
        self._call = calls.call
        publisher = Publisher(state, link, calls)
        consuming = Consuming(self, state, link, calls)  # it never consumes
        self._lifecycle = Lifecycle(state, link, calls, publisher, consuming)

    @property
    def is_closed(self) -> bool:
        return self._state.closed

    @property
    def prefetch(self) -> int | None:
        return None

    async def ensure_open(self) -> None:
        """Open it, or re-open it if the broker closed it after an earlier failure."""
        if self._state.cid == 0:
            await self._lifecycle.open_on_wire(internal=True)

    async def call(self, method: Any) -> Any:
        """Send ``method`` and wait for its reply (re-opening the channel first if needed)."""
        await self.ensure_open()
        return await self._call(method, internal=True)

    async def close_quietly(self) -> None:
        """Close it without waiting for Close-Ok (the transport may be dying)."""
        cid = self._state.cid
        if cid:
            try:
                self._link.close_channel(cid)
                await self._link.flush()
            except AMQPError:
                pass  # the transport died meanwhile; the supervisor deals with it


@asynccontextmanager
async def scratch_channel(link: ChannelLink) -> AsyncIterator[ScratchChannel]:
    """A :class:`ScratchChannel`, open for the block (closed without waiting on exit)."""
    ch = ScratchChannel(link)
    await ch.ensure_open()
    try:
        yield ch
    finally:
        await ch.close_quietly()


async def queue_exists(link: ChannelLink, queue: str) -> bool:
    """Passive Queue.Declare on a scratch channel, so a 404 closes only that channel."""
    async with scratch_channel(link) as ch:
        try:
            await ch.call(commands.Queue.Declare(queue=queue, passive=True))
        except NotFound:
            return False
    return True


async def replay_topology(link: ChannelLink) -> None:
    """Re-declare the recorded topology on a scratch channel (opened only if there is
    something to declare, and re-opened after each declaration the broker refused)."""
    async with AsyncExitStack() as stack:
        scratch: ScratchChannel | None = None

        async def call(method: Any) -> Any:
            nonlocal scratch
            if scratch is None:
                scratch = await stack.enter_async_context(scratch_channel(link))
            return await scratch.call(method)

        await link.topology.replay(call, link.emit)
