"""Connection lifecycle against the real broker: handshake, tuning, close, cancellation, errors."""

from __future__ import annotations

import uuid

import anyio
import anyio.lowlevel
import pytest
from harness import FaultProxy
from support.brokers import RABBITMQ_HOST, RABBITMQ_PORT

from ojs_anyio import amqp
from ojs_codec import ConnectionState, NotAllowed

from .amqp_helpers import (
    broker_connection_names,
    closed_port,
    connections_on,
    force_close_on,
    wait_broker_forgets,
    wait_until,
)

pytestmark = pytest.mark.anyio

#: The RabbitMQ broker (``OJS_AMQP_URL``) as host:port, for the URLs these tests spell out.
BROKER = f"{RABBITMQ_HOST}:{RABBITMQ_PORT}"


def _name() -> str:
    return f"ojs-test-conn-{uuid.uuid4().hex[:12]}"


# ---------------------------------------------------------------------- open / close


async def test_open_and_close(amqp_url: str) -> None:
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn:
            assert conn.is_open
            assert not conn.is_blocked
            assert conn.server_properties["product"] == "RabbitMQ"
            assert conn.server_properties["capabilities"]["publisher_confirms"] is True
            assert "guest:***@" in repr(conn) and "open" in repr(conn)
            async with conn.channel() as ch:
                await ch.queue_declare("", exclusive=True)
        assert not conn.is_open
        assert "closed" in repr(conn)
        # Close-Ok arrived: only the broker's Close-Ok (or Close) moves the codec to CLOSED.
        assert conn._proto.state is ConnectionState.CLOSED


@pytest.mark.usefixtures("rabbitmq_url")
async def test_leaving_the_block_waits_for_close_ok() -> None:
    """With the broker's replies held back, leaving waits for Close-Ok up to close_timeout."""
    async with FaultProxy() as proxy:
        with anyio.fail_after(10):
            async with amqp.connect(proxy.url(), close_timeout=0.5) as conn:
                proxy.stall("downstream")
                started = anyio.current_time()
            elapsed = anyio.current_time() - started
            assert 0.45 <= elapsed < 2.0
            assert conn._proto.state is ConnectionState.CLOSING  # Close sent, Close-Ok never came
            await wait_until(lambda: proxy.active_connections == 0, what="socket closed")


async def test_aclose_is_idempotent_and_the_block_carries_on(amqp_url: str) -> None:
    after_close: list[str] = []
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn:
            ch = await conn.channel().__aenter__()
            await conn.aclose()
            await conn.aclose()
            assert not conn.is_open
            assert not ch.is_open
            await anyio.lowlevel.checkpoint()  # a checkpoint: aclose() must not have cancelled this block
            after_close.append("ran")
            with pytest.raises(amqp.ChannelClosedError):
                await ch.publish(b"x", routing_key="nowhere")
            with pytest.raises(amqp.ConnectionClosedError):
                async with conn.channel():
                    pass
        await conn.aclose()
    assert after_close == ["ran"]
    assert conn._proto.state is ConnectionState.CLOSED


async def test_use_after_the_block_raises(amqp_url: str) -> None:
    async with amqp.connect(amqp_url) as conn:
        pass
    with anyio.fail_after(5), pytest.raises(amqp.ConnectionClosedError):
        async with conn.channel():
            pass


async def test_exception_in_the_block_propagates_unwrapped(amqp_url: str) -> None:
    with anyio.fail_after(10), pytest.raises(KeyError, match="boom"):
        async with amqp.connect(amqp_url) as conn, conn.channel() as ch:
            await ch.queue_declare("", exclusive=True)
            raise KeyError("boom")
    assert conn._proto.state is ConnectionState.CLOSED


# ---------------------------------------------------------------------- negotiation


async def test_negotiated_values_from_options(amqp_url: str) -> None:
    name = _name()
    with anyio.fail_after(20):
        async with amqp.connect(amqp_url, heartbeat=7, frame_max=65536, channel_max=100, name=name) as conn:
            tuned = conn.negotiated
            assert tuned is not None
            assert (tuned.heartbeat, tuned.frame_max, tuned.channel_max) == (7, 65536, 100)
            # The broker agrees.
            rows = await connections_on(amqp_url, "timeout", "frame_max", "channel_max", "client_properties")
            # Other clients' rows may list no properties yet (a connection still opening shows "").
            mine = [
                row for row in rows
                if isinstance(row["client_properties"], list)
                and ["connection_name", "longstr", name] in row["client_properties"]
            ]  # fmt: skip
            assert len(mine) == 1
            assert (mine[0]["timeout"], mine[0]["frame_max"], mine[0]["channel_max"]) == (7, 65536, 100)


