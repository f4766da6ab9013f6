"""``MemoryBroker``: named in-process brokers, and the byte stream a ``memory://`` connection uses.

A client connection to ``memory://NAME`` gets a :class:`MemoryStream` instead of a TCP
socket.  ``send()`` hands the client's bytes to the broker, which answers synchronously
into the stream's buffer; ``receive()`` drains that buffer.  There are no broker tasks:
the broker's clock work (message TTLs, queue expiry) runs in the waiting ``receive()``
calls of the open connections (each owned by its connection's task group), or in
:meth:`MemoryBroker.advance` under a virtual clock.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from types import TracebackType
from typing import Any, Literal

import anyio
import anyio.abc
import anyio.lowlevel

from ojs_codec import UsageError

from .._schemes import register_scheme
from ._clock import Clock, LoopClock, VirtualClock
from ._model import Message, PublishFault, Queue, State, VHost
from ._session import Session

__all__ = ["MemoryBroker", "MemoryStream", "PublishFault", "get_broker", "open_stream"]

_registry: dict[str, MemoryBroker] = {}
_names = itertools.count(1)


class MemoryBroker:
    """An in-process broker that speaks AMQP 0-9-1 as RabbitMQ 3.10 does.

    ``get_broker(name)`` (or the first ``memory://NAME`` connection) gives the process-wide
    broker of that name, which lives as long as the process, like a real broker.  For
    isolation, open a private one: ``async with MemoryBroker(clock=VirtualClock()) as
    broker:`` registers it under a fresh name (``broker.url``) until the block ends, then
    drops every connection to it.
    """

    def __init__(self, name: str | None = None, *, clock: Clock | None = None) -> None:
        self.name = name or f"broker-{next(_names)}"
        self.clock: Clock = clock or LoopClock()
        self.state = State(self.clock)
        self.state.on_timer = self._wake_all
        self._streams: set[MemoryStream] = set()
        self._owned = False

    def __repr__(self) -> str:
        return f"<MemoryBroker {self.url}>"

    @property
    def url(self) -> str:
        return f"memory://{self.name}"

    def vhost_url(self, vhost: str) -> str:
        return f"{self.url}/{vhost.replace('/', '%2F')}"

    async def __aenter__(self) -> MemoryBroker:
        if self.name in _registry and _registry[self.name] is not self:
            raise ValueError(f"a memory broker named {self.name!r} is already open")
        _registry[self.name] = self
        self._owned = True
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
        await anyio.lowlevel.checkpoint()

    def close(self) -> None:
        """Unregister and drop every connection (their clients see the socket break)."""
        if _registry.get(self.name) is self:
            del _registry[self.name]
        for stream in list(self._streams):
            stream._session.abort()
            stream._wake_reader()

    # ------------------------------------------------------------------ administration

    def add_vhost(self, name: str) -> None:
        self.state.vhosts.setdefault(name, VHost(name))

    def delete_vhost(self, name: str) -> None:
        self.state.vhosts.pop(name, None)

    def add_user(self, name: str, password: str) -> None:
        self.state.users[name] = password

    def queues(self, vhost: str = "/") -> dict[str, Queue]:
        """The vhost's queues by name (read-only use: introspection for tests)."""
        return dict(self.state.vhosts[vhost].queues)

    def queue_messages(self, queue: str, vhost: str = "/") -> list[Message]:
        """The ready messages of a queue, in delivery order."""
        q = self.state.vhosts[vhost].queues.get(queue)
        return q.messages() if q is not None else []

    def exchanges(self, vhost: str = "/") -> dict[str, Any]:
        return dict(self.state.vhosts[vhost].exchanges)

    def unacked_count(self, queue: str, vhost: str = "/") -> int:
        """Messages of ``queue`` delivered and not yet settled, on every connection."""
        q = self.state.vhosts[vhost].queues.get(queue)
        return sum(
            1
            for stream in self._streams
            for ch in stream._session.channels.values()
            for _, owner, _ in ch.unacked.values()
            if owner is q
        )

    def connection_rows(self) -> list[dict[str, Any]]:
        """The open connections as ``rabbitmqctl list_connections`` describes them (JSON form)."""
        rows = []
        for stream in self._streams:
            s = stream._session
            rows.append(
                {
                    "name": s.name,
                    "user": s.user,
                    "vhost": s.vhost.name if s.vhost else "",
                    "timeout": s.heartbeat,
                    "frame_max": s.frame_max,
                    "channel_max": s.channel_max,
                    "channels": len(s.channels),
                    "client_properties": [
                        [k, "longstr" if isinstance(v, str) else "table", v]
                        for k, v in s.client_properties.items()
                    ],
                }
            )
        return rows

    def close_connections(
        self, explanation: str = "closed by the broker", *, connection_name: str | None = None
    ) -> int:
        """Force connections closed from the broker's side (clients get 320 CONNECTION_FORCED),
        those whose ``connection_name`` client property matches, or all.  Returns how many."""
        closed = 0
        for stream in list(self._streams):
            s = stream._session
            if connection_name is not None and s.client_properties.get("connection_name") != connection_name:
                continue
            s.force_close(explanation)
            closed += 1
        return closed

    def fail_publishes(
        self,
        *,
        exchange: str | None = None,
        routing_key: str | None = None,
        vhost: str = "/",
        times: int | None = 1,
        action: Literal["nack", "close"] = "nack",
    ) -> PublishFault:
        """Inject a broker fault into the next ``times`` publishes that match (``None``:
        every one, until ``remove_fault``); ``exchange`` and ``routing_key`` match exactly,
        ``None`` matches any.

        * ``"nack"``: the message is not enqueued and a publisher with confirms gets
          ``Basic.Nack``, as RabbitMQ answers while a quorum queue elects a leader;
        * ``"close"``: the connection is closed (320 CONNECTION_FORCED) before the
          confirm, so the publisher cannot know whether the message arrived (it did not).

        Returns the fault (its ``hits`` count the publishes it met)."""
        if times is not None and (isinstance(times, bool) or not isinstance(times, int) or times < 1):
            raise UsageError(f"times must be an int >= 1 or None, got {times!r}")
        if action not in ("nack", "close"):
            raise UsageError(f"action must be 'nack' or 'close', got {action!r}")
        fault = PublishFault(
            action=action, vhost=vhost, exchange=exchange, routing_key=routing_key, times=times
        )
        self.state.publish_faults.append(fault)
        return fault

    def remove_fault(self, fault: PublishFault) -> None:
        """Stop injecting ``fault`` (no error if it is already used up)."""
        if fault in self.state.publish_faults:
            self.state.publish_faults.remove(fault)

    @property
    def activity(self) -> int:
        """Grows with every batch of frames a client sends (quiescence checks)."""
        return self.state.activity

    @property
    def connections(self) -> int:
        return len(self._streams)

    # ------------------------------------------------------------------ time

    def due(self) -> float | None:
        """When the next message or queue expires (broker clock), or None."""
        return self.state.next_deadline()

    def run_due(self) -> None:
        """Apply every expiry due at the clock's current time."""
        if self.state.run_due():
            self._wake_all()

    def _wake_all(self) -> None:
        for stream in self._streams:
            stream._wake_reader()

    def advance_to(self, when: float) -> None:
        """Virtual clock only: move time to ``when`` (never backwards), applying expiries in order."""
        clock = self.clock
        if not isinstance(clock, VirtualClock):
            raise TypeError("advance() needs a broker with a VirtualClock")
        while (deadline := self.state.next_deadline()) is not None and deadline <= when:
            clock._set(max(deadline, clock.now()))
            self.run_due()
        clock._set(when)
        self.run_due()

    # ------------------------------------------------------------------ connections

    def _open(self, name: str) -> MemoryStream:
        session = Session(self.state, name=f"{name}#{next(_names)}")
        stream = MemoryStream(self, session)
        self._streams.add(stream)
        return stream


def get_broker(name: str = "default") -> MemoryBroker:
    """The process-wide broker called ``name`` (created on first use, with the loop clock)."""
    broker = _registry.get(name)
    if broker is None:
        broker = _registry[name] = MemoryBroker(name)
    return broker


def brokers() -> Iterator[MemoryBroker]:
    return iter(list(_registry.values()))


async def open_stream(name: str) -> anyio.abc.ByteStream:
    """A connected byte stream to the broker ``name`` (the memory:// transport)."""
    await anyio.lowlevel.checkpoint()
    return get_broker(name or "default")._open(name or "default")


async def _memory_stream(host: str, port: int) -> anyio.abc.ByteStream:
    """The ``memory://`` scheme's stream factory: ``host`` is the broker's name."""
    return await open_stream(host)


register_scheme("memory", _memory_stream)


class MemoryStream(anyio.abc.ByteStream):
    """The client's end of an in-process connection."""

    def __init__(self, broker: MemoryBroker, session: Session) -> None:
        self._broker = broker
        self._session = session
        self._closed = False
        self._wake: anyio.Event | None = None
        session.on_write = self._wake_reader

    def _wake_reader(self) -> None:
        wake = self._wake
        if wake is not None:
            self._wake = None
            wake.set()

    async def send(self, item: bytes) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        session = self._session
        if session.aborted or session.eof:
            raise anyio.BrokenResourceError
        session.feed(item)
        await anyio.lowlevel.checkpoint()

    async def receive(self, max_bytes: int = 65536) -> bytes:
        await anyio.lowlevel.checkpoint()
        session = self._session
        broker = self._broker
        clock = broker.clock
        while True:
            if self._closed:
                raise anyio.ClosedResourceError
            out = session.out
            if out:
                if len(out) <= max_bytes:
                    data = bytes(out)
                    out.clear()
                else:
                    data = bytes(out[:max_bytes])
                    del out[:max_bytes]
                session.drained()
                return data
            if session.aborted:
                raise anyio.BrokenResourceError
            if session.eof:
                raise anyio.EndOfStream
            wake = self._wake = anyio.Event()
            deadline = None if clock.virtual else broker.state.next_deadline()
            if deadline is None:
                await wake.wait()
            else:
                with anyio.move_on_after(max(0.0, deadline - clock.now())):
                    await wake.wait()
                broker.run_due()

    async def send_eof(self) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._broker._streams.discard(self)
            self._session.connection_lost()
            self._wake_reader()
        await anyio.lowlevel.checkpoint()
