"""An example of testing an app's events with ``ojs_anyio.testing.bus_tester`` (docs/testing.md
walks through it; CI runs it).  No RabbitMQ: a private memory:// broker with a virtual clock.
"""

from __future__ import annotations

import time

import msgspec
import pytest

from ojs_anyio import events
from ojs_anyio.testing import bus_tester

pytestmark = pytest.mark.anyio

# ---------------------------------------------------------------- the "app" under test


class RecordRead(msgspec.Struct):
    store: str
    id: int


async def record_read(bus: events.EventBus, store: str, record_id: int) -> None:
    """The app's code: publish an event when a record is read."""
    await bus.publish("rec.read", RecordRead(store, record_id))


class Auditor:
    """A subscriber whose storage fails now and then."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.audited: list[int] = []

    async def on_read(self, event: RecordRead, ctx: events.EventContext) -> None:
        if event.id < 0:
            raise events.DeadLetter("negative ids are a bug upstream")
        if self.failures:
            self.failures -= 1
            raise ConnectionError("audit store busy")  # redelivered with backoff
        self.audited.append(event.id)


# Orb's redelivery: 2 s, x1.5, up to 5 redeliveries (a real minute of backoff, at most)
ORB = events.RedeliveryPolicy(initial_interval=2.0, multiplier=1.5, max_interval=30.0, max_attempts=5)

# ---------------------------------------------------------------- its tests


async def test_a_read_publishes_an_event() -> None:
    # No subscriber here: mandatory=False, or the publish raises amqp.UnroutableError as it
    # would in production
    async with bus_tester(exchange="beds.events", queue_tag="test_", mandatory=False) as tester:
        await record_read(tester.bus, "mongo", 42)
        tester.assert_published("rec.read", RecordRead("mongo", 42))
        tester.assert_published("rec.read", {"store": "mongo", "id": 42}, count=1)
        tester.refute_published("rec.deleted")


async def test_backoff_redeliveries_run_in_virtual_time() -> None:
    auditor = Auditor(failures=3)  # waits 0 s, 3.15 s and 5 s of virtual time (ladder rungs)
    async with (
        bus_tester(exchange="beds.events", redelivery=ORB) as tester,
        tester.bus.subscribe("rec.read", auditor.on_read),
    ):
        started = time.monotonic()
        await record_read(tester.bus, "mongo", 7)
        await tester.drain()
        assert time.monotonic() - started < 5  # 8 s of backoff (3 redeliveries) in far less
    assert auditor.audited == [7]


async def test_a_poison_event_is_dead_lettered_with_its_reason() -> None:
    auditor = Auditor()
    async with bus_tester(exchange="beds.events") as tester:
        async with tester.bus.subscribe("rec.read", auditor.on_read):
            await record_read(tester.bus, "mongo", -1)
            await record_read(tester.bus, "mongo", 8)
            await tester.drain()
        [dead] = await tester.bus.dead_letters("rec.read").peek()
    assert auditor.audited == [8]
    assert dead.reason == "rejected" and dead.error is not None and "bug upstream" in dead.error


async def test_advance_moves_the_clock_by_hand() -> None:
    # the first redelivery is at once; the second waits 3 s, rounded up to the wait
    # ladder's rung of 3.15 s (docs/events.md)
    auditor = Auditor(failures=2)
    async with (
        bus_tester(exchange="beds.events", redelivery=ORB) as tester,
        tester.bus.subscribe("rec.read", auditor.on_read),
    ):
        await record_read(tester.bus, "mongo", 9)
        await tester.advance(3.1)
        assert auditor.audited == []
        await tester.advance(0.1)
        assert auditor.audited == [9]