@pytest.mark.usefixtures("rabbitmq_url")
async def test_negotiated_values_from_url() -> None:
    url = f"amqp://guest:guest@{BROKER}/%2F?heartbeat=3&frame_max=8192&channel_max=2"
    with anyio.fail_after(10):
        async with amqp.connect(url) as conn:
            tuned = conn.negotiated
            assert tuned is not None
            assert (tuned.heartbeat, tuned.frame_max, tuned.channel_max) == (3, 8192, 2)
            # channel_max is enforced locally.
            async with conn.channel(), conn.channel():
                with pytest.raises(amqp.UsageError, match="channel_max"):
                    async with conn.channel():
                        pass


async def test_heartbeat_zero_takes_the_brokers_value(amqp_url: str) -> None:
    """RabbitMQ's rule (DECISIONS 11): if either side offers 0, the larger value wins."""
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url, heartbeat=0) as conn:
            assert conn.negotiated is not None
            assert conn.negotiated.heartbeat == 60


async def test_default_heartbeat_is_60(amqp_url: str) -> None:
    with anyio.fail_after(10):
        async with amqp.connect(amqp_url) as conn:
            assert conn.negotiated is not None
            assert conn.negotiated.heartbeat == 60
            assert conn.negotiated.frame_max == 131072


# ---------------------------------------------------------------------- cancellation


@pytest.mark.usefixtures("rabbitmq_url")
async def test_cancelling_the_block_from_outside_leaves_nothing_behind() -> None:
    name = _name()
    tasks_before = {task.id for task in anyio.get_running_tasks()}
    async with FaultProxy() as proxy:
        with anyio.fail_after(20):
            with anyio.CancelScope() as scope:
                async with amqp.connect(proxy.url(), name=name) as conn, conn.channel() as ch:
                    info = await ch.queue_declare("", exclusive=True)
                    await ch.publish(b"x", routing_key=info.name)
                    async with ch.consume(info.name, prefetch=5):
                        assert name in await broker_connection_names()
                        cancelled_at = anyio.current_time()

                        async def cancel_from_elsewhere() -> None:
                            scope.cancel()

                        async with anyio.create_task_group() as tg:
                            tg.start_soon(cancel_from_elsewhere)
                            await anyio.sleep_forever()
            assert scope.cancelled_caught
            # Channel close, consumer cancel and Close/Close-Ok all completed, without
            # waiting for close_timeout (the reader keeps running while the block unwinds).
            assert anyio.current_time() - cancelled_at < 2.0
            assert conn._proto.state is ConnectionState.CLOSED
            assert not conn.is_open
            await wait_until(lambda: proxy.active_connections == 0, what="proxied socket closed")
            await wait_broker_forgets(name)
    assert {task.id for task in anyio.get_running_tasks()} == tasks_before


@pytest.mark.usefixtures("rabbitmq_url")
async def test_cancelling_during_the_handshake_leaves_nothing_behind() -> None:
    tasks_before = {task.id for task in anyio.get_running_tasks()}
    async with FaultProxy() as proxy:
        proxy.stall("downstream")
        with anyio.fail_after(10):
            with anyio.move_on_after(0.3) as scope:
                async with amqp.connect(proxy.url()):
                    pytest.fail("the handshake cannot complete")
            assert scope.cancelled_caught
            await wait_until(lambda: proxy.active_connections == 0, what="proxied socket closed")
    assert {task.id for task in anyio.get_running_tasks()} == tasks_before


async def test_connection_timeout_bounds_the_handshake() -> None:
    async with FaultProxy() as proxy:
        proxy.stall("downstream")
        with anyio.fail_after(5):
            started = anyio.current_time()
            with pytest.raises((TimeoutError, amqp.ConnectionLostError)):
                async with amqp.connect(proxy.url(connection_timeout=300)):
                    pass
            assert anyio.current_time() - started < 2.0
            await wait_until(lambda: proxy.active_connections == 0, what="proxied socket closed")


