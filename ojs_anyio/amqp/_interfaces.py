"""The two narrow interfaces between a connection and its channels.

In the spirit of httpcore's ``interfaces.py`` and h2's stream/connection split, neither
side sees the whole of the other:

* :class:`ChannelLink` is everything a channel (and its consumers, messages and publish
  handles) may use of its connection: the current :class:`~._transport.Transport` (codec
  and writer), the "usable" and "unblocked" events, the recorded topology, the event hub,
  and registration of its channel id.  :class:`~._connection.Connection` implements it.
* :class:`ChannelEndpoint` is everything the connection calls on a channel: the reader's
  synchronous event handlers, the transport-lost notice, recovery and close.
  :class:`~._channel.Channel` implements it.

So ``_channel.py`` never imports ``_connection.py`` and the other way round only to make
channels: the import graph has no cycle.  The members keep their leading underscore:
they are internal to ``ojs_anyio.amqp``, not API.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import anyio
    import anyio.abc

    from ojs_codec import ChannelClosed, ChannelCloseOk, Confirmed, Delivery, Returned

    from ._events import EventHub
    from ._policy import RecoveryPolicy
    from ._topology import TopologyRecorder
    from ._transport import Transport

__all__ = ["ChannelEndpoint", "ChannelLink"]


class ChannelEndpoint(Protocol):
    """What the connection calls on a channel (from the reader or the supervisor task)."""

    def _on_delivery(self, ev: Delivery) -> None: ...
    def _on_confirmed(self, ev: Confirmed) -> None: ...
    def _on_reply(self, ev: object) -> None: ...
    def _on_closed(self, ev: ChannelClosed | ChannelCloseOk) -> None: ...
    def _on_consumer_cancelled(self, consumer_tag: str) -> None: ...
    def _on_returned(self, ev: Returned) -> None: ...
    def _on_connection_gone(self, err: BaseException, *, final: bool) -> None: ...
    def _consumes(self, queue: str) -> bool: ...
    async def _recover(self) -> None: ...
    async def aclose(self) -> None: ...


class ChannelLink(Protocol):
    """What a channel uses of its connection."""

    close_timeout: float
    #: Default bound on how long a publish waits for a blocked or disconnected connection.
    publish_timeout: float | None
    recovery: RecoveryPolicy
    topology: TopologyRecorder
    #: The current connection generation: codec, socket, writer (replaced on reconnect).
    _transport: Transport
    #: Set while the connection is usable (replaced by a fresh event when it goes down).
    _connected: anyio.Event
    #: Set unless the broker blocks publishers (connection.blocked).
    _unblocked: anyio.Event
    _events: EventHub
    #: The connection's task group, for background work such as re-registering a consumer.
    _tg: anyio.abc.TaskGroup | None

    async def wait_connected(self, timeout: float | None = None) -> None: ...
    async def wait_unblocked(self, timeout: float | None = None) -> None: ...
    def _register(self, channel: ChannelEndpoint) -> None: ...
    def _unregister(self, channel: ChannelEndpoint) -> None: ...
    def _attach(self, channel_id: int, channel: ChannelEndpoint) -> None: ...
    def _detach(self, channel_id: int, channel: ChannelEndpoint) -> None: ...
    def _queue_consumed(self, queue: str) -> bool: ...
