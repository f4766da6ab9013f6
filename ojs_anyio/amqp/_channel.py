"""Channels: ``async with link.channel() as ch:`` scopes a channel to its block.

A channel the broker closes (403/404/405/406…) fails only its own operations, with the
typed error from :mod:`ojs_codec`; the connection and other channels carry on.

:class:`Channel` is a facade over parts, one file per concern, none of which inherits
another; each gets only what it needs:

* :class:`~._channel_state.ChannelState`: wire id, generation, the waiting call, the
  settings recovery restores; changed only through its transitions;
* :class:`~._calls.Calls` (state, link): one synchronous method at a time;
* :class:`~._publish.Publisher` (state, link, calls): publish, windows, confirms (it owns
  the :class:`~._confirms.ConfirmTracker`) and returns;
* :class:`~._consume.Consuming` (state, link, calls): consume, get, QoS, Basic.Recover and
  deliveries (it owns the :class:`~._consumers.ConsumerRegistry`);
* :class:`~._recovery.Lifecycle` (all of the above): open, close, transport loss and
  recovery, and the channel's :class:`~._interfaces.ChannelEndpoint`.

The facade itself holds the AMQP model (exchanges, queues, bindings, transactions: a call
and a topology record each) and hands the rest to the parts.  The per-message paths are
the parts' own bound methods: ``Channel.publish`` *is* ``Publisher.publish``, and the
reader calls ``Consuming.on_delivery`` and ``Publisher.on_confirmed`` directly, so the
facade adds no call per message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Self

from pamqp import commands

from . import _metrics
from ._calls import Calls
from ._channel_state import ChannelState, Waiter
from ._consume import Consumer, Consuming, IncomingMessage, property_text
from ._errors import TransactionLostError
from ._publish import Publisher, PublishHandle, PublishWindow
from ._recovery import Lifecycle
from ._topology import QueueInfo

if TYPE_CHECKING:
    from ._link import ChannelLink

__all__ = [
    "Channel",
    "Consumer",
    "IncomingMessage",
    "PublishHandle",
    "PublishWindow",
    "QueueInfo",
    "property_text",
]


class Channel:
    """An AMQP channel.  Use ``async with link.channel() as ch:``.

    Besides the model methods below, a channel's methods are its parts' own, bound when it
    is made: ``publish`` and ``confirm_select`` (:class:`~._publish.Publisher`);
    ``consume``, ``get``, ``basic_qos`` and ``recover`` (:class:`~._consume.Consuming`);
    ``open`` and ``aclose`` (:class:`~._recovery.Lifecycle`).
    """

    def __init__(self, link: ChannelLink, *, confirms: bool = True, prefetch: int | None = None) -> None:
        state = self._state = ChannelState(confirms=confirms, prefetch=prefetch)
        self._link = link
        calls = Calls(state, link)
        self._call = calls.call
        publisher = self._publisher = Publisher(state, link, calls)
        consuming = self._consuming = Consuming(self, state, link, calls)
        lifecycle = self._lifecycle = Lifecycle(state, link, calls, publisher, consuming)
        #: What a PublishWindow of this channel may do (PublishWindow reads it).
        self._window_ops = publisher.window_ops
        # The parts' methods, bound once: the per-message paths pay no call through here.
        self.publish = publisher.publish
        self.confirm_select = publisher.confirm_select
        self.basic_qos = consuming.basic_qos
        self.get = consuming.get
        self.recover = consuming.recover
        self.consume = consuming.consume
        self.open = lifecycle.open
        self.aclose = lifecycle.aclose

    def __repr__(self) -> str:
        return f"<Channel id={self._state.cid} {'closed' if self._state.closed else 'open'}>"

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # ----------------------------------------------------------------- state

    @property
    def channel_id(self) -> int:
        return self._state.cid

    @property
    def is_open(self) -> bool:
        return not self._state.closed and self._state.cid != 0

    @property
    def is_closed(self) -> bool:
        """Closed for good (``aclose()``, the broker closed it, or the connection is gone
        for good).  A channel that waits for recovery is not closed, just not open."""
        return self._state.closed

    @property
    def closed_error(self) -> BaseException | None:
        return self._state.closed_error

    @property
    def confirms(self) -> bool:
        """Publisher confirms are on (recovery selects them again on a new channel)."""
        return self._state.confirms

    @confirms.setter
    def confirms(self, confirms: bool) -> None:
        self._state.set_confirms(confirms)

    @property
    def prefetch(self) -> int | None:
        """The channel's QoS prefetch (``basic_qos``; recovery sets it again)."""
        return self._state.prefetch

    @prefetch.setter
    def prefetch(self, prefetch: int | None) -> None:
        self._state.set_prefetch(prefetch)

    @property
    def transactional(self) -> bool:
        """Set by ``tx_select``; recovery selects tx again on the new channel."""
        return self._state.transactional

    @transactional.setter
    def transactional(self, transactional: bool) -> None:
        self._state.set_transactional(transactional)

    @property
    def unconfirmed(self) -> int:
        """Publishes sent and not confirmed yet."""
        return self._publisher.unconfirmed

    @property
    def _waiter(self) -> Waiter | None:
        """The synchronous call in flight (for tests and debugging)."""
        return self._state.waiter

    @property
    def _close_waiter(self) -> Waiter | None:
        """Set while aclose() waits for Close-Ok (for tests and debugging)."""
        return self._state.close_waiter

    # ------------------------------------------------------------ publishing

    def publish_window(self, max_in_flight: int = 1024) -> PublishWindow:
        """The bulk path: many publishes in flight from one task (see :class:`PublishWindow`)."""
        return PublishWindow(self, max_in_flight)

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
            self._link.topology.record(("exchange", exchange), method)

    async def exchange_delete(self, exchange: str, *, if_unused: bool = False) -> None:
        await self._call(commands.Exchange.Delete(exchange=exchange, if_unused=if_unused))
        self._link.topology.forget_exchange(exchange)

    async def exchange_bind(
        self, destination: str, source: str, routing_key: str = "", arguments: dict[str, Any] | None = None
    ) -> None:
        method = commands.Exchange.Bind(
            destination=destination, source=source, routing_key=routing_key, arguments=arguments
        )
        await self._call(method)
        self._link.topology.record(("e2e", destination, source, routing_key, _key(arguments)), method)

    async def exchange_unbind(
        self, destination: str, source: str, routing_key: str = "", arguments: dict[str, Any] | None = None
    ) -> None:
        await self._call(
            commands.Exchange.Unbind(
                destination=destination, source=source, routing_key=routing_key, arguments=arguments
            )
        )
        self._link.topology.forget(("e2e", destination, source, routing_key, _key(arguments)))

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
        _metrics.track_queue(info.name)  # a metric label from now on (bounded, see _metrics)
        if not passive:
            self._link.topology.record_queue(info, method)
        return info

    async def queue_bind(
        self, queue: str, exchange: str, routing_key: str = "", arguments: dict[str, Any] | None = None
    ) -> None:
        method = commands.Queue.Bind(
            queue=queue, exchange=exchange, routing_key=routing_key, arguments=arguments
        )
        await self._call(method)
        self._link.topology.record(("bind", queue, exchange, routing_key, _key(arguments)), method)
        if queue in _metrics.queues and "*" not in routing_key and "#" not in routing_key:
            _metrics.track_queue(routing_key)  # publishes with this key label as this name

    async def queue_unbind(
        self, queue: str, exchange: str, routing_key: str = "", arguments: dict[str, Any] | None = None
    ) -> None:
        await self._call(
            commands.Queue.Unbind(
                queue=queue, exchange=exchange, routing_key=routing_key, arguments=arguments
            )
        )
        self._link.topology.forget(("bind", queue, exchange, routing_key, _key(arguments)))

    async def queue_purge(self, queue: str) -> int:
        reply = await self._call(commands.Queue.Purge(queue=queue))
        return int(reply.message_count)

    async def queue_delete(self, queue: str, *, if_unused: bool = False, if_empty: bool = False) -> int:
        reply = await self._call(commands.Queue.Delete(queue=queue, if_unused=if_unused, if_empty=if_empty))
        self._link.topology.forget_queue(queue)
        return int(reply.message_count)

    # ------------------------------------------------------------------- tx

    async def tx_select(self) -> None:
        """Make the channel transactional (recovery restores this on the new channel)."""
        await self._call(commands.Tx.Select())
        self._state.select_tx()

    async def tx_commit(self) -> None:
        """Commit; raises :class:`TransactionLostError` if a reconnect rolled the
        transaction back since it began (then nothing of it was committed)."""
        if self._state.transaction_lost():
            raise TransactionLostError(
                "the connection was lost during this transaction and the broker rolled it back; "
                "a new transaction has begun on the recovered channel"
            )
        await self._call(commands.Tx.Commit())

    async def tx_rollback(self) -> None:
        if self._state.transaction_lost():
            return  # the broker already rolled it back
        await self._call(commands.Tx.Rollback())


def _key(arguments: dict[str, Any] | None) -> str:
    if not arguments:
        return ""
    return repr(sorted(arguments.items()))
