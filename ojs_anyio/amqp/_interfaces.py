"""The two narrow interfaces between a connection and its channels.

In the spirit of httpcore's ``interfaces.py`` and h2's stream/connection split, neither
side sees the whole of the other:

* :class:`~._link.ChannelLink` (a class, in ``_link.py``) is everything a channel (and its
  consumers, messages and publish handles) may do with its connection, as verbs: send a
  method, publish, settle, flush, defer a flush, wait until ready, emit, spawn, and route
  its channel id.  The connection owns it and reads back only :class:`ConnectionOwner`.
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
    from ojs_codec import ChannelClosed, ChannelCloseOk, Confirmed, Delivery, Returned

    from ._policy import RecoveryPolicy
    from ._topology import TopologyRecorder

__all__ = ["ChannelEndpoint", "ConnectionOwner"]


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


class ConnectionOwner(Protocol):
    """What the :class:`~._link.ChannelLink` reads of the connection that owns it: its
    public settings and waits (:class:`~._connection.Connection` implements it)."""

    close_timeout: float
    #: Default bound on how long a publish waits for a blocked or disconnected connection.
    publish_timeout: float | None
    recovery: RecoveryPolicy
    topology: TopologyRecorder

    async def wait_connected(self, timeout: float | None = None) -> None: ...
    async def wait_unblocked(self, timeout: float | None = None) -> None: ...
