"""The memory:// broker's own behaviour: what only it has (named brokers, a virtual clock,
introspection), robustness (a protocol violation or a broker bug closes one connection
only), and every deliberate difference from RabbitMQ that docs/testing.md lists.

The behaviour it shares with RabbitMQ is tested on both brokers by the shared suites
(tests/amqp, tests/jobs: ``amqp_url`` is parametrized over RabbitMQ and memory://).
"""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from ojs_anyio import amqp
from ojs_anyio.memory import MemoryBroker, VirtualClock, get_broker, open_stream
from ojs_anyio.memory import _session as session_module
from ojs_codec import HEARTBEAT_FRAME, PROTOCOL_HEADER, FrameReader, InternalError, NotAllowed, decode_method

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


async def _read_until_close(stream: anyio.abc.ByteStream) -> object | None:
    """Read frames from a raw memory stream until Connection.Close (returned) or EOF (None)."""
    reader = FrameReader()
    with anyio.fail_after(5):
        while True:
            try:
                data = await stream.receive()
            except anyio.EndOfStream:
                return None
            for frame_type, _channel, payload in reader.frames(data):
                if frame_type == 1:
                    method = decode_method(payload)
                    if method.name == "Connection.Close":
                        return method


async def test_named_brokers_are_separate_and_outlive_connections() -> None:
    a, b = f"memory://a-{os.getpid()}", f"memory://b-{os.getpid()}"
    try:
        with anyio.fail_after(5):
            async with amqp.connect(a) as conn, conn.channel() as ch:
                await ch.queue_declare("shared", durable=True)
                await ch.publish(b"kept", routing_key="shared")
            # A later connection to the same name sees it (the broker lives in the process)...
            async with amqp.connect(a) as conn, conn.channel() as ch:
                assert (await ch.queue_declare("shared", passive=True)).message_count == 1
            # ...another name is another broker.
            async with amqp.connect(b) as conn, conn.channel() as ch:
                with pytest.raises(amqp.NotFound):
                    await ch.queue_declare("shared", passive=True)
    finally:
        get_broker(a.removeprefix("memory://")).close()
        get_broker(b.removeprefix("memory://")).close()


async def test_a_private_broker_forgets_everything_and_drops_its_connections() -> None:
    with anyio.fail_after(5):
        async with MemoryBroker() as broker:
            url = broker.url
            with pytest.raises(amqp.ConnectionLostError):
                async with amqp.connect(url) as conn, conn.channel() as ch:
                    await ch.queue_declare("q")
                    assert broker.connections == 1
                    broker.close()  # what leaving the block does
                    await ch.queue_declare("q", passive=True)
        async with MemoryBroker(url.removeprefix("memory://")) as again:
            assert "q" not in again.queues()


async def test_no_task_outlives_the_connection() -> None:
    async with MemoryBroker() as broker:
        async with amqp.connect(broker.url) as conn, conn.channel() as ch:
            await ch.queue_declare("q", arguments={"x-message-ttl": 60_000})
            await ch.publish(b"x", routing_key="q")
        assert broker.connections == 0  # the broker side went with the client's block


async def test_virtual_clock_moves_only_when_advanced() -> None:
    async with (
        MemoryBroker(clock=VirtualClock()) as broker,
        amqp.connect(broker.url) as conn,
        conn.channel() as ch,
    ):
        await ch.queue_declare("dead")
        await ch.queue_declare(
            "wait",
            arguments={
                "x-message-ttl": 1000,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": "dead",
            },
        )
        await ch.queue_declare("temporary", arguments={"x-expires": 5000})
        await ch.publish(b"later", routing_key="wait")
        await anyio.sleep(0.05)  # real time passes: nothing happens
        assert [m.body for m in broker.queue_messages("wait")] == [b"later"]
        broker.advance_to(0.999)
        assert [m.body for m in broker.queue_messages("wait")] == [b"later"]
        broker.advance_to(1.0)
        assert broker.queue_messages("wait") == []
        assert [m.body for m in broker.queue_messages("dead")] == [b"later"]
        # x-expires: an unused queue goes after its time.
        assert "temporary" in broker.queues()
        broker.advance_to(6.0)
        assert "temporary" not in broker.queues()


