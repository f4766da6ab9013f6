"""Recovery that cannot succeed gives up: one clear error for everyone, nothing hangs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest
from harness import FaultProxy

from ojs_anyio import amqp

from .resilience_helpers import EventLog

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.rabbitmq_only("fault injection: TCP proxies and dead ports"),
]


async def test_gives_up_after_max_attempts(amqp_url: str, unique: Callable[[str], str]) -> None:
    queue = unique("q")
    policy = amqp.RecoveryPolicy(initial_delay=0.1, multiplier=1.5, max_delay=0.2, jitter=0.1, max_attempts=3)
    outcomes: dict[str, BaseException] = {}
    log: EventLog | None = None

    async def record(what: str, waiter: Callable[[], Awaitable[object]]) -> None:
        try:
            await waiter()
        except Exception as exc:
            outcomes[what] = exc

    async with FaultProxy() as proxy:
        with anyio.fail_after(20):
            with pytest.raises(amqp.RecoveryFailedError, match="after 3 attempts") as raised:
                async with amqp.connect(proxy.url(), recovery=policy) as conn:
                    log = EventLog(conn)
                    async with conn.channel() as ch:
                        await ch.queue_declare(queue, auto_delete=True)
                        async with ch.consume(queue, prefetch=1) as messages, anyio.create_task_group() as tg:

                            async def consume() -> None:
                                async for _ in messages:
                                    pass

                            tg.start_soon(record, "consumer", consume)
                            proxy.refuse_new()
                            proxy.cut_all()
                            await log.wait_for(amqp.ConnectionLost)
                            tg.start_soon(record, "publish", lambda: ch.publish(b"x", routing_key=queue))
                            tg.start_soon(record, "wait_connected", conn.wait_connected)
                            tg.start_soon(record, "declare", lambda: ch.queue_declare(queue, passive=True))
                            await anyio.sleep_forever()  # the connection's failure ends the block
            # The block ended with the one error, not a group, and the cause is kept.
            assert isinstance(raised.value, amqp.RecoveryFailedError)
            assert isinstance(raised.value.__cause__, amqp.ConnectionLostError)
    assert log is not None
    assert [ev.attempt for ev in log.of(amqp.Reconnecting)] == [1, 2, 3]
    assert all(0.09 <= ev.delay <= 0.22 for ev in log.of(amqp.Reconnecting))
    assert log.of(amqp.ConnectionRecovered) == []
    assert conn.reconnections == 3
    assert set(outcomes) == {"consumer", "publish", "wait_connected", "declare"}
    for what, exc in outcomes.items():
        assert isinstance(exc, amqp.RecoveryFailedError), (what, exc)
    assert proxy.connections_refused >= 3


async def test_gives_up_after_deadline(amqp_url: str) -> None:
    policy = amqp.RecoveryPolicy(initial_delay=0.05, max_delay=0.05, jitter=0.0, deadline=0.5)
    async with FaultProxy() as proxy:
        with anyio.fail_after(10):
            started = 0.0
            with pytest.raises(amqp.RecoveryFailedError, match=r"after 0\.5s"):
                async with amqp.connect(proxy.url(), recovery=policy) as conn:
                    log = EventLog(conn)
                    proxy.refuse_new()
                    proxy.cut_all()
                    await log.wait_for(amqp.ConnectionLost)
                    started = anyio.current_time()
                    await conn.wait_connected()  # raises the failure itself once recovery gives up
            assert 0.4 <= anyio.current_time() - started < 1.5
