"""The event bus on ``memory://`` (the in-process broker): the same bus, no RabbitMQ.

The broker-side scenarios of ``test_bus_broker.py`` that need no fault proxy, no
``rabbitmqctl`` and no second process: typed publish/subscribe, wildcard bindings,
competing instances, redelivery with backoff through the TTL wait queues, dead letters
with their reason, bad payloads, unroutable publishes, vhost isolation.  Asyncio and Trio.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator

import anyio
import msgspec
import pytest
from support.waits import Seen, queue_exists

from ojs_anyio import amqp, events

from .bus_support import take

pytestmark = pytest.mark.anyio


class RecordRead(msgspec.Struct):
    store: str
    id: int


@pytest.fixture
def url() -> Iterator[str]:
    """A private named in-process broker per test."""
    yield f"memory://ev-{uuid.uuid4().hex[:10]}/"


async def test_typed_events_wildcards_and_competing_instances(url: str) -> None:
    seen = Seen()

    async def on_read(event: RecordRead, ctx: events.EventContext) -> None:
        seen.add((ctx.queue, ctx.routing_key, event.id))

    async with (
        events.connect(url, exchange="beds.events", queue_tag="prod_") as bus,
        bus.subscribe("rec.read", on_read, bindings=["rec.read", "rel.read"], concurrency=4),
        bus.subscribe("rec.read", on_read, bindings=["rec.read", "rel.read"], concurrency=4),
    ):
        for i in range(20):
            await bus.publish("rec.read" if i % 2 else "rel.read", RecordRead("mongo", i))
        got = await seen.wait(20)
    assert sorted(i for _q, _k, i in got) == list(range(20))  # each event handled once
    assert {q for q, _k, _i in got} == {"prod_rec.read"}
    assert {k for _q, k, _i in got} == {"rec.read", "rel.read"}


async def test_redelivery_with_backoff_then_dead_letter(url: str) -> None:
    policy = events.RedeliveryPolicy(initial_interval=0.05, multiplier=2.0, max_interval=0.2, max_attempts=3)
    calls = Seen()

    async def failing(event: dict[str, int], ctx: events.EventContext) -> None:
        calls.add((anyio.current_time(), ctx.attempt))
        raise RuntimeError(f"database down (try {ctx.attempt})")

    async with (
        events.connect(url, exchange="orb") as bus,
        bus.subscribe("orders", failing, bindings=["order.*"], redelivery=policy) as sub,
    ):
        mid = await bus.publish("order.created", {"n": 1})
        await calls.wait(4)
        (dead,) = await take(url, sub.dead_letter_queue, 1)
        assert await queue_exists(url, sub.wait_queue_name(policy.wait_ms(2)))
    assert [a for _t, a in calls.items] == [1, 2, 3, 4]
    times = [t for t, _a in calls.items]
    for n, (a, b) in enumerate(itertools.pairwise(times), start=1):
        assert b - a >= policy.wait_ms(n) / 1000 - 0.01  # a TTL never fires early
    headers = dead.properties.headers or {}
    assert dead.properties.message_id == mid and headers[events.H_REASON] == "max_attempts"
    assert "RuntimeError: database down (try 4)" in headers[events.H_ERROR]


async def test_bad_payload_is_dead_lettered_and_the_subscriber_keeps_running(url: str) -> None:
    seen = Seen()

    async def on_read(event: RecordRead) -> None:
        seen.add(event)

    async with (
        events.connect(url, exchange="beds.events") as bus,
        bus.subscribe("rec.read", on_read) as sub,
    ):
        await bus.publish("rec.read", {"store": "x"})  # no id: does not fit the Struct
        await bus.publish("rec.read", RecordRead("ok", 1))
        assert await seen.wait(1) == [RecordRead("ok", 1)]
        (dead,) = await take(url, sub.dead_letter_queue, 1)
    assert (dead.properties.headers or {})[events.H_REASON] == "invalid_payload"


async def test_unroutable_raises(url: str) -> None:
    async with events.connect(url, exchange="beds.events") as bus:
        with pytest.raises(amqp.UnroutableError):
            await bus.publish("nobody.listens", {"x": 1})


async def test_vhosts_are_isolated(url: str) -> None:
    base = url.rstrip("/")
    from ojs_anyio.memory import get_broker

    broker = get_broker(amqp.parse_url(url).host)
    broker.add_vhost("prod")
    broker.add_vhost("staging")
    prod, staging = Seen(), Seen()

    async def on_prod(event: dict[str, str]) -> None:
        prod.add(event)

    async def on_staging(event: dict[str, str]) -> None:
        staging.add(event)

    async with (
        events.connect(f"{base}/prod", exchange="beds.events", queue_tag="prod_") as p,
        events.connect(f"{base}/staging", exchange="beds.events", queue_tag="staging_") as s,
        p.subscribe("log", on_prod, bindings=["#"]),
        s.subscribe("log", on_staging, bindings=["#"]),
    ):
        await p.publish("rec.read", {"env": "prod"})
        await s.publish("rec.read", {"env": "staging"})
        assert await prod.wait(1) == [{"env": "prod"}]
        assert await staging.wait(1) == [{"env": "staging"}]
    assert prod.items == [{"env": "prod"}] and staging.items == [{"env": "staging"}]


async def test_a_redelivery_refused_by_the_broker_is_not_a_dead_letter() -> None:
    """Transient refusals are not final outcomes: the broker nacks the redelivery copy (as a
    quorum queue does while it elects a leader), past the bus's republish policy (the event
    goes back to its queue unchanged), then a few times (published again).  Either way the
    event is handled in the end, and nothing is dead-lettered."""
    from ojs_anyio.memory import MemoryBroker

    short = amqp.RepublishPolicy(attempts=3, initial_delay=0.01, max_delay=0.02)
    calls: list[int] = []
    done = anyio.Event()

    async def flaky(payload: dict[str, int], ctx: events.EventContext) -> None:
        calls.append(ctx.attempt)
        if len(calls) <= 2:
            raise RuntimeError("not yet")
        done.set()

    async with (
        MemoryBroker() as broker,
        events.connect(broker.url, exchange="ev", republish=short) as bus,
    ):
        sub_cm = bus.subscribe("orders", flaky, redelivery=events.RedeliveryPolicy(max_attempts=5))
        async with sub_cm as sub:
            nacks = broker.fail_publishes(routing_key="orders", exchange="", times=5)
            await bus.publish("orders", {"n": 1})
            with anyio.fail_after(15):
                await done.wait()
    assert nacks.hits == 5
    # 1st rejection: the redelivery is refused three times (the policy's attempts), so the
    # event goes back unchanged and comes again as attempt 1; 2nd rejection: two more nacks,
    # then the redelivery is confirmed and the event comes as attempt 2.
    assert calls == [1, 1, 2]
    assert sub.dead_lettered == 0 and broker.queue_messages("orders.dlq") == []
