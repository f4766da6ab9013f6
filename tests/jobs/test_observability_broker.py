"""Observability on the real broker: W3C trace context across a round trip (001 §12.2,
DECISIONS 10) and the ``ojs_amqp_*`` metrics (001 §12.1), read through the OpenTelemetry SDK.

Traces: each test gets its own SDK ``TracerProvider`` (``InMemorySpanExporter`` +
``SimpleSpanProcessor``) and patches ``ojs_anyio.jobs._tracing.tracer`` with a tracer from
it, so no global tracer provider leaks into other tests (``test_push_broker`` checks the
API's no-SDK behaviour).  Metrics: the instruments of ``ojs_anyio.amqp._metrics`` are
created from the API's proxy meter when the first connection is made, so the SDK
``MeterProvider`` (with an ``InMemoryMetricReader``) is installed globally, once per session; counters are
process-wide, so every check compares values before and after a known workload.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from harness import FaultProxy
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, StatusCode, TraceFlags, TraceState
from support.cleanup import Cleanup

import ojs_anyio as ojs
from ojs_anyio import amqp
from ojs_anyio.amqp import _metrics
from ojs_anyio.jobs import _tracing

from .broker_support import WAIT, Outcomes, current_url, running

pytestmark = pytest.mark.anyio


# ------------------------------------------------------------------------- fixtures


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """An SDK tracer for the job layer, for this test only; yields its span exporter."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(_tracing, "tracer", provider.get_tracer("ojs_anyio.jobs"))
    yield exporter
    provider.shutdown()


_READER: InMemoryMetricReader | None = None


@pytest.fixture(autouse=True)
def fresh_queue_labels() -> None:
    """The label set is process-wide and stops growing at MAX_QUEUE_LABELS: earlier tests
    in the same process (thousands of queues) must not decide this test's labels."""
    _metrics.queues.clear()


@pytest.fixture(scope="session")
def metric_reader() -> InMemoryMetricReader:
    """The session's SDK MeterProvider, installed globally once (the API proxies the
    instruments ``_metrics`` created to it)."""
    global _READER
    if _READER is None:
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        _READER = reader
    assert _metrics.timing_enabled()
    return _READER


def _queue_of(point: Any) -> object:
    """The queue of a point: ``queue`` (001 §12.1's instruments) or
    ``messaging.destination.name`` (OpenTelemetry's ``messaging.client.*`` ones)."""
    attributes = point.attributes
    return attributes.get("queue", attributes.get("messaging.destination.name"))


class Snapshot:
    """One collection of the ``ojs_anyio.amqp`` meter: values by (metric, queue)."""

    def __init__(self, reader: InMemoryMetricReader) -> None:
        self.points: dict[str, list[Any]] = {}
        data = reader.get_metrics_data()
        assert data is not None
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                if sm.scope.name != "ojs_anyio.amqp":
                    continue
                for metric in sm.metrics:
                    self.points.setdefault(metric.name, []).extend(metric.data.data_points)

    def value(self, name: str, queue: str | None = None) -> float:
        """A counter's or gauge's value (for ``queue``; 0 when it has no point)."""
        for point in self.points.get(name, []):
            if queue is None or _queue_of(point) == queue:
                return float(point.value)
        return 0.0

    def histogram(self, name: str, queue: str) -> HistogramDataPoint | None:
        for point in self.points.get(name, []):
            if _queue_of(point) == queue:
                assert isinstance(point, HistogramDataPoint)
                return point
        return None


def job_spans(exporter: InMemorySpanExporter, operation: str, queue: str) -> list[ReadableSpan]:
    """The ``send`` (PRODUCER) or ``process`` (CONSUMER) spans of the jobs of ``queue``."""
    return [
        s
        for s in exporter.get_finished_spans()
        if s.attributes is not None
        and s.attributes.get("messaging.operation.type") == operation
        and s.attributes.get("ojs.job.queue") == queue
    ]


# --------------------------------------------------------------------------- traces


