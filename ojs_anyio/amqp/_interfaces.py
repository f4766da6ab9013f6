"""The two narrow interfaces between a connection and its channels.

In the spirit of httpcore's ``interfaces.py`` and h2's stream/connection split, neither
side sees the whole of the other:

* :class:`~._link.ChannelLink` (a class, in ``_link.py``) is everything a channel (and its
  consumers, messages and publish handles) may do with its connection, as verbs: send a
  method, publish, settle, flush, defer a flush, wait until ready, emit, spawn, and route
  its channel id.  The connection owns it and reads back only :class:`ConnectionOwner`.
* :class:`ChannelEndpoint` is everything the connection calls on a channel: the reader's
  synchronous event handlers, the transport-lost notice, recovery and close, as a record
  of the bound methods of the channel's parts (made by :class:`~._recovery.Lifecycle`).

So ``_channel.py`` never imports ``_connection.py`` and the other way round only to make
channels: the import graph has no cycle.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ojs_codec import ChannelClosed, ChannelCloseOk, Confirmed, Delivery, Returned

    from ._policy import RecoveryPolicy
    from ._topology import TopologyRecorder

__all__ = ["ChannelEndpoint", "ConnectionOwner"]


class ChannelEndpoint:
    """What the connection calls on a channel (from the reader or the supervisor task):
    the channel's own handlers, handed over as verbs when the channel is made."""

    __slots__ = (
        "aclose",
        "consumes",
        "on_closed",
        "on_confirmed",
        "on_connection_gone",
        "on_consumer_cancelled",
        "on_delivery",
        "on_reply",
        "on_returned",
        "recover",
    )

    def __init__(
        self,
        *,
        on_delivery: Callable[[Delivery], None],
        on_confirmed: Callable[[Confirmed], None],
        on_reply: Callable[[object], None],
        on_closed: Callable[[ChannelClosed | ChannelCloseOk], None],
        on_consumer_cancelled: Callable[[str], None],
        on_returned: Callable[[Returned], None],
        on_connection_gone: Callable[..., None],
        consumes: Callable[[str], bool],
        recover: Callable[[], Awaitable[None]],
        aclose: Callable[[], Awaitable[None]],
    ) -> None:
        self.on_delivery = on_delivery
        self.on_confirmed = on_confirmed
        self.on_reply = on_reply
        self.on_closed = on_closed
        self.on_consumer_cancelled = on_consumer_cancelled
        self.on_returned = on_returned
        #: ``(err, *, final)``: the transport died; ``final`` when no recovery follows.
        self.on_connection_gone = on_connection_gone
        self.consumes = consumes
        self.recover = recover
        self.aclose = aclose


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
