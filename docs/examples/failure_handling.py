"""At-least-once publishing and consuming that rides out connection loss.

Run: python docs/examples/failure_handling.py [amqp-url] [messages]
(needs RabbitMQ; default amqp://guest:guest@localhost:5672/).  While it runs, break the
connection, e.g. ``rabbitmqctl close_all_connections "try me"``, and watch it recover.
The resilience tests run ``main()`` through a proxy that cuts the connection mid-run.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from ojs_anyio import amqp

T = TypeVar("T")
QUEUE = "example.failure-handling"
PERSISTENT = amqp.BasicProperties(delivery_mode=2)
#: Retry quickly at first, never more than 5 s apart; give up after a minute down.
POLICY = amqp.RecoveryPolicy(initial_delay=0.1, max_delay=5.0, jitter=0.25, deadline=60.0)


def report(event: amqp.RecoveryEvent) -> None:
    if isinstance(event, amqp.ConnectionLost):
        print("lost:", event.error)
    elif isinstance(event, amqp.Reconnecting):
        print(f"reconnecting: attempt {event.attempt} in {event.delay:.2f}s")
    elif isinstance(event, amqp.ConnectionRecovered):
        print("recovered")
    elif isinstance(event, amqp.TopologyRecoveryFailed):
        print("could not restore", event.what, event.error)


async def call_again_after_a_cut(call: Callable[[], Awaitable[T]]) -> T:
    """A call in flight when the connection drops fails with the connection's error;
    calling again waits for the recovery (it never runs twice on the broker by itself)."""
    while True:
        try:
            return await call()
        except amqp.RecoveryFailedError:
            raise  # recovery gave up: this is final
        except (amqp.ConnectionLostError, amqp.ConnectionLevelError):
            continue


async def publish_all(ch: amqp.Channel, queue: str, bodies: list[bytes]) -> int:
    """Every body confirmed at least once.  A publish whose confirm was lost in a cut
    (PublishOutcomeUnknownError) may or may not have been routed: publish it again and
    accept a possible duplicate.  Returns how many were published again."""
    todo, retried = bodies, 0
    while todo:
        window = ch.publish_window(max_in_flight=256)
        sent = []
        for body in todo:
            # Waits while the connection recovers, at most 30 s (then PublishTimeoutError).
            handle = await window.publish(body, routing_key=queue, properties=PERSISTENT, timeout=30)
            sent.append((handle, body))
        await window.wait_all()
        for handle, _ in sent:
            if handle.error is not None and not isinstance(handle.error, amqp.PublishOutcomeUnknownError):
                raise handle.error  # nacked or unroutable: retrying would not help
        todo = [body for handle, body in sent if handle.error is not None]
        retried += len(todo)
    return retried


async def consume_until(ch: amqp.Channel, queue: str, wanted: set[bytes]) -> int:
    """Handle each message idempotently (a duplicate is harmless), then ack it.  An ack
    that can't reach the broker because of a cut means the message comes again
    (redelivered=True).  Returns how many duplicates were seen."""
    duplicates = 0
    async with ch.consume(queue, prefetch=100) as messages:
        async for msg in messages:  # keeps going across reconnections
            if msg.body in wanted:
                wanted.discard(msg.body)
            else:
                duplicates += 1
            try:
                await msg.ack()
            except (amqp.StaleDeliveryError, amqp.ConnectionLostError):
                pass  # received before the cut: the broker redelivers it
            if not wanted:
                return duplicates
    return duplicates


async def main(
    url: str = "amqp://guest:guest@localhost:5672/", count: int = 1000, queue: str = QUEUE
) -> None:
    bodies = [f"message {i}".encode() for i in range(count)]
    # Gives up with RecoveryFailedError, out of this block, after 60 s without a connection.
    async with amqp.connect(url, recovery=POLICY) as conn:
        conn.add_listener(report)
        async with conn.channel() as ch:
            # Durable queue, persistent messages: nothing confirmed is lost even if the
            # broker restarts.  Recovery re-declares it after every reconnect.
            await ch.queue_declare(queue, durable=True)
            wanted = set(bodies)
            async with anyio.create_task_group() as tg:

                async def consumer() -> None:
                    async with conn.channel(confirms=False) as consumer_ch:
                        duplicates = await consume_until(consumer_ch, queue, wanted)
                    print(f"consumed all {count}; {duplicates} duplicates")

                tg.start_soon(consumer)
                retried = await publish_all(ch, queue, bodies)
                print(f"published {count}, all confirmed; {retried} published again after a cut")
            await call_again_after_a_cut(lambda: ch.queue_delete(queue))
        print(f"reconnections: {conn.reconnections}")


if __name__ == "__main__":
    url = sys.argv[1] if len(sys.argv) > 1 else "amqp://guest:guest@localhost:5672/"
    anyio.run(main, url, int(sys.argv[2]) if len(sys.argv) > 2 else 1000)