async def test_consumer_span_is_child_of_producer_span(
    client: ojs.Client, q: str, spans: InMemorySpanExporter
) -> None:
    """push inside a parent span → PRODUCER span (child of the parent) → broker → the
    worker's CONSUMER span, a child of the PRODUCER span in the same trace.  The message
    carries the producer span's traceparent in x-ojs-trace-id and x-ojs-traceparent, and
    the parent's tracestate in x-ojs-trace-state."""
    tracer = _tracing.tracer
    worker = ojs.Worker(queues=[q])
    outcomes = Outcomes(worker)
    seen: list[amqp.IncomingMessage] = []

    @worker.handler("traced.job")
    async def handler(ctx: ojs.JobContext) -> None:
        seen.append(ctx.message)

    # A remote parent with a tracestate, as if this push ran inside an incoming request.
    remote = SpanContext(
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", "opaque-1")]),
    )
    async with running(worker, client):
        with trace.use_span(NonRecordingSpan(remote)), tracer.start_as_current_span("request") as parent:
            with anyio.fail_after(WAIT):
                job = await client.push("traced.job", [], queue=q)
        await outcomes.wait_final(job.id)

    [producer] = job_spans(spans, "send", q)
    [consumer] = job_spans(spans, "process", q)
    pctx, cctx = producer.context, consumer.context
    assert producer.kind is SpanKind.PRODUCER and consumer.kind is SpanKind.CONSUMER
    assert producer.parent is not None and producer.parent.span_id == parent.get_span_context().span_id
    assert pctx.trace_id == remote.trace_id
    assert cctx.trace_id == pctx.trace_id  # same trace, across the broker
    assert consumer.parent is not None and consumer.parent.span_id == pctx.span_id
    assert consumer.parent.is_remote
    assert cctx.trace_state.get("vendor") == "opaque-1"

    h = seen[0].properties.headers or {}
    traceparent = f"00-{pctx.trace_id:032x}-{pctx.span_id:016x}-01"
    assert h["x-ojs-trace-id"] == traceparent  # 001 §12.2
    assert h["x-ojs-traceparent"] == traceparent  # DECISIONS 10
    assert h["x-ojs-trace-state"] == "vendor=opaque-1"

    assert producer.attributes is not None and consumer.attributes is not None
    assert producer.attributes["messaging.system"] == "rabbitmq"
    assert producer.attributes["messaging.operation.type"] == "send"
    assert (producer.name, consumer.name) == ("send job traced.job", "process job traced.job")
    assert producer.attributes["messaging.destination.name"] == client.names.direct_exchange
    assert producer.attributes["messaging.rabbitmq.destination.routing_key"] == q
    assert producer.attributes["messaging.message.id"] == job.id
    assert consumer.attributes["messaging.system"] == "rabbitmq"
    assert consumer.attributes["messaging.operation.type"] == "process"
    assert consumer.attributes["messaging.destination.name"] == q
    assert consumer.attributes["messaging.message.id"] == job.id
    assert consumer.attributes["ojs.job.type"] == "traced.job"
    assert consumer.attributes["ojs.job.attempt"] == 1


async def test_no_trace_state_header_without_tracestate(
    client: ojs.Client, q: str, spans: InMemorySpanExporter
) -> None:
    """Without a tracestate there is no x-ojs-trace-state; the traceparent headers still are."""
    worker = ojs.Worker(queues=[q])
    outcomes = Outcomes(worker)
    seen: list[amqp.IncomingMessage] = []

    @worker.handler("traced.job")
    async def handler(ctx: ojs.JobContext) -> None:
        seen.append(ctx.message)

    async with running(worker, client):
        with _tracing.tracer.start_as_current_span("request"), anyio.fail_after(WAIT):
            job = await client.push("traced.job", [], queue=q)
        await outcomes.wait_final(job.id)
    h = seen[0].properties.headers or {}
    [producer] = job_spans(spans, "send", q)
    assert h["x-ojs-trace-id"] == h["x-ojs-traceparent"]
    assert h["x-ojs-trace-id"].split("-")[2] == f"{producer.context.span_id:016x}"
    assert "x-ojs-trace-state" not in h


