"""``bus.dead_letters(name)``: peek, requeue, purge and prune a subscription's DLQ, with the
job DLQ's guarantees, on RabbitMQ and memory://, asyncio and Trio."""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest
from support.waits import Seen, message_count

from ojs_anyio import amqp, events

from .bus_support import Names

pytestmark = pytest.mark.anyio


async def _kill(bus: events.EventBus, name: str, count: int) -> list[str]:
    """Publish ``count`` events to subscription ``name`` whose handler dead-letters each."""
    done = Seen()

    async def refuse(event: dict[str, int]) -> None:
        raise events.DeadLetter(f"bad order {event['n']}")

    async with bus.subscribe(name, refuse, bindings=[f"{name}.#"]) as sub:
        sub.add_listener(lambda outcome, msg: done.add(outcome))
        ids = [await bus.publish(f"{name}.created", {"n": i}) for i in range(count)]
        await done.wait(count)
    assert done.items == ["dead_lettered"] * count
    return ids


async def test_peek_shows_why_and_removes_nothing(names: Names) -> None:
    name = names.sub("orders")
    async with events.connect(names.url, **names.bus_options()) as bus:
        ids = await _kill(bus, name, 3)
        dlq = bus.dead_letters(name)
        first = await dlq.peek(10)
        again = await dlq.peek(10)
        assert await dlq.count() == 3
    assert [d.message_id for d in first] == ids == [d.message_id for d in again]
    dead = first[0]
    assert dead.reason == "rejected" and dead.error is not None and "bad order 0" in dead.error
    assert dead.routing_key == f"{name}.created" and dead.attempt == 1
    assert dead.died_at is not None and dead.body == b'{"n":0}'


async def test_requeue_goes_back_to_its_own_queue_once_confirmed(names: Names) -> None:
    name, other = names.sub("orders"), names.sub("audit")
    seen = Seen()

    async def accept(event: dict[str, int], ctx: events.EventContext) -> None:
        seen.add((event["n"], ctx.routing_key, ctx.attempt))

    async def audit(event: dict[str, int]) -> None:
        seen.add(("audit", event["n"]))

    async with events.connect(names.url, **names.bus_options()) as bus:
        async with bus.subscribe(other, audit, bindings=[f"{name}.#"]):
            ids = await _kill(bus, name, 4)
            await seen.wait(4)  # the audit subscription had each event once
        dlq = bus.dead_letters(name)
        moved: list[int] = []
        assert await dlq.requeue(ids=[ids[1], ids[3]], on_moved=moved.append) == 2
        assert moved == [1, 2]
        assert [d.message_id for d in await dlq.peek()] == [ids[0], ids[2]]  # order kept
        async with bus.subscribe(name, accept, bindings=[f"{name}.#"]), bus.subscribe(other, audit):
            await seen.wait(6)
        assert await dlq.count() == 2
        assert await message_count(names.url, f"{names.tag}{other}") == 0
    # the requeued events: original routing key, attempt 1 again, and not re-sent to audit
    assert sorted(item for item in seen.items if item[0] != "audit") == [
        (1, f"{name}.created", 1),
        (3, f"{name}.created", 1),
    ]
    assert len([item for item in seen.items if item[0] == "audit"]) == 4


async def test_a_cancelled_requeue_loses_nothing(names: Names) -> None:
    name = names.sub("orders")
    async with events.connect(names.url, **names.bus_options()) as bus:
        await _kill(bus, name, 20)
        dlq = bus.dead_letters(name)
        with anyio.CancelScope() as scope:

            def cancel_after_five(n: int) -> None:
                if n == 5:
                    scope.cancel()

            await dlq.requeue(on_moved=cancel_after_five)
        in_queue = await message_count(names.url, f"{names.tag}{name}")
        dead = await dlq.count()
    # at least 5 moved; a move cut between confirm and ack leaves a duplicate, never a loss
    assert in_queue >= 5 and in_queue + dead in (20, 21)


async def test_prune_by_count_and_age_then_purge(names: Names) -> None:
    name = names.sub("orders")
    async with events.connect(names.url, **names.bus_options()) as bus:
        ids = await _kill(bus, name, 5)
        dlq = bus.dead_letters(name)
        assert await dlq.prune(max_events=3) == 2  # the two oldest
        assert [d.message_id for d in await dlq.peek()] == ids[2:]
        assert await dlq.prune(timedelta(hours=1)) == 0  # none that old
        assert await dlq.prune(0, limit=1) == 1
        assert await dlq.purge() == 2
        assert await dlq.count() == 0


async def test_bad_arguments_get_one_clear_error(names: Names) -> None:
    async with events.connect(names.url, **names.bus_options()) as bus:
        dlq = bus.dead_letters(names.sub("orders"))
        with pytest.raises(amqp.UsageError, match="not one str"):
            await dlq.requeue(ids="0195")
        with pytest.raises(amqp.UsageError, match="max_count must be zero or more"):
            await dlq.prune(max_events=-5)
        with pytest.raises(amqp.UsageError, match="older_than must be zero or more"):
            await dlq.prune(-1)
        with pytest.raises(amqp.UsageError, match=r"'amq\.' prefix is reserved"):
            events.EventBus(names.url, exchange="x").dead_letters("amq.x")