@pytest.mark.usefixtures("rabbitmq_url")
async def test_aclose_wakes_operations_waiting_for_a_reconnection() -> None:
    """With recovery on and the broker unreachable, operations wait for the connection;
    aclose() (from another task) makes them fail at once instead of hanging."""
    failures: list[BaseException] = []
    policy = amqp.RecoveryPolicy(initial_delay=30.0, jitter=0)
    async with FaultProxy() as proxy:
        with anyio.fail_after(20):
            async with amqp.connect(proxy.url(), recovery=policy) as conn, conn.channel() as ch:
                queue = (await ch.queue_declare("", exclusive=True)).name
                lost = anyio.Event()
                conn.add_listener(lambda ev: lost.set() if isinstance(ev, amqp.ConnectionLost) else None)
                proxy.refuse_new()
                proxy.cut_all()
                await lost.wait()

                async def waiting(operation: str) -> None:
                    try:
                        if operation == "publish":
                            await ch.publish(b"x", routing_key=queue)
                        else:
                            await ch.queue_declare("", exclusive=True)
                    except amqp.AMQPError as exc:
                        failures.append(exc)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(waiting, "publish")
                    tg.start_soon(waiting, "rpc")
                    await anyio.lowlevel.checkpoint()
                    assert failures == []
                    closed_at = anyio.current_time()
                    await conn.aclose()
                assert anyio.current_time() - closed_at < 1.0
    assert len(failures) == 2
    assert all(isinstance(e, amqp.ConnectionClosedError | amqp.ChannelClosedError) for e in failures)


# ---------------------------------------------------------------------- failures to connect


async def test_closed_port_fails_fast() -> None:
    port = closed_port()
    with anyio.fail_after(3):
        started = anyio.current_time()
        with pytest.raises(amqp.ConnectionLostError, match=f"127.0.0.1:{port}"):
            async with amqp.connect(f"amqp://guest:guest@127.0.0.1:{port}/"):
                pass
        assert anyio.current_time() - started < 1.0


async def test_peer_closing_the_socket_at_once() -> None:
    async with FaultProxy() as proxy:
        proxy.refuse_new()
        with anyio.fail_after(5), pytest.raises(amqp.ConnectionLostError):
            async with amqp.connect(proxy.url()):
                pass


@pytest.mark.usefixtures("rabbitmq_url")
async def test_wrong_password() -> None:
    secret = "not-the-password-42"
    with anyio.fail_after(10), pytest.raises(amqp.AuthenticationError) as info:
        async with amqp.connect(f"amqp://guest:{secret}@{BROKER}/"):
            pass
    assert info.value.code == 403
    assert "ACCESS_REFUSED" in str(info.value)
    assert secret not in str(info.value) and secret not in repr(info.value)
    assert isinstance(info.value, amqp.ConnectionLevelError)


@pytest.mark.usefixtures("rabbitmq_url")
async def test_amqplain_auth() -> None:
    url = f"amqp://guest:guest@{BROKER}/?auth_mechanism=AMQPLAIN"
    with anyio.fail_after(10):
        async with amqp.connect(url) as conn, conn.channel() as ch:
            info = await ch.queue_declare("", exclusive=True)
            await ch.publish(b"amqplain", routing_key=info.name)
            msg = await ch.get(info.name, no_ack=True)
            assert msg is not None and msg.body == b"amqplain"


@pytest.mark.usefixtures("rabbitmq_url")
async def test_amqplain_wrong_password() -> None:
    url = f"amqp://guest:nope@{BROKER}/?auth_mechanism=AMQPLAIN"
    with anyio.fail_after(10), pytest.raises(amqp.AuthenticationError):
        async with amqp.connect(url):
            pass


@pytest.mark.usefixtures("rabbitmq_url")
async def test_unknown_vhost() -> None:
    vhost = f"no-such-vhost-{uuid.uuid4().hex[:8]}"
    with anyio.fail_after(10), pytest.raises(amqp.ConnectionLevelError) as info:
        async with amqp.connect(f"amqp://guest:guest@{BROKER}/{vhost}"):
            pass
    err = info.value
    assert isinstance(err, NotAllowed)  # RabbitMQ answers Connection.Open with 530
    assert err.code == 530
    assert vhost in str(err) and "not found" in str(err)
    assert err.method_name == "Connection.Open"


# ---------------------------------------------------------------------- broker-side close


async def test_broker_forcing_the_connection_closed_ends_the_block(amqp_url: str) -> None:
    name = _name()
    with anyio.fail_after(30), pytest.raises(amqp.ConnectionForced) as info:
        async with amqp.connect(amqp_url, name=name) as conn, conn.channel() as ch:
            info_q = await ch.queue_declare("", exclusive=True)
            assert await force_close_on(amqp_url, "closed by the test", connection_name=name) == 1
            with anyio.fail_after(10):
                async with ch.consume(info_q.name) as messages:
                    async for _ in messages:
                        pass
            pytest.fail("the block should have been cancelled")
    assert info.value.code == 320
    assert "closed by the test" in str(info.value)
    assert not conn.is_open