async def test_retried_attempts_join_the_original_trace(
    client: ojs.Client, q: str, spans: InMemorySpanExporter
) -> None:
    """A job failing once then succeeding: both attempts' CONSUMER spans are children of
    the one PRODUCER span (the retry republishes the original trace headers)."""
    worker = ojs.Worker(queues=[q])
    outcomes = Outcomes(worker)
    policy = ojs.RetryPolicy(max_attempts=2, initial_interval="PT0.1S", jitter=False)

    @worker.handler("flaky.job")
    async def handler(ctx: ojs.JobContext) -> None:
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")

    async with running(worker, client):
        with _tracing.tracer.start_as_current_span("request"), anyio.fail_after(WAIT):
            job = await client.push("flaky.job", [], queue=q, retry=policy)
        final = await outcomes.wait_final(job.id)
    assert final.outcome == "completed" and final.attempt == 2

    [producer] = job_spans(spans, "send", q)
    consumers = sorted(job_spans(spans, "process", q), key=lambda s: s.start_time or 0)
    assert len(consumers) == 2
    for span, attempt in zip(consumers, (1, 2), strict=True):
        assert span.context.trace_id == producer.context.trace_id
        assert span.parent is not None and span.parent.span_id == producer.context.span_id
        assert span.attributes is not None and span.attributes["ojs.job.attempt"] == attempt
    assert consumers[0].status.status_code is StatusCode.ERROR  # the first attempt failed
    assert consumers[1].status.status_code is StatusCode.UNSET


async def test_settlements_get_spans_in_the_producers_trace(
    client: ojs.Client, q: str, spans: InMemorySpanExporter
) -> None:
    """Each settlement is a CLIENT span ``{ack|nack} job {type}`` (``messaging.operation.type``
    ``settle``) in the producer's trace, saying what it meant: the retry's ack, the final
    ack, and the Nack of a job that is dead-lettered."""
    worker = ojs.Worker(queues=[q])
    outcomes = Outcomes(worker)
    policy = ojs.RetryPolicy(max_attempts=2, initial_interval="PT0.1S", jitter=False)

    @worker.handler("flaky.job")
    async def flaky(ctx: ojs.JobContext) -> None:
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")

    @worker.handler("doomed.job")
    async def doomed(ctx: ojs.JobContext) -> None:
        raise RuntimeError("always fails")

    async with running(worker, client):
        with anyio.fail_after(WAIT):
            ok = await client.push("flaky.job", [], queue=q, retry=policy)
            dead = await client.push("doomed.job", [], queue=q, retry=ojs.RetryPolicy(max_attempts=1))
        await outcomes.wait_final(ok.id)
        await outcomes.wait_final(dead.id)

    settles = sorted(job_spans(spans, "settle", q), key=lambda s: s.start_time or 0)
    seen = {
        (s.name, s.attributes["messaging.operation.name"], s.attributes["ojs.outcome"])
        for s in settles
        if s.attributes is not None
    }
    assert seen == {
        ("ack job flaky.job", "ack", "retried"),
        ("ack job flaky.job", "ack", "completed"),
        ("nack job doomed.job", "nack", "dead_lettered"),
    }
    producers = {s.attributes["messaging.message.id"]: s for s in job_spans(spans, "send", q) if s.attributes}
    for span in settles:
        assert span.kind is SpanKind.CLIENT and span.attributes is not None
        job_id = span.attributes["messaging.message.id"]
        assert span.context.trace_id == producers[job_id].context.trace_id


async def test_tracing_middleware_is_outermost_and_follows_pushes_from_handlers(
    client: ojs.Client, q: str, spans: InMemorySpanExporter
) -> None:
    """With a tracer provider the worker puts :class:`ojs.Tracing` first: a user middleware
    runs inside the CONSUMER span, and a job pushed from the handler joins the trace (its
    PRODUCER span is a child of the CONSUMER span, and its own CONSUMER span a child of that)."""
    seen_in_middleware: list[int] = []

    class Peek(ojs.Middleware):
        async def around_handler(self, ctx: ojs.JobContext, call_next: Any) -> Any:
            seen_in_middleware.append(trace.get_current_span().get_span_context().span_id)
            return await call_next()

    worker = ojs.Worker(queues=[q], middleware=[Peek()])
    outcomes = Outcomes(worker)

    @worker.handler("parent.job")
    async def parent_job(ctx: ojs.JobContext) -> None:
        await client.push("child.job", [], queue=q)

    @worker.handler("child.job")
    async def child_job(ctx: ojs.JobContext) -> None:
        return None

    async with running(worker, client):
        with _tracing.tracer.start_as_current_span("request"), anyio.fail_after(WAIT):
            job = await client.push("parent.job", [], queue=q)
        await outcomes.wait_final(job.id)
        await outcomes.wait_for(lambda o: o.type == "child.job" and o.outcome == "completed")
    producers = sorted(job_spans(spans, "send", q), key=lambda s: s.start_time or 0)
    consumers = sorted(job_spans(spans, "process", q), key=lambda s: s.start_time or 0)
    assert len(producers) == 2 and len(consumers) == 2
    trace_ids = {s.context.trace_id for s in producers + consumers}
    assert len(trace_ids) == 1  # one trace from the first push to the child's handler
    first_consumer, child_consumer = consumers
    assert producers[1].parent is not None and producers[1].parent.span_id == first_consumer.context.span_id
    assert child_consumer.parent is not None and child_consumer.parent.span_id == producers[1].context.span_id
    assert sorted(seen_in_middleware) == sorted(c.context.span_id for c in consumers)