async def test_a_protocol_violation_closes_only_that_connection() -> None:
    async with MemoryBroker() as broker, amqp.connect(broker.url) as healthy, healthy.channel() as ch:
        await ch.queue_declare("still-here")
        stream = await open_stream(broker.name)
        await stream.send(PROTOCOL_HEADER)
        # A method frame whose end octet is wrong: 501 FRAME_ERROR.
        await stream.send(struct.pack(">BHI", 1, 0, 4) + b"\x00\x0a\x00\x0b" + b"\x00")
        close = await _read_until_close(stream)
        assert close is not None and close.reply_code == 501  # type: ignore[attr-defined]
        await stream.aclose()
        # The other connection carries on.
        await ch.publish(b"ok", routing_key="still-here")
        assert (await ch.queue_declare("still-here", passive=True)).message_count == 1


async def test_a_wrong_protocol_header_gets_ours_back() -> None:
    async with MemoryBroker() as broker:
        stream = await open_stream(broker.name)
        await stream.send(b"HTTP/1.1")
        with anyio.fail_after(5):
            assert await stream.receive() == PROTOCOL_HEADER
            with pytest.raises(anyio.EndOfStream):
                await stream.receive()
        await stream.aclose()


async def test_a_broker_bug_closes_only_that_connection_with_541(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: object, ch: object, m: object) -> None:
        raise RuntimeError("injected bug")

    monkeypatch.setitem(session_module._HANDLERS, "Queue.Purge", broken)
    async with MemoryBroker() as broker, amqp.connect(broker.url) as healthy, healthy.channel() as ok:
        await ok.queue_declare("q")
        with pytest.raises(InternalError):
            async with amqp.connect(broker.url) as victim, victim.channel() as ch:
                await ch.queue_purge("q")
        await ok.publish(b"fine", routing_key="q")
        assert (await ok.queue_declare("q", passive=True)).message_count == 1


async def test_login_and_vhost_are_checked() -> None:
    async with MemoryBroker() as broker:
        with pytest.raises(amqp.AuthenticationError):
            async with amqp.connect(f"memory://guest:wrong@{broker.name}/"):
                pass
        with pytest.raises(NotAllowed):
            async with amqp.connect(f"{broker.url}/nowhere"):
                pass
        broker.add_vhost("tenant")
        broker.add_user("app", "secret")
        async with amqp.connect(f"memory://app:secret@{broker.name}/tenant") as conn, conn.channel() as ch:
            await ch.queue_declare("only-in-tenant")
        assert "only-in-tenant" in broker.queues("tenant") and "only-in-tenant" not in broker.queues("/")


# ---------------------------------------------------------------------- deliberate differences


async def test_difference_only_plain_authentication() -> None:
    async with MemoryBroker() as broker:
        with pytest.raises(amqp.AMQPError, match="AMQPLAIN"):
            async with amqp.connect(f"{broker.url}?auth_mechanism=AMQPLAIN"):
                pass


async def test_difference_heartbeats_are_answered_not_timed() -> None:
    async with MemoryBroker() as broker, amqp.connect(broker.url, heartbeat=1) as conn:
        await anyio.sleep(2.5)  # idle for over two intervals: what is tested is time passing
        assert conn.is_open
        async with conn.channel() as ch:
            await ch.queue_declare("", exclusive=True)


async def test_difference_stream_queues_are_refused() -> None:
    async with MemoryBroker() as broker, amqp.connect(broker.url) as conn, conn.channel() as ch:
        with pytest.raises(amqp.PreconditionFailed, match="stream"):
            await ch.queue_declare("s", durable=True, arguments={"x-queue-type": "stream"})


async def test_difference_delivery_limit_and_consumer_priority_are_accepted_not_applied() -> None:
    async with MemoryBroker() as broker, amqp.connect(broker.url) as conn, conn.channel() as ch:
        await ch.queue_declare(
            "poison", durable=True, arguments={"x-queue-type": "quorum", "x-delivery-limit": 1}
        )
        await ch.publish(b"p", routing_key="poison")
        for _ in range(3):
            msg = await ch.get("poison")
            assert msg is not None
            await msg.nack(requeue=True)
        # RabbitMQ would have dropped it after the limit; memory:// keeps redelivering.
        again = await ch.get("poison")
        assert again is not None and (again.properties.headers or {})["x-delivery-count"] == 3
        await again.ack()
        async with ch.consume("poison", arguments={"x-priority": 5}):
            assert (await ch.queue_declare("poison", passive=True)).consumer_count == 1


async def test_difference_a_client_that_stops_reading_is_dropped() -> None:
    async with MemoryBroker() as broker:
        stream = await open_stream(broker.name)
        session = stream._session  # type: ignore[attr-defined]
        session.write(b"x" * (session_module.HIGH_WATER + 1))
        assert not session.writable and not session.aborted  # deliveries pause first
        session.write(b"x" * session_module.HARD_LIMIT)
        assert session.aborted
        with pytest.raises(anyio.BrokenResourceError):
            await stream.send(HEARTBEAT_FRAME)
        await stream.aclose()


