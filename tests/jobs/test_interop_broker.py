"""Interop with plain pika, on vhost ``/ojs`` as in 001's examples (DECISIONS 12).

The §15.1 (publish) and §15.3 (retry topology) snippets run as written, in a worker
thread, with two substitutions only: the queue name ``'email'`` becomes a fresh one, and
``uuid.uuid7()`` (Python 3.14+) becomes ``uuid6.uuid7()``.  Both orders are checked:
pika first then our worker (our declarations must be equivalent to theirs), and our
client first then the snippets (theirs must be equivalent to ours: no 406).
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.to_thread
import pika
import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from support.brokers import RABBITMQ_HOST, RABBITMQ_PORT
from support.cleanup import Cleanup

import ojs_anyio as ojs
from ojs_anyio.jobs._dedup import lock_queue

from .broker_support import OJS_VHOST, WAIT, Outcomes, running

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.rabbitmq_only("plain pika connects over TCP: memory:// has no socket"),
]


# fmt: off
def spec_15_1_publish(queue_name: str) -> str:
    """001 §15.1, verbatim but for the queue name and uuid7; returns the job id."""
    import json
    from datetime import datetime, timezone

    import uuid6

    conn = pika.BlockingConnection(pika.ConnectionParameters(host='localhost', virtual_host='/ojs'))
    ch = conn.channel()
    ch.confirm_delivery()

    # Declare topology (idempotent)
    ch.exchange_declare(exchange='ojs.exchange.direct', exchange_type='direct', durable=True)
    ch.exchange_declare(exchange='ojs.exchange.dlx', exchange_type='direct', durable=True)
    ch.queue_declare(queue=f'ojs.queue.{queue_name}', durable=True, arguments={
        'x-dead-letter-exchange': 'ojs.exchange.dlx',
        'x-dead-letter-routing-key': queue_name,
        'x-max-priority': 10,
    })
    ch.queue_bind(queue=f'ojs.queue.{queue_name}', exchange='ojs.exchange.direct', routing_key=queue_name)

    job_id = str(uuid6.uuid7())
    job = {
        "id": job_id, "type": "email.send", "queue": queue_name,
        "args": ["user@example.com", "welcome"],
        "created_at": datetime.now(timezone.utc).isoformat(),  # noqa: UP017 - as in the spec
    }

    ch.basic_publish(
        exchange='ojs.exchange.direct', routing_key=queue_name,
        body=json.dumps(job), mandatory=True,
        properties=pika.BasicProperties(
            message_id=job_id, type='email.send',
            content_type='application/openjobspec+json', content_encoding='utf-8',
            delivery_mode=2, app_id='ojs',
            timestamp=int(datetime.now(timezone.utc).timestamp()),  # noqa: UP017
            headers={'x-ojs-queue': queue_name, 'x-ojs-attempt': 1, 'x-ojs-max-attempts': 5},
        ),
    )
    conn.close()
    return job_id


def spec_15_3_retry_topology(queue_name: str) -> None:
    """001 §15.3, verbatim but for the queue name."""
    conn = pika.BlockingConnection(pika.ConnectionParameters(host='localhost', virtual_host='/ojs'))
    ch = conn.channel()
    ch.exchange_declare(exchange='ojs.exchange.retry', exchange_type='direct', durable=True)

    delays_ms = [1000, 2000, 4000, 8000, 16000, 32000, 60000]

    for delay in delays_ms:
        retry_queue = f'ojs.queue.retry.{queue_name}.{delay}'
        ch.queue_declare(queue=retry_queue, durable=True, arguments={
            'x-dead-letter-exchange': 'ojs.exchange.direct',
            'x-dead-letter-routing-key': queue_name,
            'x-message-ttl': delay,
        })
        ch.queue_bind(queue=retry_queue, exchange='ojs.exchange.retry',
                      routing_key=f'{queue_name}.{delay}')
    conn.close()


# fmt: on


def pika_basic_get(queue: str) -> tuple[Any, Any, bytes]:
    """One message from ``queue`` with plain pika (Basic.Get, then ack)."""
    conn = pika.BlockingConnection(
        pika.ConnectionParameters(host=RABBITMQ_HOST, port=RABBITMQ_PORT, virtual_host="/ojs")
    )
    try:
        ch = conn.channel()
        method, properties, body = ch.basic_get(queue=queue, auto_ack=False)
        assert method is not None, f"{queue} is empty"
        ch.basic_ack(delivery_tag=method.delivery_tag)
        return method, properties, body
    finally:
        conn.close()


async def test_spec_snippets_first_then_our_worker(ojs_vhost: str, spec_queue: str) -> None:
    """§15.3 then §15.1 with pika; then our worker (declaring its own topology over
    theirs, without conflict) runs the job, and retries it through a §15.3 retry queue."""
    q = spec_queue
    with anyio.fail_after(WAIT):
        await anyio.to_thread.run_sync(spec_15_3_retry_topology, q)
        job_id = await anyio.to_thread.run_sync(spec_15_1_publish, q)

    worker = ojs.Worker(queues=[q])
    outcomes = Outcomes(worker)
    calls: list[tuple[int, int, list[Any]]] = []

    @worker.handler("email.send")
    async def send_email(ctx: ojs.JobContext, to: str, template: str) -> None:
        calls.append((ctx.attempt, ctx.max_attempts, [to, template]))
        if ctx.attempt == 1:
            raise ojs.Retry("smtp busy", delay=1.0)  # 1000 ms: one of §15.3's queues

    async with ojs.connect(ojs_vhost) as client, running(worker, client):
        final = await outcomes.wait_final(job_id)
    assert final.outcome == "completed", final
    retried = outcomes.matching(lambda o: o.outcome == "retried")
    assert [o.delay_ms for o in retried] == [1000]
    assert calls == [(1, 5, ["user@example.com", "welcome"]), (2, 5, ["user@example.com", "welcome"])]


async def test_our_declarations_first_then_spec_snippets_and_pika_consumer(
    ojs_vhost: str, spec_queue: str, cleanup: Cleanup
) -> None:
    """Our client declares first; §15.3 and §15.1 then run unchanged (no 406).  A job pushed
    by our client is read by a plain pika consumer with every property and header of
    001 §6 that applies to it; the pika-published job is run by our worker."""
    q = spec_queue
    cleanup.queue(lock_queue("", f"digest-2026-w07-{q}"), url=ojs_vhost)
    trace_id, span_id = 0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    span = NonRecordingSpan(SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(1)))
    async with ojs.connect(ojs_vhost) as client:
        with anyio.fail_after(WAIT):
            await client.declare_queue(q)
            for delay in (1000, 2000, 60000):  # on our ladder and in §15.3's list
                await client.declare_retry_queue(q, delay)
            await anyio.to_thread.run_sync(spec_15_3_retry_topology, q)
            with trace.use_span(span):
                ours = await client.push(
                    "email.send",
                    ["ops@example.com", "digest"],
                    queue=q,
                    priority=6,
                    meta={"tags": ["weekly", "ops"]},
                    idempotency_key=f"digest-2026-w07-{q}",  # unique per run (remembered 24 h)
                    retry=ojs.RetryPolicy(max_attempts=4),
                )
            theirs = await anyio.to_thread.run_sync(spec_15_1_publish, q)
            # Ours has AMQP priority 6, theirs none (0): the pika consumer gets ours first.
            method, props, body = await anyio.to_thread.run_sync(pika_basic_get, f"ojs.queue.{q}")

        assert method.exchange == "ojs.exchange.direct" and method.routing_key == q
        assert props.message_id == ours.id
        assert props.type == "email.send"
        assert props.content_type == "application/openjobspec+json"
        assert props.content_encoding == "utf-8"
        assert props.delivery_mode == 2
        assert props.app_id == "ojs"
        assert props.priority == 6  # 0..9 kept as is
        assert isinstance(ours.created_at, str)
        assert props.timestamp == int(ojs.jobs._envelope.parse_timestamp(ours.created_at).timestamp())
        h = props.headers
        assert h["x-ojs-queue"] == q
        assert h["x-ojs-attempt"] == 1 and type(h["x-ojs-attempt"]) is int
        assert h["x-ojs-max-attempts"] == 4 and type(h["x-ojs-max-attempts"]) is int
        assert h["x-ojs-created-at"] == ours.created_at
        assert isinstance(h["x-ojs-enqueued-at"], str) and h["x-ojs-enqueued-at"] >= ours.created_at
        assert h["x-ojs-tags"] == "weekly,ops"
        assert h["x-ojs-idempotency-key"] == f"digest-2026-w07-{q}"
        assert h["x-ojs-trace-id"] == traceparent
        assert ojs.decode_job(body) == ours

        worker = ojs.Worker(queues=[q])
        outcomes = Outcomes(worker)
        seen: list[list[Any]] = []

        @worker.handler("email.send")
        async def send_email(ctx: ojs.JobContext, to: str, template: str) -> None:
            seen.append([to, template])

        async with running(worker, client):
            assert (await outcomes.wait_final(theirs)).outcome == "completed"
        assert seen == [["user@example.com", "welcome"]]
    assert OJS_VHOST == "/ojs"
