"""Connection lifecycle events: lost, reconnecting, recovered, consumer re-registered, blocked.

Delivered to listeners (plain callables, called synchronously) and to subscribers
(``async with conn.subscribe() as events``; each subscriber has a bounded buffer and
drops the oldest event when it is full, counting the drops).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
from anyio.streams.memory import MemoryObjectSendStream

__all__ = [
    "ConnectionBlockedEvent",
    "ConnectionLost",
    "ConnectionRecovered",
    "ConnectionUnblockedEvent",
    "ConsumerRecovered",
    "EventHub",
    "Reconnecting",
    "RecoveryEvent",
    "TopologyRecoveryFailed",
]

log = logging.getLogger("ojs_anyio.amqp")


class RecoveryEvent:
    __slots__ = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionLost(RecoveryEvent):
    error: BaseException


@dataclass(frozen=True, slots=True, kw_only=True)
class Reconnecting(RecoveryEvent):
    attempt: int
    delay: float
    error: BaseException


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionRecovered(RecoveryEvent):
    reconnections: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerRecovered(RecoveryEvent):
    """A consumer was re-registered (after a reconnect, or after the broker cancelled it)."""

    queue: str
    consumer_tag: str
    reason: str  # "reconnect" or "broker-cancel"


@dataclass(frozen=True, slots=True, kw_only=True)
class TopologyRecoveryFailed(RecoveryEvent):
    """Recovery could not restore one thing: re-declaring an entity failed (for example 406
    on conflicting arguments), or re-registering a consumer did (its queue is gone).  The
    rest of the recovery goes on; that consumer's iteration raises ``error``."""

    what: str
    error: BaseException


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionBlockedEvent(RecoveryEvent):
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionUnblockedEvent(RecoveryEvent):
    pass


class EventHub:
    def __init__(self) -> None:
        self._listeners: list[Callable[[RecoveryEvent], None]] = []
        self._subscribers: list[MemoryObjectSendStream[RecoveryEvent]] = []
        self.dropped = 0

    def add_listener(self, callback: Callable[[RecoveryEvent], None]) -> Callable[[], None]:
        self._listeners.append(callback)

        def remove() -> None:
            if callback in self._listeners:
                self._listeners.remove(callback)

        return remove

    @asynccontextmanager
    async def subscribe(self, max_buffer: int = 256) -> AsyncIterator[AsyncIterator[RecoveryEvent]]:
        send, receive = anyio.create_memory_object_stream[RecoveryEvent](max_buffer)
        self._subscribers.append(send)
        try:
            async with receive:
                yield receive
        finally:
            if send in self._subscribers:
                self._subscribers.remove(send)
            send.close()

    def emit(self, event: RecoveryEvent) -> None:
        for cb in list(self._listeners):
            # A listener's exception is the listener's bug; it must not kill the
            # connection's reader or supervisor, so report it loudly and carry on.
            try:
                cb(event)
            except Exception:
                log.exception("connection event listener %r raised", cb)
        for send in list(self._subscribers):
            try:
                send.send_nowait(event)
            except anyio.WouldBlock:
                self.dropped += 1
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._subscribers.remove(send)

    def close(self) -> None:
        for send in self._subscribers:
            send.close()
        self._subscribers.clear()
