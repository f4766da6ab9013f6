"""PUSH on the real broker: the message as the broker delivers it (001 §5.1, §6), confirms,
unroutable jobs, batches.

AMQP-005/010/011/012/013/015/018 (message), 014 (confirms: QUEUE_FULL), 015/016 (mandatory,
Basic.Return → UnroutableJobError), 022's header (x-ojs-scheduled-at), 023's headers
(x-ojs-trace-id), push_batch.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import anyio
import msgspec
import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from support.cleanup import Cleanup

import ojs_anyio as ojs
from ojs_anyio import amqp
from ojs_anyio.jobs._dedup import lock_queue
from ojs_anyio.jobs._envelope import parse_timestamp

from .broker_support import WAIT, current_url, header_type, peek_raw, wait_message_count

pytestmark = pytest.mark.anyio

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
SPAN_ID = 0x00F067AA0BA902B7
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def consume_one(conn: amqp.Connection, queue: str) -> amqp.IncomingMessage:
    """The next message of ``queue`` through Basic.Consume, acked."""
    with anyio.fail_after(WAIT):
        async with conn.channel(confirms=False) as ch, ch.consume(queue, prefetch=1) as messages:
            msg = await messages.__anext__()
            await msg.ack()
    return msg


async def test_amqp_005_010_011_012_013_015_018_message_as_delivered(
    client: ojs.Client, raw: amqp.Connection, q: str, cleanup: Cleanup
) -> None:
    """A pushed job, consumed raw: exchange and routing key (005), every property of
    001 §6.1 (010 content_type, 011 delivery_mode 2, 012 message_id), every header of
    §6.2 that applies (018 x-ojs-attempt as int 1), the body is the job as JSON (013)."""
    retry = ojs.RetryPolicy(max_attempts=5)
    cleanup.queue(lock_queue("", f"order-42-{q}"))  # the key's lock queue
    span = NonRecordingSpan(SpanContext(TRACE_ID, SPAN_ID, is_remote=False, trace_flags=TraceFlags(1)))
    with trace.use_span(span), anyio.fail_after(WAIT):
        job = await client.push(
            "email.send",
            ["user@example.com", "welcome"],
            queue=q,
            priority=7,
            retry=retry,
            meta={"tags": ["billing", "vip"], "tenant": "acme", "correlation_id": "order-42-flow"},
            idempotency_key=f"order-42-{q}",  # unique per run: a key is remembered for 24 h
        )
    before_consume = datetime.now(UTC)
    msg = await consume_one(raw, client.names.job_queue(q))

    assert msg.exchange == "ojs.exchange.direct"  # AMQP-005
    assert msg.routing_key == q
    p = msg.properties
    assert p.message_id == job.id  # AMQP-012
    assert p.type == "email.send"
    assert p.content_type == "application/openjobspec+json"  # AMQP-010
    assert p.content_encoding == "utf-8"
    assert p.delivery_mode == 2  # AMQP-011
    assert p.app_id == "ojs"
    assert p.priority == 7  # 0..9 kept as is
    assert p.correlation_id == "order-42-flow"  # from meta.correlation_id (001 §6.1)
    assert isinstance(job.created_at, str)
    created = parse_timestamp(job.created_at)
    assert p.timestamp == created.replace(microsecond=0)

    h = p.headers or {}
    assert h["x-ojs-queue"] == q
    assert h["x-ojs-attempt"] == 1 and type(h["x-ojs-attempt"]) is int  # AMQP-018
    assert h["x-ojs-max-attempts"] == 5 and type(h["x-ojs-max-attempts"]) is int
    assert h["x-ojs-created-at"] == job.created_at
    enqueued = parse_timestamp(h["x-ojs-enqueued-at"])
    assert created <= enqueued <= before_consume
    assert h["x-ojs-tags"] == "billing,vip"
    assert h["x-ojs-idempotency-key"] == f"order-42-{q}"
    assert h["x-ojs-trace-id"] == TRACEPARENT  # 001 §12.2
    assert h["x-ojs-traceparent"] == TRACEPARENT  # DECISIONS 10
    assert "x-ojs-scheduled-at" not in h
    assert "x-ojs-error-code" not in h and "x-ojs-error-message" not in h

    decoded = ojs.decode_job(msg.body)  # AMQP-013
    assert decoded == job
    assert decoded.args == ["user@example.com", "welcome"]
    assert decoded.retry == retry


async def test_scheduled_job_carries_scheduled_at(client: ojs.Client, raw: amqp.Connection, q: str) -> None:
    """A job scheduled 0.3 s ahead arrives in ojs.queue.{q} through the delay levels, with
    x-ojs-scheduled-at (001 §6.2) and routing key {q}, not before its time."""
    with anyio.fail_after(WAIT):
        job = await client.push("report.build", [], queue=q, delay=timedelta(milliseconds=300))
    msg = await consume_one(raw, client.names.job_queue(q))
    arrived = datetime.now(UTC)
    assert isinstance(job.scheduled_at, str)
    assert msg.properties.headers is not None
    assert msg.properties.headers["x-ojs-scheduled-at"] == job.scheduled_at
    assert msg.routing_key == q
    assert arrived >= parse_timestamp(job.scheduled_at)
    assert ojs.decode_job(msg.body).id == job.id


async def test_amqp_014_confirms_queue_full(raw: amqp.Connection, q: str) -> None:
    """AMQP-014: publishes are confirmed, so a queue at x-max-length=1 with
    x-overflow=reject-publish answers the second push with a nack → QueueFullError
    (QUEUE_FULL, DECISIONS 8) and the queue still holds exactly one job."""
    options = ojs.QueueOptions(max_length=1, overflow="reject-publish")
    with anyio.fail_after(WAIT):
        async with ojs.connect(current_url(), queue_options=options) as client:
            first = await client.push("a.job", [1], queue=q)
            with pytest.raises(ojs.QueueFullError) as info:
                await client.push("a.job", [2], queue=q)
            err = info.value
            assert err.code == "QUEUE_FULL"
            assert err.queue == q
            assert err.job_id != first.id
            assert "QUEUE_FULL" in str(err) and q in str(err)
            # The channel is still usable, and the broker kept the first job only.
            info2 = await (await client.channel()).queue_declare(client.names.job_queue(q), passive=True)
            assert info2.message_count == 1
            with pytest.raises(ojs.QueueFullError):
                await client.push("a.job", [3], queue=q)
        msg = await consume_one(raw, ojs.Names().job_queue(q))
        assert msg.properties.message_id == first.id


async def test_amqp_015_016_unroutable_push_raises(client: ojs.Client, raw: amqp.Connection, q: str) -> None:
    """AMQP-015/016: pushes are mandatory and Basic.Return is handled.  The queue is deleted
    behind the client's back (it still believes it declared it): the push raises
    UnroutableJobError naming the queue, instead of the job vanishing."""
    with anyio.fail_after(WAIT):
        await client.declare_queue(q)
        async with raw.channel(confirms=False) as ch:
            await ch.queue_delete(client.names.job_queue(q))
        with pytest.raises(ojs.UnroutableJobError) as info:
            await client.push("lost.job", [], queue=q)
        err = info.value
        assert err.code == "UNROUTABLE"
        assert err.queue == q
        assert q in str(err)
        # The client recovers: once the queue exists again, pushes go through.
        async with raw.channel(confirms=False) as ch:
            args = {
                "x-dead-letter-exchange": "ojs.exchange.dlx",
                "x-dead-letter-routing-key": q,
                "x-max-priority": 10,
            }
            await ch.queue_declare(client.names.job_queue(q), durable=True, arguments=args)
            await ch.queue_bind(client.names.job_queue(q), "ojs.exchange.direct", q)
        await client.push("found.job", [], queue=q)
        await wait_message_count(raw, client.names.job_queue(q), 1)


async def test_push_batch_2000_jobs_all_confirmed(client: ojs.Client, raw: amqp.Connection, q: str) -> None:
    """push_batch: 2,000 jobs pipelined, every one confirmed, one result per job in order."""
    jobs = [client.build("bulk.job", [i], queue=q) for i in range(2000)]
    with anyio.fail_after(WAIT):
        results = await client.push_batch(jobs)
    assert len(results) == 2000
    assert [r.job.id for r in results] == [j.id for j in jobs]
    assert all(r.ok and r.error is None for r in results)
    await wait_message_count(raw, client.names.job_queue(q), 2000)


async def test_push_batch_reports_failure_per_job(
    client: ojs.Client, raw: amqp.Connection, new_queue: Callable[..., str]
) -> None:
    """A batch mixing a routable and an unroutable queue: only the jobs of the bad queue
    fail (UnroutableJobError), the others are confirmed and enqueued."""
    good, bad = new_queue(), new_queue()
    with anyio.fail_after(WAIT):
        await client.declare_queue(bad)
        async with raw.channel(confirms=False) as ch:
            await ch.queue_delete(client.names.job_queue(bad))
        jobs = [client.build("mixed.job", [i], queue=good if i % 3 else bad) for i in range(300)]
        results = await client.push_batch(jobs)
    assert [r.job.id for r in results] == [j.id for j in jobs]
    for r in results:
        if r.job.queue == good:
            assert r.ok, r.error
        else:
            assert isinstance(r.error, ojs.UnroutableJobError)
            assert r.error.queue == bad and r.error.job_id == r.job.id
    await wait_message_count(raw, client.names.job_queue(good), 200)


async def test_priority_only_when_given_clamped_never_refused_attempt_headers_int32(
    client: ojs.Client, q: str
) -> None:
    """No priority: no AMQP priority property (001 §6.1 "if specified") and no
    correlation_id.  0..9 kept; 150 becomes 9 and -5 becomes 0, both accepted.  The attempt
    headers are int32 (type code ``I``) in the bytes on the wire."""
    with anyio.fail_after(WAIT):
        # max_attempts set by the job: x-ojs-max-attempts travels, as int32
        plain = await client.push("p.job", [], queue=q, retry=ojs.RetryPolicy(max_attempts=4))
        msg, wire = await peek_raw(client.names.job_queue(q))
        assert msg.properties.message_id == plain.id
        assert msg.properties.priority is None and msg.properties.correlation_id is None
        assert header_type(wire, "x-ojs-attempt") == header_type(wire, "x-ojs-max-attempts") == "I"
        assert (msg.properties.headers or {})["x-ojs-max-attempts"] == 4
    async with client.conn.channel(confirms=False) as ch:
        await ch.queue_purge(client.names.job_queue(q))
    for given, expected in ((150, 9), (-5, 0), (3, 3)):
        with anyio.fail_after(WAIT):
            job = await client.push("p.job", [], queue=q, priority=given)
            assert job.priority == given
            msg, _ = await peek_raw(client.names.job_queue(q))
            assert (msg.properties.message_id, msg.properties.priority) == (job.id, expected)
        async with client.conn.channel(confirms=False) as ch:
            await ch.queue_purge(client.names.job_queue(q))


@pytest.mark.anyio
async def test_push_returns_the_job_as_enqueued(client: ojs.Client, q: str) -> None:
    """enqueued_at, created_at and state, as the OJS conformance suite reads a PUSH's answer."""
    before = datetime.now(UTC) - timedelta(seconds=1)
    ready = await client.push("a.job", [1], queue=q)
    later = await client.push("a.job", [2], queue=q, delay=3600)
    [batched] = await client.push_batch([client.build("a.job", [3], queue=q)])
    after = datetime.now(UTC) + timedelta(seconds=1)
    assert ready.state == "available" and later.state == "scheduled"
    assert batched.ok and batched.job.state == "available"
    for job in (ready, later, batched.job):
        assert isinstance(job.enqueued_at, str) and isinstance(job.created_at, str)
        assert before <= datetime.fromisoformat(job.enqueued_at) <= after
    # A job built elsewhere without created_at is created as it is enqueued; one with it keeps it.
    bare = msgspec.structs.replace(client.build("a.job", [4], queue=q), created_at=msgspec.UNSET)
    made = msgspec.structs.replace(client.build("a.job", [5], queue=q), created_at="2020-01-02T03:04:05Z")
    pushed_bare, pushed_made = await client.push_job(bare), await client.push_job(made)
    assert pushed_bare.created_at == pushed_bare.enqueued_at
    assert pushed_made.created_at == "2020-01-02T03:04:05Z" != pushed_made.enqueued_at
    assert (pushed_bare.id, pushed_bare.args, pushed_made.args) == (bare.id, [4], [5])
    assert bare.created_at is msgspec.UNSET and bare.enqueued_at is msgspec.UNSET  # the input is not changed
