"""Reading queue depths without changing anything: AMQP passive declares.

``Queue.Declare`` with ``passive=true`` reports a queue's ready messages and consumers and
creates nothing; for a queue that does not exist the broker answers 404 and closes the
channel.  :class:`QueueProbe` hides that: it answers None and opens a fresh channel for the
next question.  Used by ``ojs-anyio queues`` / ``topology check`` and the dashboard.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from .. import amqp

if TYPE_CHECKING:
    from ._client import Client

__all__ = ["QueueProbe"]


class QueueProbe:
    """Passive declares on a channel of ``client``'s connection, reopened after each 404.

    Not for concurrent use (one question at a time); :meth:`aclose` closes its channel."""

    def __init__(self, client: Client) -> None:
        self.conn = client.conn
        self._ch: amqp.Channel | None = None

    async def _channel(self) -> amqp.Channel:
        if self._ch is None or not self._ch.is_open:
            self._ch = self.conn.channel(confirms=False)
            await self._ch.open()
        return self._ch

    async def queue(self, name: str) -> amqp.QueueInfo | None:
        """``name``'s ready messages and consumers, or None when it does not exist."""
        ch = await self._channel()
        try:
            return await ch.queue_declare(name, passive=True)
        except amqp.NotFound:
            self._ch = None
            return None

    async def exchange(self, name: str) -> bool:
        """Whether exchange ``name`` exists."""
        ch = await self._channel()
        try:
            await ch.exchange_declare(name, passive=True)
        except amqp.NotFound:
            self._ch = None
            return False
        return True

    async def aclose(self) -> None:
        if self._ch is not None and self._ch.is_open:
            with anyio.CancelScope(shield=True):
                await self._ch.aclose()