async def test_worker_tracing_false_records_no_consumer_span(
    client: ojs.Client, q: str, spans: InMemorySpanExporter
) -> None:
    """``Worker(tracing=False)``: no CONSUMER span, though a provider is installed (the
    producer still traces its push)."""
    worker = ojs.Worker(queues=[q], tracing=False)
    outcomes = Outcomes(worker)

    @worker.handler("untraced.job")
    async def handler(ctx: ojs.JobContext) -> None:
        return None

    async with running(worker, client):
        with anyio.fail_after(WAIT):
            job = await client.push("untraced.job", [], queue=q)
        await outcomes.wait_final(job.id)
    assert len(job_spans(spans, "send", q)) == 1
    assert job_spans(spans, "process", q) == []


# -------------------------------------------------------------------------- metrics


async def test_metrics_publish_consume_ack_nack_by_queue(
    metric_reader: InMemoryMetricReader, raw: amqp.Connection, unique: Any
) -> None:
    """Publish 50, consume them (50 unacked: unacked gauge 50, utilization 50/100), ack 40,
    nack 10: the counters move by exactly that for the queue, the gauges go back to 0, and
    the confirm-latency histogram has samples for it."""
    queue = unique("metrics")
    before = Snapshot(metric_reader)
    with anyio.fail_after(WAIT):
        async with raw.channel() as ch:
            await ch.queue_declare(queue, exclusive=True)
            window = ch.publish_window()
            for i in range(50):
                await window.publish(b"m%d" % i, routing_key=queue)
            assert await window.wait_all() == []
            held: list[amqp.IncomingMessage] = []
            async with ch.consume(queue, prefetch=100) as messages:
                async for msg in messages:
                    held.append(msg)
                    if len(held) == 50:
                        break
                during = Snapshot(metric_reader)
                for msg in held[:40]:
                    await msg.ack()
                for msg in held[40:]:
                    await msg.nack(requeue=False)
                after = Snapshot(metric_reader)

    def delta(name: str) -> float:
        return after.value(name, queue) - before.value(name, queue)

    assert delta("ojs_amqp_messages_published_total") == 50
    assert delta("ojs_amqp_messages_consumed_total") == 50
    assert delta("ojs_amqp_messages_acked_total") == 40
    assert delta("ojs_amqp_messages_nacked_total") == 10
    assert during.value("ojs_amqp_messages_unacked", queue) == 50
    assert during.value("ojs_amqp_consumer_utilization", queue) == pytest.approx(0.5)
    assert after.value("ojs_amqp_messages_unacked", queue) == 0
    assert after.value("ojs_amqp_consumer_utilization", queue) == 0.0
    hist_before = before.histogram("ojs_amqp_publish_confirm_latency_seconds", queue)
    hist_after = after.histogram("ojs_amqp_publish_confirm_latency_seconds", queue)
    assert hist_before is None
    # Sampled (at most one per Basic.Ack frame and per millisecond): 1 to 50 samples.
    assert hist_after is not None and 1 <= hist_after.count <= 50
    assert 0 < hist_after.sum / hist_after.count < WAIT
    # The same counts under OpenTelemetry's messaging names and attributes.
    assert delta("messaging.client.sent.messages") == 50
    assert delta("messaging.client.consumed.messages") == 50
    sent = next(
        p.attributes for p in after.points["messaging.client.sent.messages"] if _queue_of(p) == queue
    )
    assert sent == {
        "messaging.system": "rabbitmq",
        "messaging.operation.name": "publish",
        "messaging.destination.name": queue,
    }
    operation = after.histogram("messaging.client.operation.duration", queue)
    assert operation is not None and operation.count == hist_after.count


