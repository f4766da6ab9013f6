"""Channels: ``async with link.channel() as ch:`` scopes a channel to its block.

A channel the broker closes (403/404/405/406…) fails only its own operations, with the
typed error from :mod:`ojs_codec`; the connection and other channels carry on.

The class is built in layers, one file per concern: ``_channel_core.py`` (state and the
synchronous-method call), ``_publish.py`` (publish and confirms), ``_consume.py``
(consume and settle), ``_recovery.py`` (open, close, loss and recovery); this file adds
the AMQP model: exchanges, queues, bindings and transactions.
"""

from __future__ import annotations

from typing import Any

from pamqp import commands

from . import _metrics
from ._consume import Consumer, IncomingMessage, property_text
from ._errors import TransactionLostError
from ._publish import PublishHandle, PublishWindow
from ._recovery import RecoveringChannel
from ._topology import QueueInfo

__all__ = [
    "Channel",
    "Consumer",
    "IncomingMessage",
    "PublishHandle",
    "PublishWindow",
    "QueueInfo",
    "property_text",
]


class Channel(RecoveringChannel):
    """An AMQP channel.  Use ``async with link.channel() as ch:``."""

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
        self.transactional = True
        self._tx_opening = self._state.openings

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
        lost = self.transactional and self._tx_opening != self._state.openings
        self._tx_opening = self._state.openings
        return lost


def _key(arguments: dict[str, Any] | None) -> str:
    if not arguments:
        return ""
    return repr(sorted(arguments.items()))
