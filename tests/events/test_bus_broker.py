"""The event bus against the real broker, on asyncio and Trio: publish, subscribe, pools,
redelivery with backoff, dead letters."""

from __future__ import annotations

import itertools
from typing import Any

import anyio
import anyio.lowlevel
import msgspec
import pytest
from amqp.amqp_helpers import connections_on
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from support.waits import Seen, queue_exists

from ojs_anyio import amqp, events

from .bus_support import Names, take

pytestmark = pytest.mark.anyio


class RecordRead(msgspec.Struct):
    store: str
    id: int


# ---------------------------------------------------------------------- publish / subscribe


async def test_typed_handler_gets_structs_and_context(names: Names) -> None:
    seen = Seen()

    async def on_read(event: RecordRead, ctx: events.EventContext) -> None:  # typed by annotation
        seen.add((event, ctx))

    name = names.sub("rec.read")
    async with events.connect(names.url, **names.bus_options()) as bus, bus.subscribe(name, on_read):
        mid = await bus.publish("rec.read", RecordRead("mongo", 7))
        (event, ctx), *_ = await seen.wait(1)
    assert event == RecordRead("mongo", 7)
    assert ctx.message_id == mid and ctx.routing_key == "rec.read" and ctx.attempt == 1
    assert ctx.queue == f"{names.tag}rec.read"
    props = ctx.message.properties
    assert props.delivery_mode == 2 and props.content_type == "application/json"
    assert props.timestamp is not None


async def test_payload_type_argument_and_untyped_payloads(names: Names) -> None:
    typed, untyped, raw = Seen(), Seen(), Seen()

    async def on_typed(event: Any) -> None:
        typed.add(event)

    async def on_untyped(event: Any) -> None:
        untyped.add(event)

    async def on_raw(event: Any) -> None:
        raw.add(event)

    async with (
        events.connect(names.url, **names.bus_options()) as bus,
        bus.subscribe(names.sub("typed"), on_typed, payload_type=RecordRead),
        bus.subscribe(names.sub("untyped"), on_untyped),
        bus.subscribe(names.sub("raw"), on_raw, payload_type=bytes),
    ):
        await bus.publish("typed", {"store": "maria", "id": 1})  # a dict decodes into the Struct
        await bus.publish("untyped", {"a": [1, 2]})
        await bus.publish("untyped", b"\x00\x01 not json")
        await bus.publish("raw", RecordRead("x", 2))
        assert await typed.wait(1) == [RecordRead("maria", 1)]
        assert await untyped.wait(2) == [{"a": [1, 2]}, b"\x00\x01 not json"]
        assert await raw.wait(1) == [b'{"store":"x","id":2}']


async def test_unroutable_raises_unless_mandatory_is_off(names: Names) -> None:
    async with events.connect(names.url, **names.bus_options()) as bus:
        with pytest.raises(amqp.UnroutableError) as info:
            await bus.publish("nobody.listens", {"x": 1})
        assert info.value.routing_key == "nobody.listens"
        await bus.publish("nobody.listens", {"x": 1}, mandatory=False)  # dropped by the broker, no error
    async with events.connect(names.url, **names.bus_options(mandatory=False)) as bus:
        await bus.publish("nobody.listens", {"x": 1})


async def test_queues_are_declared_by_subscribers_not_at_connect(names: Names) -> None:
    queue = f"{names.tag}rel.read"

    async def handler(event: Any) -> None:
        pass

    async with events.connect(names.url, **names.bus_options()) as bus:
        assert not await queue_exists(names.url, queue)
        async with bus.subscribe(names.sub("rel.read"), handler, bindings=["*.read"]):
            assert await queue_exists(names.url, queue)
            assert await queue_exists(names.url, f"{queue}.dlq")
            await bus.publish("rec.read", {})  # routed through the wildcard binding
            await bus.publish("rel.read", {})


async def test_trace_context_is_propagated(names: Names) -> None:
    seen = Seen()

    async def handler(event: Any, ctx: events.EventContext) -> None:
        seen.add((ctx.headers, trace.get_current_span().get_span_context()))

    parent = SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0xB7AD6B7169203331,
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    async with (
        events.connect(names.url, **names.bus_options()) as bus,
        bus.subscribe(names.sub("traced"), handler),
    ):
        with trace.use_span(NonRecordingSpan(parent)):
            await bus.publish("traced", {"n": 1}, headers={"x-custom": "kept"})
        (headers, _current), *_ = await seen.wait(1)
    assert headers["traceparent"] == "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert headers["x-custom"] == "kept"


