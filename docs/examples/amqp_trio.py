"""The same on Trio, with a consumer task in a nursery and a channel error handled.

Run: python docs/examples/amqp_trio.py  (needs RabbitMQ on localhost:5672)
"""

import trio

from ojs_anyio import amqp


async def consume(conn: amqp.Connection, queue: str, expected: int, done: trio.Event) -> None:
    async with conn.channel() as ch, ch.consume(queue, prefetch=50) as messages:
        count = 0
        async for message in messages:
            await message.ack()
            count += 1
            if count == expected:
                done.set()
                return


async def main() -> None:
    async with amqp.connect("amqp://guest:guest@localhost:5672/?heartbeat=30") as conn:
        async with conn.channel() as ch:
            await ch.exchange_declare("example.events", "topic", auto_delete=True)
            queue = await ch.queue_declare("", exclusive=True)
            await ch.queue_bind(queue.name, "example.events", "orders.*")
            done = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(consume, conn, queue.name, 100, done)
                window = ch.publish_window()
                for i in range(100):
                    await window.publish(b"{}", exchange="example.events", routing_key=f"orders.{i}")
                assert await window.wait_all() == []
                with trio.fail_after(10):
                    await done.wait()
        # A channel-level error closes only that channel; the connection carries on.
        try:
            async with conn.channel() as ch:
                await ch.queue_declare("does-not-exist", passive=True)
        except amqp.NotFound as exc:
            print("404 on its own channel:", exc.reply_text)
        async with conn.channel() as ch:
            await ch.publish(b"still fine", routing_key=queue.name)
        print("trio: routed 100 messages through a topic exchange")


if __name__ == "__main__":
    trio.run(main)
