"""The broker application stops and starts again (``rabbitmqctl stop_app`` / ``start_app``).

This stops the whole node, so it runs against the suite's private node (``private_node``),
never the default broker; ``broker_stopped`` restarts the node in a ``finally`` and waits
until it accepts connections again.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest
from harness import PrivateNode

from ojs_anyio import amqp

from .resilience_helpers import EventLog

pytestmark = pytest.mark.anyio

#: Small backoff, so the first attempt after the broker is back comes within ~0.2 s.
POLICY = amqp.RecoveryPolicy(initial_delay=0.05, multiplier=2.0, max_delay=0.2, jitter=0.1)


async def test_recovers_within_two_seconds_of_broker_restart(
    private_node: PrivateNode, unique: Callable[[str], str]
) -> None:
    queue = unique("q")
    with anyio.fail_after(90):
        async with amqp.connect(private_node.url, recovery=POLICY, connection_timeout=2.0) as conn:
            log = EventLog(conn)
            async with conn.channel() as ch:
                await ch.queue_declare(queue)  # not durable: the restart drops it, recovery re-declares it
                async with ch.consume(queue, prefetch=10) as messages:
                    await ch.publish(b"before", routing_key=queue)
                    msg = await messages.__anext__()
                    assert msg.body == b"before"
                    await msg.ack()

                    async with private_node.broker_stopped():
                        lost = await log.wait_for(amqp.ConnectionLost, timeout=30)
                        assert isinstance(lost.error, amqp.AMQPError)
                    # broker_stopped() returns once the broker sends Connection.Start again.
                    ready_at = anyio.current_time()
                    await log.wait_recovered(timeout=10)
                    recovered_after = log.times_of(amqp.ConnectionRecovered)[0] - ready_at
                    print(f"recovered {recovered_after:.3f}s after the broker was ready")
                    assert recovered_after < 2.0

                    await ch.publish(b"after", routing_key=queue)
                    msg = await messages.__anext__()
                    assert (msg.body, msg.redelivered) == (b"after", False)
                    await msg.ack()
                    assert [ev.queue for ev in log.of(amqp.ConsumerRecovered)] == [queue]
                await ch.queue_delete(queue)
