"""Testing code that publishes and subscribes events, with no RabbitMQ: :func:`bus_tester`.

::

    from ojs_anyio.testing import bus_tester

    async def test_a_read_is_audited() -> None:
        async with bus_tester(exchange="beds.events", queue_tag="test_") as events:
            async with events.bus.subscribe("rec.read", on_read):
                await record_read(events.bus, 42)                 # your code publishes
                events.assert_published("rec.read", {"store": "mongo", "id": 42})
                await events.drain()                              # handlers ran, redeliveries too

A real :class:`~ojs_anyio.events.EventBus` on a private ``memory://`` broker whose clock is
virtual by default, so Orb's backoff (2 s, 3 s, 4.5 s…) takes milliseconds: ``drain()`` jumps
to each redelivery as it falls due, and ``advance(seconds)`` moves the clock by hand.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import msgspec

from .. import amqp, events
from ..memory import MemoryBroker, VirtualClock
from ._idle import QUIET, settle
from ._idle import advance as _advance

__all__ = ["BusTester", "PublishedEvent", "bus_tester"]

_decode_json = msgspec.json.Decoder().decode


class PublishedEvent(msgspec.Struct, frozen=True, kw_only=True):
    """An event the tester's bus published, in the order published."""

    routing_key: str
    message_id: str
    #: The JSON body decoded (dicts, lists...), or the bytes of a non-JSON event.
    payload: Any
    content_type: str
    headers: dict[str, Any]


def _plain(value: Any) -> Any:
    """A payload as the JSON values it travels as (a Struct or dataclass becomes a dict)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    return msgspec.to_builtins(value)


class BusTester:
    """The bus, the memory broker under it and what was published: see :func:`bus_tester`."""

    def __init__(self, broker: MemoryBroker, bus: events.EventBus) -> None:
        self.broker = broker
        self.bus = bus
        #: Every event the bus published since the tester started, oldest first.
        self.events: list[PublishedEvent] = []
        bus.add_publish_listener(self._record)

    def _record(
        self,
        routing_key: str,
        message_id: str,
        body: bytes,
        content_type: str,
        headers: dict[str, Any] | None,
    ) -> None:
        payload: Any = body
        if content_type == events.CONTENT_JSON:
            payload = _decode_json(body)
        self.events.append(
            PublishedEvent(
                routing_key=routing_key,
                message_id=message_id,
                payload=payload,
                content_type=content_type,
                headers=dict(headers or {}),
            )
        )

    @property
    def virtual(self) -> bool:
        return self.broker.clock.virtual

    # ------------------------------------------------------------ what was published

    def published(self, routing_key: str | None = None) -> list[PublishedEvent]:
        """The events published with ``routing_key`` (all when None), oldest first."""
        return [e for e in self.events if routing_key is None or e.routing_key == routing_key]

    def assert_published(
        self, routing_key: str, payload: Any = None, *, count: int | None = None
    ) -> list[PublishedEvent]:
        """Assert that events went out with ``routing_key`` (and, when given, this payload:
        a dict, a Struct or bytes, compared as it travels), ``count`` of them if given;
        returns them."""
        matching = self.published(routing_key)
        if payload is not None:
            wanted = _plain(payload)
            matching = [e for e in matching if e.payload == wanted]
        if (count is None and not matching) or (count is not None and len(matching) != count):
            seen = [(e.routing_key, e.payload) for e in self.events]
            expected = "at least one" if count is None else str(count)
            shown = "" if payload is None else f" with payload {_plain(payload)!r}"
            raise AssertionError(
                f"expected {expected} event(s) {routing_key!r}{shown}, "
                f"found {len(matching)}; published: {seen}"
            )
        return matching

    def refute_published(self, routing_key: str | None = None) -> None:
        """Assert that no event went out with ``routing_key`` (none at all when None)."""
        found = self.published(routing_key)
        if found:
            shown = [(e.routing_key, e.payload) for e in found]
            raise AssertionError(f"expected no event {routing_key or ''!r}, found: {shown}")

    # ------------------------------------------------------------ running it

    async def settle(self) -> None:
        """Wait until the bus and the broker have nothing left to do now."""
        await settle(self.broker)

    async def advance(self, seconds: float) -> None:
        """Move the virtual clock ``seconds`` ahead, through every redelivery due on the way."""
        await _advance(self.broker, seconds)

    async def drain(self, *, timeout: float = 30.0) -> None:
        """Wait until every subscription queue is empty with nothing unacked (its handlers
        done) and no redelivery waits; virtual time jumps to each waiting redelivery (real
        time: it is waited for).  Dead letters stay where they are
        (``await tester.bus.dead_letters(name).peek()`` reads them).  ``timeout`` bounds the
        real time spent."""
        with anyio.fail_after(timeout):
            while True:
                await self.settle()
                if not self._idle():
                    await anyio.sleep(QUIET)  # a handler still runs (real time)
                    continue
                due = self._next_redelivery()
                if due is None:
                    return
                if self.virtual:
                    self.broker.advance_to(due)
                else:
                    await anyio.sleep(max(0.0, due - self.broker.clock.now()))
                    self.broker.run_due()

    @property
    def _vhost(self) -> str:
        return amqp.parse_url(self.bus.url).virtual_host

    def _kind(self, name: str) -> str:
        if name.endswith(".dlq"):
            return "dead"
        if ".wait." in name:
            return "wait"
        return "subscription"

    def _idle(self) -> bool:
        vhost = self._vhost
        for name, queue in self.broker.queues(vhost).items():
            if self._kind(name) == "subscription" and (queue.ready or self.broker.unacked_count(name, vhost)):
                return False
        return True

    def _next_redelivery(self) -> float | None:
        due: float | None = None
        for name, queue in self.broker.queues(self._vhost).items():
            if self._kind(name) != "wait":
                continue
            head = queue.head()
            if head is not None and head.expires_at is not None:
                due = head.expires_at if due is None else min(due, head.expires_at)
        return due


@asynccontextmanager
async def bus_tester(*, virtual_time: bool = True, **bus_options: Any) -> AsyncIterator[BusTester]:
    """A private memory broker (virtual clock unless ``virtual_time=False``), an event bus on
    it (``events.connect`` options pass through: ``exchange``, ``queue_tag``,
    ``redelivery``…) and the tester; gone when the block ends."""
    clock = VirtualClock() if virtual_time else None
    async with MemoryBroker(clock=clock) as broker, events.connect(broker.url, **bus_options) as bus:
        yield BusTester(broker, bus)
