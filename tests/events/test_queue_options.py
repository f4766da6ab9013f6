"""``subscribe(..., queue=QueueOptions(...))``: a sized log queue that refuses rather than
drops (the publisher gets QUEUE_FULL, nothing is lost), and quorum queues for a cluster.
RabbitMQ and memory://, asyncio and Trio."""

from __future__ import annotations

import anyio
import pytest
from harness.broker import rabbitmqctl
from support.waits import Seen, message_count

import ojs_anyio as ojs
from ojs_anyio import amqp, events

from .bus_support import Names

pytestmark = pytest.mark.anyio


LOG = ojs.QueueOptions(max_length=5, overflow="reject-publish", max_priority=None)


async def test_a_full_log_queue_refuses_with_queue_full_and_loses_nothing(names: Names) -> None:
    """BEDS: "nothing is lost until the queue fills", and when it fills the publisher knows."""
    name = names.sub("log")
    seen = Seen()

    async def on_log(event: dict[str, int]) -> None:
        seen.add(event["n"])

    async with events.connect(names.url, **names.bus_options()) as bus:
        async with bus.subscribe(name, on_log, queue=LOG):
            pass  # declared, then no consumer: the queue fills
        for n in range(5):
            await bus.publish(name, {"n": n})
        with pytest.raises(events.QueueFullError) as refused:
            await bus.publish(name, {"n": 5})
        assert refused.value.code == "QUEUE_FULL" and isinstance(refused.value, amqp.PublishNackedError)
        assert "QUEUE_FULL" in str(refused.value) and refused.value.routing_key == name
        with pytest.raises(events.QueueFullError):
            await bus.publish_many([(name, {"n": 6}), (name, {"n": 7})])
        assert await message_count(names.url, f"{names.tag}{name}") == 5
        async with bus.subscribe(name, on_log, queue=LOG):
            await seen.wait(5)
        # room again
        await bus.publish(name, {"n": 8})
        async with bus.subscribe(name, on_log, queue=LOG):
            await seen.wait(6)
    assert seen.items == [0, 1, 2, 3, 4, 8]


async def test_the_dead_letter_queue_takes_its_bounds(names: Names) -> None:
    name = names.sub("orders")
    options = ojs.QueueOptions(max_priority=None, dlq_max_length=2)

    async def refuse(event: dict[str, int]) -> None:
        raise events.DeadLetter("no")

    async with events.connect(names.url, **names.bus_options()) as bus:
        async with bus.subscribe(name, refuse, queue=options) as sub:
            done = Seen()
            sub.add_listener(lambda outcome, msg: done.add(outcome))
            for n in range(4):
                await bus.publish(name, {"n": n})
            await done.wait(4)
        dead = await bus.dead_letters(name).peek()
    assert [d.body for d in dead] == [b'{"n":2}', b'{"n":3}']  # the oldest dropped at the bound


async def test_options_that_do_not_match_the_queue_are_refused_by_the_broker(names: Names) -> None:
    name = names.sub("orders")

    async def handle(event: object) -> None:
        pass

    async with events.connect(names.url, **names.bus_options()) as bus:
        async with bus.subscribe(name, handle):
            pass
        with pytest.raises(amqp.PreconditionFailed) as refused:
            async with bus.subscribe(name, handle, queue=LOG):
                pass
    assert refused.value.reply_code == 406


async def test_quorum_queues_for_a_cluster(rabbitmq_url: str) -> None:
    """On RabbitMQ (one node here; scripts/cluster for three): the queue, its DLQ and its
    wait queues are quorum queues with at-least-once dead-lettering, and a redelivery works.
    RabbitMQ only: the queue types are read with ``rabbitmqctl``."""
    names = Names(rabbitmq_url)
    name = names.sub("orders")
    seen = Seen()
    failures: dict[int, int] = {}

    async def flaky(event: dict[str, int]) -> None:
        # twice: the first redelivery is at once, the second waits in a wait queue
        failures[event["n"]] = failures.get(event["n"], 0) + 1
        if failures[event["n"]] <= 2:
            raise ConnectionError("try again")
        seen.add(event["n"])

    policy = events.RedeliveryPolicy(initial_interval=0.05, max_interval=0.1)
    try:
        async with (
            events.connect(names.url, **names.bus_options(redelivery=policy)) as bus,
            bus.subscribe(name, flaky, queue=ojs.QueueOptions.quorum()),
        ):
            for n in range(3):
                await bus.publish(name, {"n": n})
            await seen.wait(3)
        rows = await rabbitmqctl("list_queues", "name", "type", "arguments", "--no-table-headers", "--quiet")
        ours = {line.split("\t")[0]: line for line in rows.splitlines() if line.startswith(names.tag)}
        queue, dlq = f"{names.tag}{name}", f"{names.tag}{name}.dlq"
        assert "quorum" in ours[queue] and "at-least-once" in ours[queue] and "reject-publish" in ours[queue]
        assert "quorum" in ours[dlq]
        waits = [line for q, line in ours.items() if ".wait." in q]
        assert waits and all("quorum" in line for line in waits)
    finally:
        await names.cleanup()
    assert sorted(seen.items) == [0, 1, 2]


async def test_a_handler_timeout_fails_the_attempt_and_the_event_comes_again(names: Names) -> None:
    name = names.sub("slow")
    seen = Seen()
    attempts: list[int] = []

    async def slow_once(event: dict[str, int], ctx: events.EventContext) -> None:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            await anyio.sleep_forever()  # the subscription's timeout ends it
        seen.add(ctx.headers.get(events.H_ERROR))

    async with events.connect(names.url, **names.bus_options()) as bus:
        async with bus.subscribe(name, slow_once, timeout=0.2) as sub:
            await bus.publish(name, {"n": 1})
            await seen.wait(1)
        assert sub.redelivered == 1 and sub.dead_lettered == 0
        with pytest.raises(amqp.UsageError, match="timeout must be a positive"):
            async with bus.subscribe(name, slow_once, timeout=0):
                pass
    assert attempts == [1, 2]
    [error] = seen.items
    assert "HandlerTimeoutError: handler exceeded its timeout of 0.2s" in error
