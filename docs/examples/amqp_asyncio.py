"""Publish with confirms and consume with acks, on plain asyncio.

Run: python docs/examples/amqp_asyncio.py  (needs RabbitMQ on localhost:5672)
"""

import asyncio

from ojs_anyio import amqp


async def main() -> None:
    async with amqp.connect("amqp://guest:guest@localhost:5672/") as conn, conn.channel() as ch:
        queue = await ch.queue_declare("", exclusive=True)
        # One publish, awaited until the broker confirms it.
        await ch.publish(b"hello", routing_key=queue.name)
        # The bulk path: keep up to 256 publishes in flight from this one task.
        window = ch.publish_window(max_in_flight=256)
        for i in range(1000):
            await window.publish(f"message {i}".encode(), routing_key=queue.name)
        failed = await window.wait_all()
        assert failed == [], failed
        # A mandatory publish nobody can route raises on exactly that publish.
        try:
            await ch.publish(b"lost", routing_key="no-such-queue", mandatory=True)
        except amqp.UnroutableError as exc:
            print("unroutable:", exc.reply_text)
        received = 0
        async with ch.consume(queue.name, prefetch=100) as messages:
            async for message in messages:
                await message.ack()
                received += 1
                if received == 1001:
                    break
        print(f"asyncio: published and consumed {received} messages")


if __name__ == "__main__":
    asyncio.run(main())
