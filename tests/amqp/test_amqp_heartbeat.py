"""Heartbeats: a silent broker is declared dead in time, and an idle connection stays up."""

from __future__ import annotations

import os

import anyio
import pytest
from harness import FaultProxy

from ojs_anyio import amqp

from .amqp_helpers import wait_until

pytestmark = pytest.mark.anyio


@pytest.mark.usefixtures("rabbitmq_url")
async def test_stalled_broker_is_declared_dead() -> None:
    """heartbeat=1, nothing moves either way: dead after 2 intervals (checked every 0.5 s)."""
    errors: dict[str, tuple[BaseException, float]] = {}
    async with FaultProxy() as proxy:
        with anyio.fail_after(15):
            with pytest.raises(amqp.ConnectionLostError, match="heartbeat") as info:
                async with amqp.connect(proxy.url(), heartbeat=1) as conn:
                    assert conn.negotiated is not None and conn.negotiated.heartbeat == 1
                    async with conn.channel() as ch, conn.channel() as ch2:
                        queue = (await ch.queue_declare("", exclusive=True)).name
                        window = ch.publish_window()
                        handles = [await window.publish(b"w", routing_key=queue) for _ in range(3)]

                        async def record(key: str, operation: object) -> None:
                            try:
                                await operation  # type: ignore[misc]
                            except BaseException as exc:
                                errors[key] = (exc, anyio.current_time())
                                raise

                        proxy.stall("both")
                        stalled_at = anyio.current_time()
                        async with anyio.create_task_group() as tg:
                            tg.start_soon(record, "publish", ch.publish(b"x", routing_key=queue))
                            tg.start_soon(record, "rpc", ch2.queue_declare("", exclusive=True))
                            tg.start_soon(record, "window", window.wait_all())
                            # Too big for the socket buffers: its send blocks on the stalled peer.
                            tg.start_soon(
                                record, "big", ch.publish(os.urandom(20_000_000), routing_key=queue)
                            )
            dead_after = anyio.current_time() - stalled_at
            assert 1.9 <= dead_after < 3.5, dead_after
            assert "missed heartbeats" in str(info.value) or "unresponsive" in str(info.value)
            # Our socket is closed: once the proxy reads again, it sees the EOF.
            proxy.unstall("both")
            await wait_until(lambda: proxy.active_connections == 0, what="dead socket closed")
    # Every waiter got a clear error at once, none hung.
    publish_error, publish_at = errors["publish"]
    assert isinstance(publish_error, amqp.PublishOutcomeUnknownError)
    rpc_error, rpc_at = errors["rpc"]
    assert isinstance(rpc_error, amqp.ConnectionLostError)
    big_error, big_at = errors["big"]
    assert isinstance(big_error, amqp.PublishOutcomeUnknownError)  # its send was cut short
    assert max(publish_at, rpc_at, big_at) - stalled_at < 3.5
    for handle in handles:
        assert handle.done
        assert isinstance(handle.error, amqp.PublishOutcomeUnknownError)
    assert not conn.is_open
    assert conn._stream is None


@pytest.mark.usefixtures("rabbitmq_url")
async def test_idle_connection_is_kept_alive_by_heartbeats() -> None:
    """Nothing to send for 3 heartbeat intervals: our heartbeats keep the broker from
    closing the connection, and the broker's keep ours from declaring it dead."""
    async with FaultProxy() as proxy:
        with anyio.fail_after(15):
            async with amqp.connect(proxy.url(), heartbeat=1) as conn, conn.channel() as ch:
                queue = (await ch.queue_declare("", exclusive=True)).name
                up, down = proxy.bytes_up, proxy.bytes_down
                await anyio.sleep(3.0)  # the idle time under test, not synchronisation
                assert conn.is_open
                # Heartbeat frames (8 bytes each) went both ways; nothing else was sent.
                assert proxy.bytes_up - up >= 8 * 2
                assert proxy.bytes_down - down >= 8 * 2
                await ch.publish(b"still here", routing_key=queue)
                msg = await ch.get(queue, no_ack=True)
                assert msg is not None and msg.body == b"still here"
