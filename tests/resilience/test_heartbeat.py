"""A broker that goes silent (stalled proxy) is noticed by heartbeats, then recovered."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest
from harness import FaultProxy

from ojs_anyio import amqp

from .resilience_helpers import FAST, EventLog, message_count

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.rabbitmq_only("fault injection: a TCP proxy that stalls the broker"),
]

HEARTBEAT = 1  # seconds, negotiated down from the broker's 60


async def test_heartbeat_death_is_noticed_then_recovered(amqp_url: str, unique: Callable[[str], str]) -> None:
    queue = unique("q")
    async with FaultProxy() as proxy:
        with anyio.fail_after(30):
            async with amqp.connect(proxy.url(), heartbeat=HEARTBEAT, recovery=FAST) as conn:
                # connection_timeout bounds each reconnect attempt that hangs on the stalled
                # proxy.  Set once connected: the first connect keeps the default, since a
                # loaded machine can stall the loop for 0.5 s (a CI run saw one step of the
                # first connect take 0.476 s and the connect time out at 0.5 s).
                conn.connection_timeout = 0.5
                assert conn.negotiated is not None and conn.negotiated.heartbeat == HEARTBEAT
                log = EventLog(conn)
                async with conn.channel() as ch:
                    await ch.queue_declare(queue)
                    stalled_at = anyio.current_time()
                    proxy.stall()  # sockets stay open; nothing gets through either way
                    lost = await log.wait_for(amqp.ConnectionLost, timeout=10)
                    noticed_after = log.times_of(amqp.ConnectionLost)[0] - stalled_at
                    # Two silent intervals, checked every half interval, plus scheduling slack.
                    assert 2 * HEARTBEAT <= noticed_after < 2 * HEARTBEAT + 1.0, noticed_after
                    assert isinstance(lost.error, amqp.ConnectionLostError)
                    assert "unresponsive" in str(lost.error)

                    # Disconnected: a publish bounded below the outage times out clearly…
                    with pytest.raises(amqp.PublishTimeoutError, match="not re-established"):
                        await ch.publish(b"impatient", routing_key=queue, timeout=0.2)
                    # …one with room to wait is confirmed once recovery completes.
                    confirmed_at: list[float] = []

                    async def patient() -> None:
                        await ch.publish(b"patient", routing_key=queue, timeout=10)
                        confirmed_at.append(anyio.current_time())

                    async with anyio.create_task_group() as tg:
                        tg.start_soon(patient)
                        # Attempts keep timing out while stalled: a second one begins (the
                        # first timed out), and the publish is still waiting.
                        second = await log.wait_for(amqp.Reconnecting, 2, timeout=5)
                        assert isinstance(second.error, TimeoutError)  # the first attempt timed out...
                        first_at, second_at = log.times_of(amqp.Reconnecting)[:2]
                        assert second_at - first_at < 0.5 + 1.0  # ...within the bound set above
                        assert confirmed_at == []
                        unstalled_at = anyio.current_time()
                        proxy.unstall()
                        await log.wait_recovered(timeout=5)
                    recovered_at = log.times_of(amqp.ConnectionRecovered)[0]
                    assert recovered_at - unstalled_at < 1.0  # next attempt (≤0.5 s) + handshake
                    assert confirmed_at and confirmed_at[0] >= recovered_at
                    assert await message_count(amqp_url, queue) == 1
                    await ch.queue_delete(queue)