async def test_bulk_path_and_publisher_pool(names: Names) -> None:
    seen = Seen()

    async def handler(event: dict[str, int]) -> None:
        seen.add(event["i"])

    async with (
        events.connect(names.url, **names.bus_options(publisher_pool_size=3)) as bus,
        bus.subscribe(names.sub("bulk"), handler, concurrency=4),
    ):
        ids = await bus.publish_many(("bulk", {"i": i}) for i in range(500))
        assert len(set(ids)) == 500
        window = bus.publish_window(max_in_flight=16)
        for i in range(500, 600):
            await window.publish("bulk", {"i": i})
        assert await window.wait_all() == []
        window = bus.publish_window()
        lost = await window.publish("nobody.listens", {"i": -1})
        failed = await window.wait_all()
        assert [type(h.error) for h in failed] == [amqp.UnroutableError]
        assert failed[0].message_id == lost.message_id and failed[0].routing_key == "nobody.listens"

        async with anyio.create_task_group() as tg:  # 60 concurrent publishers over the pool
            for i in range(600, 660):
                tg.start_soon(bus.publish, "bulk", {"i": i})
        await seen.wait(660)
    assert sorted(seen.items) == list(range(660))


async def test_competing_instances_handle_each_event_once(names: Names) -> None:
    seen = Seen()

    def handler_for(instance: str) -> events.Handler:
        async def handler(event: dict[str, int]) -> None:
            seen.add((instance, event["i"]))
            await anyio.lowlevel.checkpoint()

        return handler

    name = names.sub("orb.operation")
    async with (
        events.connect(names.url, **names.bus_options()) as one,
        events.connect(names.url, **names.bus_options()) as two,
        one.subscribe(name, handler_for("a"), prefetch=4),
        two.subscribe(name, handler_for("b"), prefetch=4),
    ):
        await one.publish_many((name, {"i": i}) for i in range(300))
        await seen.wait(300)
    assert sorted(i for _, i in seen.items) == list(range(300))  # every event once, none twice
    assert {instance for instance, _ in seen.items} == {"a", "b"}  # both instances took part


async def test_subscription_limit_opens_more_connections(names: Names) -> None:
    seen = Seen()

    async def handler(event: dict[str, str], ctx: events.EventContext) -> None:
        seen.add((event["q"], ctx.message.channel))

    conn_name = f"ojs-test-ev-{names.tag}"
    async with (
        events.connect(
            names.url, **names.bus_options(max_subscriptions_per_connection=2, connection_name=conn_name)
        ) as bus,
        bus.subscribe(names.sub("pool"), handler, consumers=3),
    ):  # 2 + 1: two connections
        assert len(bus.subscriber_connections) == 2
        async with bus.subscribe(names.sub("one"), handler):  # fits on the second
            assert len(bus.subscriber_connections) == 2
            async with bus.subscribe(names.sub("two"), handler):  # a third one opens
                assert len(bus.subscriber_connections) == 3
                rows = await connections_on(names.url)
                ours = {
                    item[2]
                    for row in rows
                    for item in row.get("client_properties", [])
                    if item[0] == "connection_name" and str(item[2]).startswith(conn_name)
                }
                # nothing published yet: a subscriber-only bus has no publisher connection
                assert ours == {f"{conn_name}-sub-{i}" for i in (1, 2, 3)}
                with pytest.raises(amqp.UsageError, match="opens with the first publish"):
                    bus.publisher_connection  # noqa: B018
                await bus.publish_many([("pool", {"q": "pool"})] * 60 + [("two", {"q": "two"})])
                await seen.wait(61)
                assert bus.publisher_connection is not None  # opened by the first publish
    channels = {ch for q, ch in seen.items if q == "pool"}
    assert len(channels) >= 2  # the pool's consumers shared the events


# ---------------------------------------------------------------------- failures