async def test_metrics_basic_get_counts_under_its_queue(
    metric_reader: InMemoryMetricReader, raw: amqp.Connection, unique: Any
) -> None:
    """Basic.Get: consumed/acked/nacked and unacked count under the queue given to get."""
    queue = unique("get")
    with anyio.fail_after(WAIT):
        async with raw.channel() as ch:
            await ch.queue_declare(queue, exclusive=True)
            for i in range(3):
                await ch.publish(b"g%d" % i, routing_key=queue)
            before = Snapshot(metric_reader)
            got = [await ch.get(queue) for _ in range(3)]
            during = Snapshot(metric_reader)
            assert all(m is not None for m in got)
            await got[0].ack()  # type: ignore[union-attr]
            await got[1].ack()  # type: ignore[union-attr]
            await got[2].reject(requeue=False)  # type: ignore[union-attr]
            after = Snapshot(metric_reader)
    assert during.value("ojs_amqp_messages_unacked", queue) == 3
    assert during.value("ojs_amqp_consumer_utilization", queue) == 0.0  # no prefetch window
    assert after.value("ojs_amqp_messages_unacked", queue) == 0
    for name, n in (
        ("ojs_amqp_messages_consumed_total", 3),
        ("ojs_amqp_messages_acked_total", 2),
        ("ojs_amqp_messages_nacked_total", 1),
    ):
        assert after.value(name, queue) - before.value(name, queue) == n, name


async def test_metrics_connections_and_channels_active(
    metric_reader: InMemoryMetricReader, broker_url: str
) -> None:
    """A connection counts in ojs_amqp_connections_active from its handshake until it
    closes; a channel in ojs_amqp_channels_active while open."""
    base = Snapshot(metric_reader)
    with anyio.fail_after(WAIT):
        async with amqp.connect(current_url()) as conn:
            opened = Snapshot(metric_reader)
            async with conn.channel():
                with_channel = Snapshot(metric_reader)
            without_channel = Snapshot(metric_reader)
    closed = Snapshot(metric_reader)
    conns = "ojs_amqp_connections_active"
    chans = "ojs_amqp_channels_active"
    assert opened.value(conns) == base.value(conns) + 1
    assert with_channel.value(chans) == base.value(chans) + 1
    assert without_channel.value(chans) == base.value(chans)
    assert closed.value(conns) == base.value(conns)


async def test_metrics_worker_utilization_and_job_acks(
    metric_reader: InMemoryMetricReader, client: ojs.Client, q: str
) -> None:
    """A worker with concurrency 2 and both handlers busy: utilization of ojs.queue.{q} is
    1.0 and 2 deliveries are unacked; after they complete, 2 more acks and utilization 0."""
    jq = client.names.job_queue(q)
    worker = ojs.Worker(queues=[q], concurrency=2)
    outcomes = Outcomes(worker)
    release = anyio.Event()
    busy = 0
    both_busy = anyio.Event()

    @worker.handler("slow.job")
    async def handler(ctx: ojs.JobContext) -> None:
        nonlocal busy
        busy += 1
        if busy == 2:
            both_busy.set()
        await release.wait()

    async with running(worker, client):
        idle = Snapshot(metric_reader)
        jobs = [await client.push("slow.job", [], queue=q) for _ in range(2)]
        with anyio.fail_after(WAIT):
            await both_busy.wait()
        full = Snapshot(metric_reader)
        release.set()
        await outcomes.wait_for(lambda o: o.outcome == "completed", count=len(jobs))
        done = Snapshot(metric_reader)
    assert idle.value("ojs_amqp_consumer_utilization", jq) == 0.0
    assert full.value("ojs_amqp_consumer_utilization", jq) == 1.0
    assert full.value("ojs_amqp_messages_unacked", jq) == 2
    assert done.value("ojs_amqp_consumer_utilization", jq) == 0.0

    def delta(name: str, queue: str) -> float:
        return done.value(name, queue) - idle.value(name, queue)

    assert delta("ojs_amqp_messages_acked_total", jq) == 2
    assert delta("ojs_amqp_messages_consumed_total", jq) == 2
    assert delta("ojs_amqp_messages_published_total", q) == 2


