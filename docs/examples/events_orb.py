"""Orb's publisher/subscriber on ojs_anyio.events: shared queues with competing
subscribers, redelivery with backoff, a publisher channel pool, subscriber pools and a
per-connection subscription limit.

    python docs/examples/events_orb.py [amqp://guest:guest@localhost:5672/] [--fast]

``--fast`` divides the redelivery intervals by 20 (for the test suite).  Several copies
of this script against one broker compete for the same queues: each message is handled
by one of them.
"""

from __future__ import annotations

import sys
from typing import Any

import anyio
import msgspec

from ojs_anyio import events

EXCHANGE = "orb"
#: Orb's queues (routing key = queue name, no environment tag) and their subscriber pools.
QUEUES = {
    "orb.activity.outbox": 1,
    "orb.activity.inbox": 1,
    "orb.operation": 5,  # op-queue-pool
    "orb.anchor_linkset": 1,
    "orb.anchor": 5,  # mq-observer-pool
    "orb.did": 5,  # mq-observer-pool
}
PUBLISHER_POOL_SIZE = 8  # mq-publisher-channel-pool-size
MAX_CONNECTION_SUBSCRIPTIONS = 10  # mq-max-connection-subscriptions: 18 consumers -> 2 connections
REDELIVERY = events.RedeliveryPolicy(  # mq-redelivery-*
    initial_interval=2.0, multiplier=1.5, max_interval=30.0, max_attempts=3
)


class Operation(msgspec.Struct):
    did: str
    poison: bool = False


async def main(url: str = "amqp://guest:guest@localhost:5672/", fast: bool = False) -> dict[str, Any]:
    policy = REDELIVERY
    if fast:
        policy = events.RedeliveryPolicy(
            initial_interval=policy.initial_interval / 20,
            multiplier=policy.multiplier,
            max_interval=policy.max_interval / 20,
            max_attempts=policy.max_attempts,
        )
    operations = 50
    tried: dict[str, int] = {}
    observed: set[str] = set()
    done = anyio.Event()
    dead_lettered = anyio.Event()
    bus: events.EventBus

    async def on_operation(op: Operation) -> None:
        tried[op.did] = tried.get(op.did, 0) + 1
        if op.poison or (op.did.endswith("7") and tried[op.did] == 1):  # one transient failure each
            raise ConnectionError("database temporarily unavailable")
        await bus.publish("orb.anchor", {"did": op.did})

    async def on_anchor(anchor: dict[str, str]) -> None:
        observed.add(anchor["did"])
        if len(observed) == operations:
            done.set()

    async def ignore(message: Any) -> None:
        pass

    def on_outcome(outcome: str, message: Any) -> None:
        if outcome == "dead_lettered":
            dead_lettered.set()

    handlers: dict[str, events.Handler] = {"orb.operation": on_operation, "orb.anchor": on_anchor}
    async with events.connect(
        url,
        exchange=EXCHANGE,
        publisher_pool_size=PUBLISHER_POOL_SIZE,
        max_subscriptions_per_connection=MAX_CONNECTION_SUBSCRIPTIONS,
        redelivery=policy,
    ) as bus:
        subs: dict[str, events.Subscription] = {}
        async with anyio.create_task_group() as tg:

            async def run(queue: str, pool: int, ready: anyio.Event) -> None:
                async with bus.subscribe(queue, handlers.get(queue, ignore), consumers=pool) as sub:
                    subs[queue] = sub
                    sub.add_listener(on_outcome)
                    ready.set()
                    await anyio.sleep_forever()

            for queue, pool in QUEUES.items():
                ready = anyio.Event()
                tg.start_soon(run, queue, pool, ready)
                await ready.wait()
            connections = len(bus.subscriber_connections)
            print(f"{sum(QUEUES.values())} subscribers on {connections} connections")
            async with anyio.create_task_group() as publishers:  # concurrent publishers, one pool
                for i in range(operations):
                    publishers.start_soon(bus.publish, "orb.operation", Operation(f"did:orb:{i}"))
                publishers.start_soon(bus.publish, "orb.operation", Operation("did:orb:bad", poison=True))
            with anyio.fail_after(60):
                await done.wait()
                await dead_lettered.wait()
            tg.cancel_scope.cancel()
    summary = {
        "connections": connections,
        "observed": len(observed),
        "redelivered": subs["orb.operation"].redelivered,
        "dead_lettered": subs["orb.operation"].dead_lettered,
        "poison_tries": tried["did:orb:bad"],
    }
    print(
        f"{summary['observed']} operations anchored; {summary['redelivered']} redeliveries; "
        f"the poison message was tried {summary['poison_tries']} times, then dead-lettered "
        f"to orb.operation.dlq"
    )
    return summary


if __name__ == "__main__":
    argv = [a for a in sys.argv[1:] if a != "--fast"]
    url = argv[0] if argv else "amqp://guest:guest@localhost:5672/"
    anyio.run(main, url, "--fast" in sys.argv)
