"""connection.blocked: a memory alarm on the broker blocks publishers, and publish honours it.

These tests change the whole broker node (memory watermark 0) for a few seconds, so they run
against the suite's private node (``private_node``), never the default broker; the harness
restores the watermark in a shielded ``finally``.
"""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest
from harness import PrivateNode

from ojs_anyio import amqp

pytestmark = pytest.mark.anyio


async def test_blocked_publish_times_out_and_resumes_after_unblock(private_node: PrivateNode) -> None:
    amqp_url = private_node.url
    seen: list[amqp.RecoveryEvent] = []
    waited = anyio.Event()
    with anyio.fail_after(60):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            remove = conn.add_listener(seen.append)
            queue = (await ch.queue_declare("", exclusive=True)).name

            async def publish_without_timeout() -> None:
                await ch.publish(b"waited", routing_key=queue)  # waits for Unblocked
                waited.set()

            async with conn.subscribe() as events, anyio.create_task_group() as tg:
                async with private_node.lowered_memory_watermark():
                    # RabbitMQ blocks a connection once it publishes during the alarm.  This
                    # publish is written at once (not yet known to be blocked) and held by
                    # the broker until the alarm clears.
                    window = ch.publish_window()
                    held = await window.publish(b"held", routing_key=queue)
                    await window.flush()
                    with anyio.fail_after(10):
                        event = await events.__anext__()
                    assert isinstance(event, amqp.ConnectionBlockedEvent)
                    assert "memory" in event.reason
                    assert conn.is_blocked
                    assert conn.blocked_reason is not None and "memory" in conn.blocked_reason

                    started = anyio.current_time()
                    with pytest.raises(amqp.BlockedTimeoutError, match="memory"):
                        await ch.publish(b"refused", routing_key=queue, timeout=0.5)
                    assert 0.45 <= anyio.current_time() - started < 2.0
                    with pytest.raises(amqp.BlockedTimeoutError):
                        await conn.wait_unblocked(timeout=0.1)
                    tg.start_soon(publish_without_timeout)
                    await anyio.lowlevel.checkpoint()
                    assert not held.done  # still held by the broker
                    assert not waited.is_set()
                    await _closing_a_blocked_connection_fails_its_waiting_publishers(amqp_url)
                # The alarm is gone (the harness waited for it): Connection.Unblocked follows.
                with anyio.fail_after(10):
                    event = await events.__anext__()
                assert isinstance(event, amqp.ConnectionUnblockedEvent)
                with anyio.fail_after(10):
                    await waited.wait()
            assert not conn.is_blocked
            assert conn.blocked_reason is None
            await conn.wait_unblocked(timeout=0)
            await held.wait()  # the held publish is confirmed now
            await ch.publish(b"after", routing_key=queue, timeout=5)
            bodies = []
            while (msg := await ch.get(queue, no_ack=True)) is not None:
                bodies.append(msg.body)
            # The timed-out publish was never sent; the waiting one went after the unblock.
            assert bodies == [b"held", b"waited", b"after"]
            remove()
    assert [type(e) for e in seen] == [amqp.ConnectionBlockedEvent, amqp.ConnectionUnblockedEvent]


async def _closing_a_blocked_connection_fails_its_waiting_publishers(amqp_url: str) -> None:
    """(Runs inside the alarm of the test above.)  aclose() of a blocked connection wakes
    the publishes waiting for Connection.Unblocked: they fail at once instead of hanging."""
    outcome: list[BaseException] = []
    async with amqp.connect(amqp_url, close_timeout=0.5) as conn, conn.channel() as ch:
        queue = (await ch.queue_declare("", exclusive=True)).name
        async with conn.subscribe() as events:
            window = ch.publish_window()
            await window.publish(b"blocks this connection", routing_key=queue)
            await window.flush()
            with anyio.fail_after(10):
                assert isinstance(await events.__anext__(), amqp.ConnectionBlockedEvent)

        async def waiting_publish() -> None:
            try:
                await ch.publish(b"waits for unblock", routing_key=queue)
            except amqp.AMQPError as exc:
                outcome.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiting_publish)
            await anyio.lowlevel.checkpoint()
            with anyio.fail_after(3):  # close_timeout (the broker reads nothing) + slack
                await conn.aclose()
            with anyio.fail_after(1):
                while not outcome:
                    await anyio.lowlevel.checkpoint()
        assert isinstance(outcome[0], amqp.ChannelClosedError | amqp.ConnectionClosedError)
        with pytest.raises(amqp.ConnectionClosedError):
            await conn.wait_unblocked()
