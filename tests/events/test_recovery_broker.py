"""Connection loss: the bus's connections recover (topology, bindings, consumers) and no
event is lost.  Cuts go through the fault proxy, never the shared broker."""

from __future__ import annotations

import anyio
import pytest
from harness import FaultProxy
from support.waits import Seen

from ojs_anyio import amqp, events

from .bus_support import Names

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.rabbitmq_only("the fault proxy cuts TCP connections: memory:// has no socket"),
]


async def publish_surely(bus: events.EventBus, key: str, i: int) -> None:
    """At least once: republish (same message id) when the outcome is unknown."""
    mid = f"event-{i}"
    while True:
        try:
            await bus.publish(key, {"i": i}, message_id=mid, timeout=20)
            return
        except (amqp.PublishOutcomeUnknownError, amqp.PublishTimeoutError):
            continue  # the outcome is unknown, or recovery is slow on a loaded machine


async def test_cut_mid_stream_loses_no_event(names: Names) -> None:
    total = 400
    seen = Seen()

    async def handler(event: dict[str, int]) -> None:
        seen.add(event["i"])

    async with FaultProxy() as proxy:
        url = proxy.url()
        async with (
            events.connect(url, **names.bus_options(publisher_pool_size=2)) as bus,
            bus.subscribe(names.sub("rec.read"), handler, concurrency=8) as sub,
        ):
            async with anyio.create_task_group() as tg:

                async def publish_all() -> None:
                    for i in range(total):
                        await publish_surely(bus, "rec.read", i)

                tg.start_soon(publish_all)
                await seen.wait(total // 4)
                assert proxy.cut_all(reset=True) >= 2  # publisher and subscriber connections
                await seen.wait(total, timeout=90)
            assert set(seen.items) == set(range(total))  # duplicates allowed, losses not
            assert bus.publisher_connection.reconnections >= 1
            assert all(conn.reconnections >= 1 for conn in sub.connections)


async def test_pool_connections_recover_together(names: Names) -> None:
    seen = Seen()

    async def handler(event: dict[str, str]) -> None:
        seen.add(event["q"])

    options = names.bus_options(max_subscriptions_per_connection=1)
    async with FaultProxy() as proxy:  # noqa: SIM117 (the proxy's URL is needed below)
        async with (
            events.connect(proxy.url(), **options) as bus,
            bus.subscribe(names.sub("a"), handler),
            bus.subscribe(names.sub("b"), handler),
        ):
            assert len(bus.subscriber_connections) == 2
            await bus.publish("a", {"q": "a"})
            await bus.publish("b", {"q": "b"})
            await seen.wait(2)
            proxy.cut_all()
            await proxy.wait_for_connections(3, timeout=20)  # publisher + both subscribers back
            # Topology, bindings and consumers were restored on both subscriber connections.
            await bus.publish("a", {"q": "a-after"}, timeout=20)
            await bus.publish("b", {"q": "b-after"}, timeout=20)
            with anyio.fail_after(20):
                while not {"a-after", "b-after"} <= set(seen.items):
                    await seen.wait(len(seen.items) + 1)
            assert all(conn.reconnections >= 1 for conn in bus.subscriber_connections)
    # An event handled just before the cut may come again (its ack may not have been written):
    # at least once, never lost.
    assert set(seen.items) == {"a", "b", "a-after", "b-after"}


async def test_publish_while_the_broker_stays_away_ends_within_publish_timeout(names: Names) -> None:
    """With the bus's defaults a publish never hangs on a recovering connection: after
    ``publish_timeout`` it raises PublishTimeoutError (nothing was sent)."""
    bound, slack = amqp.DEFAULT_PUBLISH_TIMEOUT, 10.0
    async with FaultProxy() as proxy, events.connect(proxy.url(), **names.bus_options()) as bus:
        lost = anyio.Event()
        await bus.publish("rec.read", {"i": 0}, mandatory=False)  # opens the publisher connection
        bus.publisher_connection.add_listener(
            lambda event: lost.set() if isinstance(event, amqp.ConnectionLost) else None
        )
        proxy.refuse_new()
        proxy.cut_all()
        await lost.wait()
        for publish in (
            lambda: bus.publish("rec.read", {"i": 1}, mandatory=False),
            lambda: bus.publish_many([("rec.read", {"i": 2}), ("rec.read", {"i": 3})]),
        ):
            started = anyio.current_time()
            with anyio.fail_after(bound + slack), pytest.raises(amqp.PublishTimeoutError):
                await publish()
            assert bound * 0.9 <= anyio.current_time() - started < bound + slack
        proxy.refuse_new(False)