async def test_backoff_timings_then_dead_letter_with_reason(names: Names) -> None:
    policy = events.RedeliveryPolicy(initial_interval=0.3, multiplier=2.0, max_interval=1.0, max_attempts=3)
    calls = Seen()

    async def failing(event: dict[str, int], ctx: events.EventContext) -> None:
        calls.add((anyio.current_time(), ctx.attempt, ctx.routing_key))
        raise RuntimeError(f"database down (try {ctx.attempt})")

    name = names.sub("rec.write")
    async with (
        events.connect(names.url, **names.bus_options()) as bus,
        bus.subscribe(name, failing, bindings=["rec.*"], redelivery=policy) as sub,
    ):
        mid = await bus.publish("rec.write", {"n": 1})
        await calls.wait(4)  # the first run and 3 redeliveries
        (dead,) = await take(names.url, sub.dead_letter_queue, 1)
        for ms in (policy.wait_ms(2), policy.wait_ms(3)):  # the wait queues of the ladder
            assert await queue_exists(names.url, sub.wait_queue_name(ms))
    times = [t for t, _, _ in calls.items]
    assert [a for _, a, _ in calls.items] == [1, 2, 3, 4]
    assert {k for _, _, k in calls.items} == {"rec.write"}  # the original key, also after a wait
    gaps = [b - a for a, b in itertools.pairwise(times)]
    expected = [policy.wait_ms(n) / 1000 for n in (1, 2, 3)]
    assert expected == [0.0, 0.63, 1.0]
    # Lower bounds strict (the TTL never fires early); upper bounds generous (a loaded machine).
    assert gaps[0] < 1.0, gaps  # immediate
    for gap, want in zip(gaps[1:], expected[1:], strict=True):
        assert want - 0.01 <= gap <= want + 3.0, (gaps, expected)
    headers = dead.properties.headers or {}
    assert dead.properties.message_id == mid
    assert headers[events.H_REASON] == "max_attempts"
    assert "RuntimeError: database down (try 4)" in headers[events.H_ERROR]
    assert headers[events.H_ATTEMPT] == 4
    assert headers[events.H_QUEUE] == sub.queue
    assert headers[events.H_ROUTING_KEY] == "rec.write"
    assert msgspec.json.decode(dead.body) == {"n": 1}
    assert sub.redelivered == 3 and sub.dead_lettered == 1


async def test_bad_payloads_are_dead_lettered_and_the_subscriber_keeps_running(names: Names) -> None:
    seen = Seen()

    async def handler(event: RecordRead) -> None:
        seen.add(event)

    async with (
        events.connect(names.url, **names.bus_options()) as bus,
        bus.subscribe(names.sub("rel.write"), handler) as sub,
    ):
        await bus.publish("rel.write", b"\xff not json")
        await bus.publish("rel.write", {"store": "maria"})  # JSON, but the id is missing
        await bus.publish("rel.write", RecordRead("maria", 3))
        assert await seen.wait(1) == [RecordRead("maria", 3)]
        dead = await take(names.url, sub.dead_letter_queue, 2)
    reasons = [(m.properties.headers or {})[events.H_REASON] for m in dead]
    assert reasons == ["invalid_payload", "invalid_payload"]
    errors = [(m.properties.headers or {})[events.H_ERROR] for m in dead]
    assert "DecodeError" in errors[0] and "ValidationError" in errors[1] and "id" in errors[1]
    assert [m.body for m in dead] == [b"\xff not json", b'{"store":"maria"}']  # kept as they were


async def test_dead_letter_exception_skips_redelivery(names: Names) -> None:
    calls = Seen()

    async def handler(event: dict[str, int]) -> None:
        calls.add(event)
        raise events.DeadLetter("not for us")

    async with (
        events.connect(names.url, **names.bus_options()) as bus,
        bus.subscribe(names.sub("adm"), handler) as sub,
    ):
        await bus.publish("adm", {"n": 1})
        (dead,) = await take(names.url, sub.dead_letter_queue, 1)
    headers = dead.properties.headers or {}
    assert headers[events.H_REASON] == "rejected" and "not for us" in headers[events.H_ERROR]
    assert len(calls.items) == 1 and sub.redelivered == 0


async def test_a_redelivered_event_can_succeed(names: Names) -> None:
    calls = Seen()

    async def flaky(event: dict[str, int], ctx: events.EventContext) -> None:
        calls.add(ctx.attempt)
        if ctx.attempt < 3:
            raise ConnectionError("temporarily unavailable")

    policy = events.RedeliveryPolicy(initial_interval=0.1, multiplier=1.0, max_interval=0.1, max_attempts=5)
    outcomes = Seen()
    async with (
        events.connect(names.url, **names.bus_options(redelivery=policy)) as bus,
        bus.subscribe(names.sub("mig"), flaky) as sub,
    ):
        sub.add_listener(lambda outcome, msg: outcomes.add(outcome))
        await bus.publish("mig", {"n": 1})
        await outcomes.wait(3)
    assert outcomes.items == ["redelivered", "redelivered", "handled"]
    assert calls.items == [1, 2, 3] and sub.dead_lettered == 0