@pytest.mark.rabbitmq_only("the fault proxy cuts a TCP connection: memory:// has no socket")
async def test_metrics_across_a_reconnect(
    metric_reader: InMemoryMetricReader, cleanup: Cleanup, unique: Any
) -> None:
    """A connection cut under 5 unacked deliveries: ojs_amqp_reconnections_total + 1 and
    ojs_amqp_connections_active back where it was once recovered; the 5 stale deliveries
    stop counting as unacked and the 5 redeliveries count instead (unacked 5, not 10,
    consumed + 10); acking the redeliveries acks 5, the stale acks count nothing."""
    queue = cleanup.queue(unique("recon"))
    policy = amqp.RecoveryPolicy(initial_delay=0.01, max_delay=0.1, jitter=0.1)
    conns = "ojs_amqp_connections_active"
    async with FaultProxy() as proxy:
        with anyio.fail_after(WAIT):
            async with (
                amqp.connect(proxy.url(), recovery=policy) as conn,
                conn.subscribe() as events,
                conn.channel() as ch,
            ):
                await ch.queue_declare(queue)
                for i in range(5):
                    await ch.publish(b"r%d" % i, routing_key=queue)
                async with ch.consume(queue, prefetch=10) as messages:
                    first = [await messages.__anext__() for _ in range(5)]
                    before = Snapshot(metric_reader)
                    assert before.value("ojs_amqp_messages_unacked", queue) == 5
                    proxy.cut_all()
                    async for ev in events:
                        if isinstance(ev, amqp.ConnectionRecovered):
                            break
                    again = [await messages.__anext__() for _ in range(5)]
                    assert all(m.redelivered for m in again)
                    recovered = Snapshot(metric_reader)
                    for msg in first:
                        with pytest.raises(amqp.StaleDeliveryError):
                            await msg.ack()
                    for msg in again:
                        await msg.ack()
                    acked = Snapshot(metric_reader)
        closed = Snapshot(metric_reader)

    assert recovered.value("ojs_amqp_reconnections_total") >= before.value("ojs_amqp_reconnections_total") + 1
    assert recovered.value(conns) == before.value(conns)
    assert closed.value(conns) == before.value(conns) - 1
    assert recovered.value("ojs_amqp_messages_unacked", queue) == 5
    assert acked.value("ojs_amqp_messages_unacked", queue) == 0
    assert acked.value("ojs_amqp_messages_consumed_total", queue) == 10
    assert acked.value("ojs_amqp_messages_acked_total", queue) == 5


async def test_dead_letter_reason_in_span_and_metric(
    client: ojs.Client, q: str, spans: InMemorySpanExporter, metric_reader: InMemoryMetricReader
) -> None:
    """A Nack cannot carry the final reason, so the worker records it: a ``{q} dead_letter``
    span in the job's trace (ojs.error.code / ojs.error.message, status ERROR) and the
    per-job-type counters (the worker adds JobMetrics when an SDK is installed):
    ojs_jobs_dead_lettered_total and ojs_jobs_failed_total{error.type}."""
    worker = ojs.Worker(queues=[q])
    outcomes = Outcomes(worker)

    @worker.handler("doomed.job")
    async def handler(ctx: ojs.JobContext) -> None:
        raise ojs.Discard("no longer wanted")

    async with running(worker, client):
        job = await client.push("doomed.job", [], queue=q)
        assert (await outcomes.wait_final(job.id)).outcome == "dead_lettered"
    by_name = {s.name: s for s in spans.get_finished_spans()}
    dead = by_name[f"{q} dead_letter"]
    [producer] = job_spans(spans, "send", q)
    assert dead.attributes is not None
    assert dead.attributes["ojs.error.code"] == "DISCARDED"
    assert dead.attributes["ojs.error.message"] == "no longer wanted"
    assert dead.attributes["messaging.message.id"] == job.id
    assert dead.status.status_code is StatusCode.ERROR
    assert dead.context is not None and dead.context.trace_id == producer.context.trace_id
    data = metric_reader.get_metrics_data()
    assert data is not None
    attrs = {"messaging.system": "rabbitmq", "messaging.destination.name": q, "ojs.job.type": "doomed.job"}

    def counted(name: str, **extra: str) -> list[int]:
        return [
            point.value
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            if sm.scope.name == "ojs_anyio.jobs"
            for metric in sm.metrics
            if metric.name == name
            for point in metric.data.data_points
            if point.attributes == {**attrs, **extra}
        ]

    assert counted("ojs_jobs_dead_lettered_total") == [1]
    assert counted("ojs_jobs_failed_total", **{"error.type": "DISCARDED"}) == [1]
