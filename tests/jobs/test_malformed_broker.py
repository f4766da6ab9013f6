"""Deliveries with a malformed content header (``IncomingMessage.malformed``) in front of
good messages, against RabbitMQ, on asyncio and Trio: the job worker dead-letters each
one with INVALID_PAYLOAD and its reason, the control relay and handler drop them with a
WARNING, the INFO and result reply readers skip them, and every good message behind them
is processed, on a connection that never reconnects.

The hostile messages are published by pika (tests/harness/hostile.py).  Before the codec
decoded delivered headers leniently, the first of them closed the worker's connection,
and it came first again after every reconnect: no job behind it ever ran.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

import anyio
import pytest
from harness.hostile import HOSTILE, publish, with_frame_max

import ojs_anyio as ojs
from ojs_anyio import amqp

from .broker_support import WAIT, Outcomes, running, wait_message_count

pytestmark = [pytest.mark.anyio, pytest.mark.rabbitmq_only("a foreign client (pika) publishes the messages")]


@pytest.fixture
async def small_frames(broker_url: str) -> AsyncIterator[ojs.Client]:
    """A client whose frame_max (4096) is below the large-header case's header."""
    async with ojs.connect(with_frame_max(broker_url)) as c:
        yield c


def _job_body(job_id: str, q: str) -> bytes:
    """A valid job envelope: only the header is wrong."""
    return json.dumps(
        {"specversion": "1.0", "id": job_id, "type": "ok.job", "queue": q, "args": [],
         "created_at": "2026-01-01T00:00:00Z"}
    ).encode()  # fmt: skip


async def _publish(url: str, messages: list[tuple[str, str, bytes, object]]) -> None:
    with anyio.fail_after(WAIT):
        await anyio.to_thread.run_sync(publish, url, messages)


