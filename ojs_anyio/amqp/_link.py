"""The link between a connection and its channels, as verbs.

A channel (and its consumers, messages and publish handles) never touches the
connection's transport, codec or events: it asks its :class:`ChannelLink` to *send a
method*, *publish*, *settle*, *flush*, *defer a flush*, *wait until ready*, *emit* an
event or *spawn* a task, and to route the reader's events for its channel id to it.  The
connection owns the link and keeps in it what it shares with its channels: the current
:class:`~._transport.Transport` (replaced on reconnect), the "usable" and "unblocked"
events, the event hub, the task group and the channel registry.

In the spirit of h2, where a stream returns frames for its connection to send: the
channel side decides, the link does the I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from ojs_codec import BasicProperties

from ._confirm_deadlines import ConfirmDeadlines
from ._events import EventHub, RecoveryEvent

if TYPE_CHECKING:
    from ._interfaces import ChannelEndpoint, ConnectionOwner
    from ._policy import RecoveryPolicy
    from ._topology import TopologyRecorder
    from ._transport import Transport

__all__ = ["FLUSH_THRESHOLD", "ChannelLink"]

#: Queued bytes past which a publish window or a batched settle writes at once.
FLUSH_THRESHOLD = 64 * 1024


class ChannelLink:
    """What a channel may do with its connection (see the module docstring)."""

    __slots__ = (
        "by_id",
        "channels",
        "connected",
        "deadlines",
        "events",
        "outbound",
        "owner",
        "tg",
        "transport",
        "unblocked",
    )

    def __init__(self, owner: ConnectionOwner, transport: Transport) -> None:
        #: The connection: its public settings (timeouts, recovery policy, topology) and waits.
        self.owner = owner
        #: The current connection generation: codec, socket, writer (replaced on reconnect,
        #: with :meth:`use`).
        self.transport = transport
        #: The bytes its codec has queued and not written yet (read ``len(outbound)``; the
        #: codec's own buffer, never modified here).
        self.outbound = transport.proto.outbound
        #: Set while the connection is usable (replaced by a fresh event when it goes down).
        self.connected = anyio.Event()
        #: Set unless the broker blocks publishers (connection.blocked).
        self.unblocked = anyio.Event()
        self.unblocked.set()
        self.events = EventHub()
        #: The connection's task group, for background work such as re-registering a consumer.
        self.tg: anyio.abc.TaskGroup | None = None
        #: Channels by current wire id (the reader routes their events), and every channel.
        self.by_id: dict[int, ChannelEndpoint] = {}
        self.channels: set[ChannelEndpoint] = set()
        #: The confirm deadlines of every publish of the connection, and their one watcher
        #: (a task of each transport: :meth:`ConfirmDeadlines.run`).
        self.deadlines = ConfirmDeadlines()

    def use(self, transport: Transport) -> None:
        """From now on, the connection generation ``transport``."""
        self.transport = transport
        self.outbound = transport.proto.outbound

    # ------------------------------------------------------------ settings

    @property
    def close_timeout(self) -> float:
        return self.owner.close_timeout

    @property
    def publish_timeout(self) -> float | None:
        return self.owner.publish_timeout

    @property
    def recovery(self) -> RecoveryPolicy:
        return self.owner.recovery

    @property
    def topology(self) -> TopologyRecorder:
        return self.owner.topology

    # -------------------------------------------------------------- state

    @property
    def is_connected(self) -> bool:
        return self.connected.is_set()

    @property
    def is_unblocked(self) -> bool:
        return self.unblocked.is_set()

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until the connection is usable (at once, unless it is recovering)."""
        await self.owner.wait_connected(timeout)

    async def wait_unblocked(self, timeout: float | None = None) -> None:
        await self.owner.wait_unblocked(timeout)

    # ---------------------------------------------------- sending (no I/O)

    def open_channel(self) -> int:
        """Queue Channel.Open on a fresh wire id and return it."""
        return self.transport.proto.open_channel()

    def close_channel(self, channel_id: int) -> None:
        """Queue Channel.Close (idempotent while closing)."""
        self.transport.proto.close_channel(channel_id)

    def send_method(self, channel_id: int, method: Any) -> bool:
        """Queue a method; ``True`` when a reply is expected."""
        return self.transport.proto.send_method(channel_id, method)

    def publish(
        self,
        channel_id: int,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: BasicProperties | None,
        mandatory: bool,
    ) -> int:
        """Queue a publish; its confirm tag (0 without confirms)."""
        return self.transport.proto.publish(
            channel_id, exchange, routing_key, body, properties, mandatory=mandatory
        )

    def ack(
        self, channel_id: int, delivery_tag: int, multiple: bool, batch: bool = False, fold: bool = False
    ) -> bool:
        """Queue Basic.Ack; ``True`` when the caller must write it (see :meth:`_settled`).
        ``fold``: every delivery of the channel up to this one is settled, so the codec may
        fold the ack queued just before into this one (``AMQPConnection.ack``)."""
        t = self.transport
        t.proto.ack(channel_id, delivery_tag, multiple, fold)
        if batch and len(t.proto.outbound) < FLUSH_THRESHOLD:  # _settled, inline: the hot path
            if not t.deferred_flush:
                t.defer_flush()
            return False
        return not t.writing

    def nack(
        self, channel_id: int, delivery_tag: int, multiple: bool, requeue: bool, batch: bool = False
    ) -> bool:
        t = self.transport
        t.proto.nack(channel_id, delivery_tag, multiple, requeue)
        return self._settled(t, batch)

    def reject(self, channel_id: int, delivery_tag: int, requeue: bool, batch: bool = False) -> bool:
        t = self.transport
        t.proto.reject(channel_id, delivery_tag, requeue)
        return self._settled(t, batch)

    @staticmethod
    def _settled(t: Transport, batch: bool) -> bool:
        """After a settle was queued: with ``batch`` (the consumer has more deliveries
        buffered) and less than ``FLUSH_THRESHOLD`` queued, leave it to the connection's
        flusher (~2 ms, or the next write) and return ``False``; else ``True`` unless a
        write under way takes it along."""
        if batch and len(t.proto.outbound) < FLUSH_THRESHOLD:
            t.defer_flush()
            return False
        return not t.writing

    # ------------------------------------------------------------- writing

    async def flush(self) -> None:
        """Write what is queued (group commit: returns at once if another task is writing)."""
        await self.transport.flush()

    async def flush_quietly(self) -> None:
        """:meth:`flush`, leaving a transport failure to the supervisor."""
        await self.transport.flush_quietly()

    def defer_flush(self) -> None:
        """Leave the queued bytes (batched acks) to the connection's flusher (~2 ms)."""
        self.transport.defer_flush()

    async def flush_deferred(self) -> None:
        """Write the batched acks now, if any wait for the flusher."""
        t = self.transport
        if t.deferred_flush:
            await t.flush_quietly()

    # ---------------------------------------------------- events and tasks

    def emit(self, event: RecoveryEvent) -> None:
        self.events.emit(event)

    def spawn(self, func: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> bool:
        """Start ``func(*args)`` in the connection's task group; ``False`` when there is none."""
        tg = self.tg
        if tg is None:
            return False
        tg.start_soon(func, *args)
        return True

    # ----------------------------------------------------- channel registry

    def register(self, channel: ChannelEndpoint) -> None:
        self.channels.add(channel)

    def unregister(self, channel: ChannelEndpoint) -> None:
        self.channels.discard(channel)

    def attach(self, channel_id: int, channel: ChannelEndpoint) -> None:
        """Route the reader's events for ``channel_id`` to ``channel``."""
        self.by_id[channel_id] = channel

    def detach(self, channel_id: int, channel: ChannelEndpoint) -> None:
        if self.by_id.get(channel_id) is channel:
            del self.by_id[channel_id]

    def queue_consumed(self, queue: str) -> bool:
        """Whether any open channel of this connection has a consumer of ``queue``."""
        return any(ch.consumes(queue) for ch in self.channels)