async def test_leaving_the_block_lets_running_handlers_finish(names: Names) -> None:
    started, finished = Seen(), Seen()

    async def slow(event: dict[str, int]) -> None:
        started.add(event["i"])
        if event["i"] == 1:
            await anyio.sleep_forever()  # outlives the grace period: cancelled, comes again
        await anyio.sleep(0.3)
        finished.add(event["i"])

    name = names.sub("graceful")
    async with events.connect(names.url, **names.bus_options()) as bus:
        async with bus.subscribe(name, slow, concurrency=2, prefetch=2, grace_period=1.0):
            await bus.publish(name, {"i": 0})
            await bus.publish(name, {"i": 1})
            await started.wait(2)
        # The first handler finished and acked after the block was left; the second did not.
        assert finished.items == [0]
        async with amqp.connect(names.url) as conn, conn.channel() as ch:
            info = await ch.queue_declare(f"{names.tag}{name}", passive=True)
        assert info.message_count == 1  # the cancelled one is back in the queue


async def test_spans_follow_the_messaging_conventions_and_name_the_event(
    names: Names, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from ojs_anyio.events import _wire

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(_wire, "tracer", provider.get_tracer("ojs_anyio.events"))
    seen = Seen()

    async def handler(event: dict[str, int]) -> None:
        seen.add(event["n"])

    async with (
        events.connect(names.url, **names.bus_options()) as bus,
        bus.subscribe(names.sub("rec.read"), handler),
    ):
        await bus.publish("rec.read", {"n": 1})
        await seen.wait(1)
    provider.shutdown()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    send, process = spans["send event rec.read"], spans["process event rec.read"]
    assert send.attributes is not None and process.attributes is not None
    assert send.attributes["messaging.operation.type"] == "send"
    assert process.attributes["messaging.operation.type"] == "process"
    assert process.parent is not None and send.context is not None
    assert process.parent.span_id == send.context.span_id


async def test_settlements_get_spans_in_the_publishers_trace(
    names: Names, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each settlement is a CLIENT span ``{ack|reject} event {key}`` with
    ``messaging.operation.type`` ``settle``, in the publisher's trace, and says what it meant:
    a redelivery's ack, a handled event's ack, a dead letter's ack."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from ojs_anyio.events import _wire

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(_wire, "tracer", provider.get_tracer("ojs_anyio.events"))

    async def handler(event: dict[str, int], ctx: events.EventContext) -> None:
        if event["n"] == 2:
            raise events.DeadLetter("not for us")
        if ctx.attempt == 1:
            raise ConnectionError("once")

    policy = events.RedeliveryPolicy(initial_interval=0.05, max_interval=0.05, max_attempts=3)
    outcomes = Seen()
    async with (
        events.connect(names.url, **names.bus_options(redelivery=policy)) as bus,
        bus.subscribe(names.sub("set.tle"), handler) as sub,
    ):
        sub.add_listener(lambda outcome, msg: outcomes.add((outcome, msg.properties.message_id)))
        await bus.publish("set.tle", {"n": 1})
        await outcomes.wait(2)
        await bus.publish("set.tle", {"n": 2})
        await outcomes.wait(3)
    provider.shutdown()
    finished = exporter.get_finished_spans()
    sends = {s.context.trace_id: s for s in finished if s.name == "send event set.tle" and s.context}
    settles = [
        s for s in finished if s.attributes and s.attributes.get("messaging.operation.type") == "settle"
    ]
    assert [(s.name, s.attributes and s.attributes["ojs.outcome"]) for s in settles] == [
        ("ack event set.tle", "redelivered"),
        ("ack event set.tle", "handled"),
        ("ack event set.tle", "dead_lettered"),
    ]
    for span in settles:
        assert span.kind is trace.SpanKind.CLIENT and span.context is not None
        assert span.context.trace_id in sends  # the publisher's trace
        assert span.attributes is not None and span.attributes["messaging.operation.name"] == "ack"
        assert span.attributes["messaging.destination.name"] == sub.queue