async def test_the_worker_dead_letters_malformed_jobs_and_runs_every_job_behind_them(
    small_frames: ojs.Client, raw: amqp.Connection, broker_url: str, q: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = small_frames
    names = client.names
    await client.declare_queue(q)
    await _publish(
        broker_url,
        [
            (
                names.direct_exchange,
                q,
                _job_body(f"poison-{h.name}", q),
                h.pika_properties(message_id=f"poison-{h.name}"),
            )
            for h in HOSTILE
        ],
    )
    with anyio.fail_after(WAIT):
        good = [(await client.push("ok.job", [i], queue=q)).id for i in range(20)]
    worker = ojs.Worker(queues=[q], concurrency=4)
    outcomes = Outcomes(worker)
    ran: list[str] = []

    @worker.handler("ok.job")
    async def handler(ctx: ojs.JobContext, *args: int) -> None:
        ran.append(ctx.id)

    with caplog.at_level(logging.ERROR, logger="ojs_anyio.worker"):
        async with running(worker, client):
            for job_id in good:
                assert (await outcomes.wait_final(job_id)).outcome == "completed"
            dead = await outcomes.wait_for(lambda o: o.outcome == "dead_lettered", count=len(HOSTILE))
            # still consuming: a job pushed now runs too
            with anyio.fail_after(WAIT):
                later = (await client.push("ok.job", [], queue=q)).id
            assert (await outcomes.wait_final(later)).outcome == "completed"
    assert sorted(ran) == sorted([*good, later])  # no poison job ran
    assert len(dead) == len(HOSTILE)
    for case in HOSTILE:
        (outcome,) = [o for o in dead if o.error_message is not None and case.reason in o.error_message]
        assert outcome.error_code == "INVALID_PAYLOAD"
        assert outcome.error_message.startswith("malformed message: ")
        assert outcome.id == ("\\xff\\xfeid" if case.name == "message-id" else f"poison-{case.name}")
        assert outcome.queue == q
        assert any(case.reason in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)
    # Dead-lettered by the broker (Basic.Nack, requeue=false) into the DLQ; nothing left behind.
    await wait_message_count(raw, names.dlx_queue(q), len(HOSTILE))
    await wait_message_count(raw, names.job_queue(q), 0)
    assert client.conn.reconnections == 0


async def test_the_control_plane_and_the_reply_readers_skip_malformed_messages(
    small_frames: ojs.Client, raw: amqp.Connection, broker_url: str, q: str, caplog: pytest.LogCaptureFixture
) -> None:
    """CANCEL/INFO/BEAT reach workers through the durable control queue (relayed) and the
    broadcast exchange (handled); replies come back to the client's INFO and result
    queues.  Malformed messages on each path are settled (acked, or consumed with no_ack)
    with a WARNING, and the good messages behind them still work."""
    client = small_frames
    names = client.names
    worker = ojs.Worker(queues=[q], concurrency=2)
    started = anyio.Event()
    release = anyio.Event()

    @worker.handler("slow.job")
    async def slow(ctx: ojs.JobContext) -> str:
        started.set()
        await release.wait()
        return "done"

    def poison(exchange: str, routing_key: str, what: str) -> list[tuple[str, str, bytes, object]]:
        return [
            (exchange, routing_key, b'{"job_id": "x"}', h.pika_properties(message_id=f"{what}-{h.name}"))
            for h in HOSTILE
        ]

    with caplog.at_level(logging.WARNING):
        async with running(worker, client):
            # The result reader's queue first: malformed "results" in front of the real one.
            reply_to = await client._result_router().reply_to()
            await _publish(broker_url, poison("", reply_to, "result"))
            with anyio.fail_after(WAIT):
                pending = await client.push_for_result("slow.job", [], queue=q)
                await started.wait()
            # The durable control queue (relayed by every worker) and the broadcast
            # exchange (read by each worker's handler), then a good INFO through both.
            await _publish(broker_url, poison("", names.control_queue(q), "relayed"))
            await _publish(broker_url, poison(names.control_exchange, q, "broadcast"))
            with anyio.fail_after(WAIT):
                info = await client.info(pending.id, queue=q, timeout=WAIT)
            assert info.state == "active"
            # The INFO reply queue now exists: malformed replies there, then INFO again.
            assert client.control.reply_queue is not None
            await _publish(broker_url, poison("", client.control.reply_queue, "info"))
            with anyio.fail_after(WAIT):
                assert (await client.info(pending.id, queue=q, timeout=WAIT)).state == "active"
            release.set()
            with anyio.fail_after(WAIT):
                assert await pending.result(timeout=WAIT) == "done"
    await wait_message_count(raw, names.control_queue(q), 0)  # acked, not left behind
    texts = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    control_queue = names.control_queue(q)
    for case in HOSTILE:
        dropped = [t for t in texts if t.startswith("dropping control message") and case.reason in t]
        # once by the relay (from the durable control queue), once by the handler (from
        # the worker's own queue, bound to the broadcast exchange)
        assert len(dropped) == 2 and len([t for t in dropped if f"from {control_queue}:" in t]) == 1, dropped
        assert any("ignoring a job result reply" in t and case.reason in t for t in texts), case.name
        assert any("ignoring an INFO reply" in t and case.reason in t for t in texts), case.name
    assert client.conn.reconnections == 0


async def test_dead_letters_peek_shows_malformed_jobs_and_requeue_leaves_them(
    small_frames: ojs.Client, raw: amqp.Connection, broker_url: str, q: str
) -> None:
    """``client.dead_letters(q)``: ``peek`` gives each malformed message with its reason;
    ``requeue`` moves the others and puts the malformed ones back, in order."""
    client = small_frames
    names = client.names
    await client.declare_queue(q)
    dlq = names.dlx_queue(q)
    await _publish(
        broker_url, [("", dlq, b"{}", h.pika_properties(message_id=f"bad-{h.name}")) for h in HOSTILE]
    )
    with anyio.fail_after(WAIT):
        async with raw.channel() as ch:
            await ch.publish(
                _job_body("good-1", q), routing_key=dlq, properties=amqp.BasicProperties(message_id="good-1")
            )
        peeked = await client.dead_letters(q).peek()
    assert [job.id for job in peeked] == [
        *("\\xff\\xfeid" if h.name == "message-id" else f"bad-{h.name}" for h in HOSTILE),
        "good-1",
    ]
    for case, job in zip(HOSTILE, peeked[:-1], strict=True):
        assert job.malformed is not None and case.reason in job.malformed, case.name
    assert peeked[-1].malformed is None
    with anyio.fail_after(WAIT):
        assert await client.dead_letters(q).requeue() == 1
        assert [job.id for job in await client.dead_letters(q).peek()] == [
            job.id for job in peeked[:-1]
        ]
    await wait_message_count(raw, names.job_queue(q), 1)