async def test_difference_server_properties_name_rabbitmq_and_say_the_truth() -> None:
    async with MemoryBroker() as broker, amqp.connect(broker.url) as conn:
        props = conn.server_properties
        assert props["product"] == "RabbitMQ" and props["version"].startswith("3.10")
        assert "memory://" in props["platform"] and "emulation" in props["information"]


# ---------------------------------------------------------------------- the example user suite


def _run_example(module: str) -> subprocess.CompletedProcess[str]:
    """pytest on one example test module of docs/examples, as a user would run it."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "codec")]))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"docs/examples/{module}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_example_user_test_module_passes() -> None:
    """docs/examples/test_user_app.py (the walkthrough of docs/testing.md) runs green."""
    result = _run_example("test_user_app.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "12 passed" in result.stdout


def test_the_example_events_test_module_passes() -> None:
    """docs/examples/test_events_app.py (bus_tester, docs/testing.md) runs green."""
    result = _run_example("test_events_app.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "8 passed" in result.stdout  # 4 tests x (asyncio, trio)


def _open_frames() -> list[bytes]:
    from pamqp import commands

    frame = session_module.method_frame
    return [
        frame(
            0,
            commands.Connection.StartOk,
            client_properties={},
            mechanism="PLAIN",
            response=b"\x00guest\x00guest",
            locale="en_US",
        ),
        frame(0, commands.Connection.TuneOk, channel_max=0, frame_max=131072, heartbeat=0),
        frame(0, commands.Connection.Open, virtual_host="/"),
        frame(1, commands.Channel.Open),
        frame(1, commands.Queue.Declare, queue="q1"),
        frame(1, commands.Queue.Declare, queue="q2", arguments={"x-max-priority": 3}),
        frame(1, commands.Exchange.Declare, exchange="x1", exchange_type="fanout"),
        frame(1, commands.Queue.Bind, queue="q1", exchange="x1"),
    ]


OPEN = _open_frames()


async def test_random_bytes_never_crash_the_broker() -> None:
    """Garbage, and well-framed nonsense (random method ids and fields, content out of
    place), on fresh connections: each is closed or ignored, nothing escapes into the broker,
    and a healthy connection carries on."""
    rng = random.Random(12)
    async with MemoryBroker() as broker, amqp.connect(broker.url) as healthy, healthy.channel() as ch:
        await ch.queue_declare("survivor")
        for _ in range(300):
            stream = await open_stream(broker.name)
            session = stream._session  # type: ignore[attr-defined]
            handshake = [PROTOCOL_HEADER, *OPEN] if rng.random() < 0.9 else [PROTOCOL_HEADER]
            chunks: list[bytes] = []
            for _ in range(rng.randint(1, 6)):
                kind = rng.random()
                if kind < 0.3:
                    chunks.append(rng.randbytes(rng.randint(1, 40)))
                else:
                    ftype = rng.choice([1, 1, 1, 2, 3, 8])
                    channel = rng.choice([0, 1, 1, 1, 2])
                    payload = struct.pack(
                        ">HH", rng.choice([10, 20, 40, 50, 60, 85, 90]), rng.randint(0, 130)
                    )
                    payload += rng.randbytes(rng.randint(0, 30))
                    chunks.append(struct.pack(">BHI", ftype, channel, len(payload)) + payload + b"\xce")
            for data in handshake + chunks:
                session.feed(data)  # never raises: errors become Connection.Close
                assert b"INTERNAL_ERROR" not in session.out, (handshake, chunks)
            await stream.aclose()
        await ch.publish(b"alive", routing_key="survivor")
        assert (await ch.queue_declare("survivor", passive=True)).message_count == 1
        assert broker.connections == 1


def _random_method(rng: random.Random) -> bytes:
    """A well-formed method frame of a random client method with random field values."""
    from pamqp import commands

    from ojs_codec._frames import _spec

    classes = [
        commands.Exchange.Declare, commands.Exchange.Delete, commands.Exchange.Bind,
        commands.Exchange.Unbind, commands.Queue.Declare, commands.Queue.Bind,
        commands.Queue.Unbind, commands.Queue.Purge, commands.Queue.Delete,
        commands.Basic.Qos, commands.Basic.Consume, commands.Basic.Cancel,
        commands.Basic.Publish, commands.Basic.Get, commands.Basic.Ack, commands.Basic.Nack,
        commands.Basic.Reject, commands.Basic.Recover, commands.Confirm.Select,
        commands.Tx.Select, commands.Tx.Commit, commands.Tx.Rollback, commands.Channel.Flow,
        commands.Channel.Close, commands.Channel.Open,
    ]  # fmt: skip
    names = ["", "q1", "q2", "amq.direct", "amq.topic", "amq.gen-x", "x1", "amq.rabbitmq.reply-to", "é"]
    tables: list[dict[str, object]] = [
        {},
        {"x-message-ttl": rng.choice([0, 5, -1])},
        {"x-max-priority": rng.choice([3, 300])},
        {"x-queue-type": rng.choice(["quorum", "classic", "stream", "nope"])},
        {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "q2"},
        {"x-max-length": 1, "x-overflow": rng.choice(["reject-publish", "drop-head", "bad"])},
        {"x-single-active-consumer": True},
        {"x-match": rng.choice(["any", "all", "bad"]), "k": 1},
        {"alternate-exchange": "x1"},
        {"x-expires": rng.choice([1, 0])},
    ]
    cls = rng.choice(classes)
    fields: dict[str, object] = {}
    for name, kind in _spec(cls):
        if kind == "bit":
            fields[name] = rng.random() < 0.3
        elif kind == "shortstr":
            fields[name] = (
                rng.choice(["direct", "fanout", "topic", "headers", "x-delayed-message"])
                if name == "exchange_type"
                else rng.choice(names)
            )
        elif kind == "table":
            fields[name] = rng.choice(tables)
        elif kind == "longlong":
            fields[name] = rng.randint(0, 6)
        elif kind in ("short", "long"):
            fields[name] = rng.choice([0, 0, 1, 5])
        elif kind == "octet":
            fields[name] = 0
        else:
            fields[name] = None
    frame = session_module.method_frame(1 if rng.random() < 0.97 else 2, cls, **fields)
    if cls is commands.Basic.Publish and rng.random() < 0.8:
        body = rng.randbytes(rng.randint(0, 20))
        props = amqp.BasicProperties(
            expiration=rng.choice([None, "0", "5", "x"]),
            priority=rng.choice([None, 1, 9]),
            reply_to=rng.choice([None, "amq.rabbitmq.reply-to"]),
            headers=rng.choice([None, {"CC": ["q2"]}, {"BCC": ["q1"]}, {"k": 1}]),
        )
        from ojs_codec import encode_content

        frame += encode_content(1, 60, props, body, 131072)
    return frame


async def test_random_methods_never_crash_the_broker() -> None:
    """Well-formed methods in random order with random fields: RabbitMQ's errors or answers,
    never a broker exception (541), and other connections carry on."""
    rng = random.Random(int(os.environ.get("OJS_FUZZ_SEED", "7")))
    async with MemoryBroker() as broker, amqp.connect(broker.url) as healthy, healthy.channel() as ch:
        await ch.queue_declare("survivor")
        for _ in range(int(os.environ.get("OJS_FUZZ_ROUNDS", "200"))):
            stream = await open_stream(broker.name)
            session = stream._session  # type: ignore[attr-defined]
            frames = [_random_method(rng) for _ in range(rng.randint(1, 12))]
            for data in [PROTOCOL_HEADER, *OPEN, *frames]:
                session.feed(data)
                assert b"INTERNAL_ERROR" not in session.out, frames
            await stream.aclose()
            broker.run_due()
        await ch.publish(b"alive", routing_key="survivor")
        assert (await ch.queue_declare("survivor", passive=True)).message_count == 1


@pytest.mark.anyio
async def test_an_x_death_header_that_is_not_an_array_is_replaced_when_dead_lettered() -> None:
    """Any client may publish ``x-death: true``; RabbitMQ 3.10 dead-letters such a message
    with a fresh one-entry x-death array (checked against the broker), and so do we."""
    dlx = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "xd.dlq"}
    async with MemoryBroker() as broker, amqp.connect(broker.url) as conn, conn.channel() as ch:
        await ch.queue_declare("xd.dlq")
        await ch.queue_declare("xd", arguments=dlx)
        await ch.publish(b"x", routing_key="xd", properties=amqp.BasicProperties(headers={"x-death": True}))
        msg = await ch.get("xd")
        assert msg is not None
        await msg.nack(requeue=False)
        dead = await ch.get("xd.dlq")  # the broker moved it before it answered this Get
    assert dead is not None
    deaths = (dead.properties.headers or {})["x-death"]
    assert [(d["reason"], d["queue"], d["count"]) for d in deaths] == [("rejected", "xd", 1)]
