"""The worker on the real broker: FETCH/ACK (AMQP-006/007/008), dead letters (009), retry
(017, 018), handler verdicts, bad input, unknown attributes, graceful shutdown.

Every wait is on a :class:`JobOutcome` (or, for the broker's own dead-lettering hop, on
the DLQ's message count), bounded by ``anyio.fail_after``.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import ojs_anyio as ojs
from ojs_anyio import amqp
from ojs_anyio.jobs._retry import resolve_retry, retry_queue_delay_ms

from .broker_support import (
    WAIT,
    Outcomes,
    bindings_to,
    both,
    consumer_facts,
    current_url,
    header_type,
    peek_raw,
    queue_facts,
    running,
    wait_message_count,
)

pytestmark = pytest.mark.anyio


class Boom(BaseException):
    """Not an Exception: what a badly behaved handler might raise."""


class PaymentDeclined(Exception):
    pass


PaymentDeclined.__module__ = "billing.errors"  # its OJS error type: billing.errors.PaymentDeclined


async def dead_jobs(client: ojs.Client, raw: amqp.Connection, q: str, count: int) -> dict[str, ojs.DeadJob]:
    """Wait until ojs.queue.dlx.{q} holds ``count`` jobs; peek them, by job id."""
    await wait_message_count(raw, client.names.dlx_queue(q), count)
    with anyio.fail_after(WAIT):
        peeked = await client.dead_letters(q).peek()
    assert len(peeked) == count
    return {d.id or "": d for d in peeked}


# ------------------------------------------------------------- AMQP-006 / 007 / 008


async def test_amqp_006_007_008_prefetch_manual_ack(client: ojs.Client, raw: amqp.Connection, q: str) -> None:
    """AMQP-006/007: Basic.Consume with no_ack=false after Basic.Qos(prefetch=concurrency):
    with every handler blocked, the broker has handed out exactly ``concurrency`` jobs,
    unacknowledged, and holds the rest.  AMQP-008: success acks (the queue ends empty)."""
    concurrency = 3
    worker = ojs.Worker(queues=[q], concurrency=concurrency)
    outcomes = Outcomes(worker)
    release = anyio.Event()
    all_busy = anyio.Event()
    running_now = 0

    @worker.handler("block.job")
    async def handler(ctx: ojs.JobContext, i: int) -> None:
        nonlocal running_now
        running_now += 1
        if running_now == concurrency:
            all_busy.set()
        await release.wait()

    jq = client.names.job_queue(q)
    async with running(worker, client):
        jobs = [await client.push("block.job", [i], queue=q) for i in range(7)]
        with anyio.fail_after(WAIT):
            await all_busy.wait()
            all_facts, consumers = await both(queue_facts(jq), consumer_facts(jq))
        facts = all_facts[jq]
        assert running_now == concurrency
        assert facts["messages_unacknowledged"] == concurrency
        assert facts["messages_ready"] == len(jobs) - concurrency
        assert len(consumers) == 1
        assert consumers[0]["ack_required"] is True  # no_ack=false
        assert consumers[0]["prefetch_count"] == concurrency
        release.set()
        await outcomes.wait_for(lambda o: o.outcome == "completed", count=len(jobs))
    # run() returned, so the worker's channel is closed: anything it had not acked would be
    # back in the queue now.
    with anyio.fail_after(WAIT):
        async with raw.channel(confirms=False) as ch:
            assert (await ch.queue_declare(jq, passive=True)).message_count == 0
    assert {o.id for o in outcomes.items} == {j.id for j in jobs}
    assert all(o.attempt == 1 for o in outcomes.items)


# ------------------------------------------------------------------------ AMQP-009


async def test_amqp_009_discard_lands_in_dlq_with_reason(
    client: ojs.Client, raw: amqp.Connection, q: str, caplog: pytest.LogCaptureFixture
) -> None:
    """AMQP-009: a discarded job is Basic.Nack(requeue=false)-ed into ojs.queue.dlx.{q}:
    exactly one copy, x-death says "rejected" from ojs.queue.{q}, the message is the one
    pushed (attempt headers still int32 on the wire), nothing went back to the job queue,
    and the reason is in the worker's log line and outcome."""
    caplog.set_level(logging.INFO, logger="ojs_anyio.worker")
    worker = ojs.Worker(queues=[q])
    outcomes = Outcomes(worker)

    @worker.handler("spam.job")
    async def handler(ctx: ojs.JobContext) -> None:
        raise ojs.Discard("looks like spam")

    async with running(worker, client):
        job = await client.push("spam.job", [], queue=q, retry=ojs.RetryPolicy(max_attempts=2))
        final = await outcomes.wait_final(job.id)
        assert (final.outcome, final.error_code, final.error_message) == (
            "dead_lettered",
            "DISCARDED",
            "looks like spam",
        )
        await wait_message_count(raw, client.names.dlx_queue(q), 1)
    msg, wire = await peek_raw(client.names.dlx_queue(q))
    with anyio.fail_after(WAIT):
        async with raw.channel(confirms=False) as ch:
            assert (await ch.queue_declare(client.names.job_queue(q), passive=True)).message_count == 0
            assert (await ch.queue_declare(client.names.dlx_queue(q), passive=True)).message_count == 1
    h = msg.properties.headers or {}
    assert msg.properties.message_id == job.id
    assert msg.exchange == "ojs.exchange.dlx" and msg.routing_key == q
    deaths = h["x-death"]
    assert len(deaths) == 1
    assert deaths[0]["reason"] == "rejected"
    assert deaths[0]["queue"] == client.names.job_queue(q)
    assert "x-ojs-error-code" not in h and "x-ojs-dead-letter" not in h  # the message as pushed
    assert header_type(wire, "x-ojs-attempt") == header_type(wire, "x-ojs-max-attempts") == "I"
    assert ojs.decode_job(msg.body) == job
    assert any(
        f"job {job.id}" in r.getMessage() and "code=DISCARDED: looks like spam" in r.getMessage()
        for r in caplog.records
    )


# ---------------------------------------------------------------- AMQP-017 / 018


async def test_amqp_017_018_retry_via_ttl_queue_and_timing(
    client: ojs.Client, raw: amqp.Connection, q: str
) -> None:
    """A job failing twice then succeeding runs 3 times.  The retries go through
    ojs.queue.retry.{q}.{ms} (exactly the arguments of 001 §8.2, bound on
    ojs.exchange.retry with key {q}.{ms}), after the ladder delays of its policy; each
    retry carries x-ojs-attempt + 1 and the error headers, and keeps the rest (001 §8.3)."""
    policy = ojs.RetryPolicy(max_attempts=3, initial_interval="PT0.2S", backoff_coefficient=2.0, jitter=False)
    rungs = [retry_queue_delay_ms(resolve_retry(policy), n, random.Random(0)) for n in (1, 2)]
    assert rungs == [200, 500]  # 200 ms, then 400 ms rounded onto the ladder
    worker = ojs.Worker(queues=[q])
    outcomes = Outcomes(worker)
    seen: list[tuple[float, amqp.IncomingMessage, int]] = []

    @worker.handler("flaky.job")
    async def handler(ctx: ojs.JobContext, x: int) -> None:
        seen.append((time.monotonic(), ctx.message, ctx.attempt))
        if len(seen) < 3:
            raise RuntimeError(f"failure {len(seen)}")

    names = client.names
    async with running(worker, client):
        job = await client.push("flaky.job", [7], queue=q, retry=policy, meta={"tags": ["t1"]}, priority=10)
        final = await outcomes.wait_final(job.id)
    assert final.outcome == "completed" and final.attempt == 3
    retried = outcomes.matching(lambda o: o.outcome == "retried")
    assert [o.delay_ms for o in retried] == rungs
    assert [o.attempt for o in retried] == [1, 2]
    assert [o.error_code for o in retried] == ["HANDLER_ERROR"] * 2
    assert [c[2] for c in seen] == [1, 2, 3]

    # Timing: each gap is at least the rung (TTL), and not much more.
    for (t0, _, _), (t1, _, _), rung in zip(seen[:-1], seen[1:], rungs, strict=True):
        gap_ms = (t1 - t0) * 1000
        assert rung - 20 <= gap_ms <= rung + 700, (gap_ms, rung)

    # The deliveries: attempt and error headers updated, everything else kept.
    first, second, third = (c[1] for c in seen)
    for msg, attempt, error in ((second, 2, "failure 1"), (third, 3, "failure 2")):
        h = msg.properties.headers or {}
        assert h["x-ojs-attempt"] == attempt and type(h["x-ojs-attempt"]) is int
        assert h["x-ojs-error-code"] == "HANDLER_ERROR"
        assert h["x-ojs-error-message"] == f"RuntimeError: {error}"
        assert msg.exchange == names.direct_exchange and msg.routing_key == q  # dead-lettered back
        for key in (
            "x-ojs-queue",
            "x-ojs-max-attempts",
            "x-ojs-created-at",
            "x-ojs-enqueued-at",
            "x-ojs-tags",
        ):
            assert h[key] == (first.properties.headers or {})[key], key
        for prop in (
            "message_id",
            "type",
            "content_type",
            "content_encoding",
            "timestamp",
            "delivery_mode",
            "app_id",
            "priority",
        ):
            assert getattr(msg.properties, prop) == getattr(first.properties, prop), prop
        assert msg.body == first.body

    # AMQP-017: the retry queues, as the broker has them.
    retry_queues = [names.retry_queue(q, ms) for ms in rungs]
    with anyio.fail_after(WAIT):
        facts, bindings = await both(queue_facts(*retry_queues), bindings_to(*retry_queues))
    for name, ms in zip(retry_queues, rungs, strict=True):
        assert facts[name]["durable"] is True
        assert facts[name]["auto_delete"] is False and facts[name]["exclusive"] is False
        assert facts[name]["arguments"] == {
            "x-dead-letter-exchange": "ojs.exchange.direct",
            "x-dead-letter-routing-key": q,
            "x-message-ttl": ms,
        }
        assert bindings[name] == {("ojs.exchange.retry", f"{q}.{ms}")}
        async with raw.channel(confirms=False) as ch:  # and equivalence, by redeclaring
            await ch.queue_declare(name, durable=True, arguments=facts[name]["arguments"])


async def test_exhausted_job_ends_in_dlq_with_error_headers(
    client: ojs.Client, raw: amqp.Connection, q: str
) -> None:
    """A job that always fails runs max_attempts times, then is Nacked into the DLQ, where
    DeadLetters.peek shows the error of the last retry (the headers of 001 §6.2) and the
    attempt headers are int32 on the wire; the final reason is in the outcome."""
    policy = ojs.RetryPolicy(max_attempts=3, initial_interval="PT0.1S", jitter=False)
    worker = ojs.Worker(queues=[q])
    outcomes = Outcomes(worker)
    attempts: list[int] = []

    @worker.handler("doomed.job")
    async def handler(ctx: ojs.JobContext) -> None:
        attempts.append(ctx.attempt)
        raise RuntimeError("always")

    async with running(worker, client):
        job = await client.push("doomed.job", [], queue=q, retry=policy)
        final = await outcomes.wait_final(job.id)
        dead = await dead_jobs(client, raw, q, 1)
    assert attempts == [1, 2, 3]
    assert (final.outcome, final.attempt, final.error_code) == ("dead_lettered", 3, "HANDLER_ERROR")
    assert "retries exhausted" in (final.error_message or "")
    d = dead[job.id]
    # The final reason, from the worker's death note; the message itself still carries the
    # last retry's headers (a Nack adds none).
    assert (d.error_code, d.error_message, d.death_reason, d.noted) == (
        "HANDLER_ERROR",
        "RuntimeError: always (attempt 3 of 3, retries exhausted)",
        "rejected",
        True,
    )
    assert d.headers["x-ojs-error-message"] == "RuntimeError: always"
    assert d.attempt == 3
    _, wire = await peek_raw(client.names.dlx_queue(q))
    assert header_type(wire, "x-ojs-attempt") == header_type(wire, "x-ojs-max-attempts") == "I"
    assert d.type == "doomed.job"
    assert ojs.decode_job(d.body) == job


async def test_non_retryable_errors_exact_and_prefix(
    client: ojs.Client, raw: amqp.Connection, q: str
) -> None:
    """non_retryable_errors: an exact error type and a "prefix.*" entry send the job to the
    DLQ on its first failure with NON_RETRYABLE_ERROR; an unlisted error is retried.  (With
    the opt-in annotated dead letters, so the DLQ copies carry the final reason.)"""
    policy = ojs.RetryPolicy(
        max_attempts=2,
        initial_interval="PT0.1S",
        jitter=False,
        non_retryable_errors=("ValueError", "billing.*"),
    )
    worker = ojs.Worker(queues=[q], annotate_dead_letters=True)
    outcomes = Outcomes(worker)
    errors: dict[str, type[Exception]] = {"exact": ValueError, "prefix": PaymentDeclined, "other": KeyError}
    calls: dict[str, int] = {}

    @worker.handler("fails.job")
    async def handler(ctx: ojs.JobContext, kind: str) -> None:
        calls[kind] = calls.get(kind, 0) + 1
        raise errors[kind](kind)

    async with running(worker, client):
        jobs = {kind: await client.push("fails.job", [kind], queue=q, retry=policy) for kind in errors}
        finals = {kind: await outcomes.wait_final(job.id) for kind, job in jobs.items()}
        dead = await dead_jobs(client, raw, q, 3)
    assert calls == {"exact": 1, "prefix": 1, "other": 2}
    assert finals["exact"].error_code == finals["prefix"].error_code == "NON_RETRYABLE_ERROR"
    assert finals["other"].error_code == "HANDLER_ERROR"
    assert dead[jobs["exact"].id].error_code == "NON_RETRYABLE_ERROR"
    assert (dead[jobs["exact"].id].error_message or "").startswith("ValueError")
    assert dead[jobs["prefix"].id].error_code == "NON_RETRYABLE_ERROR"
    assert (dead[jobs["prefix"].id].error_message or "").startswith("billing.errors.PaymentDeclined")
    assert dead[jobs["other"].id].error_code == "HANDLER_ERROR"


async def test_handler_verdicts(client: ojs.Client, raw: amqp.Connection, q: str) -> None:
    """ojs.Retry (with a delay, on the ladder), ojs.Discard, ojs.DeadLetter, and Retry when
    no attempt is left (annotated dead letters, which carry the final reason)."""
    worker = ojs.Worker(queues=[q], annotate_dead_letters=True)
    outcomes = Outcomes(worker)

    @worker.handler("verdict.job")
    async def handler(ctx: ojs.JobContext, verdict: str) -> None:
        if verdict == "retry" and ctx.attempt == 1:
            raise ojs.Retry("busy", delay=0.1)
        if verdict == "discard":
            raise ojs.Discard("unwanted")
        if verdict == "dead":
            raise ojs.DeadLetter("needs a human")
        if verdict == "retry-last":
            raise ojs.Retry("still busy")

    async with running(worker, client):
        retry = await client.push("verdict.job", ["retry"], queue=q)
        discard = await client.push("verdict.job", ["discard"], queue=q)
        dead = await client.push("verdict.job", ["dead"], queue=q)
        last = await client.push(
            "verdict.job", ["retry-last"], queue=q, retry=ojs.RetryPolicy(max_attempts=1)
        )
        finals = {j.id: await outcomes.wait_final(j.id) for j in (retry, discard, dead, last)}
        dlq = await dead_jobs(client, raw, q, 3)
    retried = outcomes.of(retry.id)
    assert [(o.outcome, o.attempt) for o in retried] == [("retried", 1), ("completed", 2)]
    assert retried[0].delay_ms == 100 and retried[0].error_message == "Retry: busy"
    assert (finals[discard.id].error_code, dlq[discard.id].error_code) == ("DISCARDED", "DISCARDED")
    assert dlq[discard.id].error_message == "unwanted"
    assert (finals[dead.id].error_code, dlq[dead.id].error_code) == ("DEAD_LETTER", "DEAD_LETTER")
    assert dlq[dead.id].error_message == "needs a human"
    assert finals[last.id].outcome == "dead_lettered" and finals[last.id].attempt == 1
    assert "still busy" in (dlq[last.id].error_message or "")


# ------------------------------------------------------------------------ bad input


async def test_bad_input_is_dead_lettered_and_worker_survives(
    client: ojs.Client, raw: amqp.Connection, q: str
) -> None:
    """Garbage, non-envelopes, unknown types, ill-fitting args, a timeout and a handler
    raising a BaseException each end in the DLQ with their reason code; none is lost, the
    worker keeps running, and a good job pushed afterwards completes.  (Unknown types with
    the grace window off; the window: test_unknown_types_broker.py.)"""
    worker = ojs.Worker(queues=[q], concurrency=4, unknown_type_grace=0)
    outcomes = Outcomes(worker)

    @worker.handler("typed.job")
    async def typed(ctx: ojs.JobContext, a: int, b: int) -> None:
        pass

    @worker.handler("slow.job")
    async def slow(ctx: ojs.JobContext) -> None:
        await anyio.sleep_forever()

    @worker.handler("panic.job")
    async def panic(ctx: ojs.JobContext) -> None:
        raise Boom("handler blew up")

    @worker.handler("good.job")
    async def good(ctx: ojs.JobContext) -> None:
        pass

    names = client.names
    once = ojs.RetryPolicy(max_attempts=1)

    def envelope(type_: str, args: list[Any], **kw: Any) -> tuple[str, bytes]:
        job = ojs.new_job(type_, args, queue=q, **kw)
        return job.id, ojs.encode_job(job)

    bad: dict[str, tuple[str, bytes]] = {
        "INVALID_PAYLOAD": ("raw-not-json", b"\xff\xfe this is not JSON {"),
        "INVALID_PAYLOAD/2": ("raw-not-envelope", b'{"hello": "world", "args": 3}'),
        "INVALID_JOB_TYPE": envelope("no.such.type", []),
        "INVALID_ARGS": envelope("typed.job", [1, 2, 3]),
        "HANDLER_TIMEOUT": envelope("slow.job", [], timeout=1, retry=once),
        "HANDLER_PANIC": envelope("panic.job", []),
    }
    async with running(worker, client):
        with anyio.fail_after(WAIT):
            async with raw.channel(confirms=True) as ch:
                for message_id, body in bad.values():
                    await ch.publish(
                        body,
                        exchange=names.direct_exchange,
                        routing_key=q,
                        properties=amqp.BasicProperties(message_id=message_id, delivery_mode=2),
                        mandatory=True,
                    )
        finals = {code: await outcomes.wait_final(mid) for code, (mid, _) in bad.items()}
        good_job = await client.push("good.job", [], queue=q)
        assert (await outcomes.wait_final(good_job.id)).outcome == "completed"
        dlq = await dead_jobs(client, raw, q, len(bad))
    for label, (message_id, body) in bad.items():
        code = label.split("/")[0]
        assert finals[label].outcome == "dead_lettered", label
        assert finals[label].error_code == code, (label, finals[label])
        assert finals[label].error_message, label
        assert dlq[message_id].death_reason == "rejected", label
        assert dlq[message_id].body == body, label  # never altered
    assert "Boom" in (finals["HANDLER_PANIC"].error_message or "")
    assert "timeout" in (finals["HANDLER_TIMEOUT"].error_message or "")
    assert "no.such.type" in (finals["INVALID_JOB_TYPE"].error_message or "")


# ------------------------------------------------------------- unknown attributes


async def test_unknown_attributes_survive_worker_and_retry(
    client: ojs.Client, raw: amqp.Connection, q: str
) -> None:
    """Top-level attributes OJS does not define are kept (OJS JSON format §9.2): the handler
    sees them on every attempt and the retried message's body still has them."""
    worker = ojs.Worker(queues=[q])
    outcomes = Outcomes(worker)
    seen: list[tuple[int, dict[str, Any], dict[str, Any]]] = []

    @worker.handler("ext.job")
    async def handler(ctx: ojs.JobContext) -> None:
        seen.append((ctx.attempt, dict(ctx.job.extensions), json.loads(ctx.message.body)))
        if ctx.attempt == 1:
            raise ojs.Retry("once more", delay=0.1)

    job = ojs.new_job("ext.job", [], queue=q, extensions={"x_custom": {"k": [1, 2]}, "vendor_flag": True})
    raw_body = json.dumps(
        {"specversion": "1.0", "id": ojs.new_job("x", []).id, "type": "ext.job", "queue": q, "args": [],
         "x_raw_extra": "kept"}
    ).encode()  # fmt: skip
    raw_id = json.loads(raw_body)["id"]
    async with running(worker, client):
        await client.push_job(job)
        async with raw.channel() as ch:
            await ch.publish(raw_body, exchange="ojs.exchange.direct", routing_key=q, mandatory=True,
                             properties=amqp.BasicProperties(message_id=raw_id))  # fmt: skip
        for job_id in (job.id, raw_id):
            assert (await outcomes.wait_final(job_id)).outcome == "completed"
    by_id = {body["id"]: [] for _, _, body in seen}
    for attempt, ext, body in seen:
        by_id[body["id"]].append((attempt, ext, body))
    assert [a for a, _, _ in by_id[job.id]] == [1, 2]
    for _, ext, body in by_id[job.id]:
        assert ext == {"x_custom": {"k": [1, 2]}, "vendor_flag": True}
        assert body["x_custom"] == {"k": [1, 2]} and body["vendor_flag"] is True
    for _, ext, body in by_id[raw_id]:
        assert ext == {"x_raw_extra": "kept"}
        assert body["x_raw_extra"] == "kept"


# ---------------------------------------------------------------- graceful shutdown


async def test_stop_lets_in_flight_jobs_finish_and_takes_no_new_ones(
    client: ojs.Client, raw: amqp.Connection, q: str
) -> None:
    """worker.stop(): no new job starts; running ones finish within the grace period and are
    acked; the jobs not started stay in the queue."""
    worker = ojs.Worker(queues=[q], concurrency=2, grace_period=WAIT)
    outcomes = Outcomes(worker)
    release = anyio.Event()
    both_running = anyio.Event()
    started: list[int] = []

    @worker.handler("wait.job")
    async def handler(ctx: ojs.JobContext, i: int) -> None:
        started.append(i)
        if len(started) == 2:
            both_running.set()
        await release.wait()

    async with running(worker, client):
        jobs = [await client.push("wait.job", [i], queue=q) for i in range(4)]
        with anyio.fail_after(WAIT):
            await both_running.wait()
        worker.stop()
        release.set()
        done = await outcomes.wait_for(lambda o: o.outcome == "completed", count=2)
    # run() has returned.
    assert sorted(started) == [0, 1]
    assert {o.id for o in done} == {jobs[0].id, jobs[1].id}
    assert len(outcomes.items) == 2
    await wait_message_count(raw, client.names.job_queue(q), 2)  # the 2 finished ones were acked
    with anyio.fail_after(WAIT):
        async with raw.channel(confirms=False) as ch:
            left = [await ch.get(client.names.job_queue(q)) for _ in range(2)]
    assert {m.properties.message_id for m in left if m is not None} == {jobs[2].id, jobs[3].id}


async def test_stop_cancels_job_after_grace_period_and_leaves_it_unacked(
    client: ojs.Client, raw: amqp.Connection, q: str
) -> None:
    """A job still running when the grace period ends is cancelled and NOT acked: the
    broker redelivers it (redelivered=True), attempt unchanged."""
    worker = ojs.Worker(queues=[q], concurrency=1, grace_period=0.3)
    outcomes = Outcomes(worker)
    started = anyio.Event()
    cancelled = False

    @worker.handler("stuck.job")
    async def handler(ctx: ojs.JobContext) -> None:
        nonlocal cancelled
        started.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled = True
            raise

    async with running(worker, client):
        job = await client.push("stuck.job", [], queue=q)
        with anyio.fail_after(WAIT):
            await started.wait()
        stop_at = time.monotonic()
        worker.stop()
        abandoned = await outcomes.wait_for(lambda o: o.outcome == "abandoned")
        assert time.monotonic() - stop_at >= 0.3
    assert cancelled
    assert abandoned[0].id == job.id
    with anyio.fail_after(WAIT):
        async with raw.channel(confirms=False) as ch:
            msg = await ch.get(client.names.job_queue(q))
            assert msg is not None
            await msg.ack()
    assert msg.redelivered is True
    assert msg.properties.message_id == job.id
    assert (msg.properties.headers or {})["x-ojs-attempt"] == 1


async def test_stop_gives_each_queue_the_grace_period_and_abandons_only_what_still_runs(
    client: ojs.Client, raw: amqp.Connection, new_queue: Callable[..., str]
) -> None:
    """Two queues (a consume pool each): one stop() reaches both.  The job that finishes in
    the grace period is acked; the one still running when it ends is cancelled, reported
    abandoned and left unacked, and the worker returns."""
    finishing_q, stuck_q = new_queue(), new_queue()
    worker = ojs.Worker(queues=[finishing_q, stuck_q], concurrency=1, grace_period=0.3)
    outcomes = Outcomes(worker)
    release = anyio.Event()
    both_running = anyio.Event()
    started: list[str] = []

    @worker.handler("queue.job")
    async def handler(ctx: ojs.JobContext) -> None:
        started.append(ctx.queue)
        if len(started) == 2:
            both_running.set()
        if ctx.queue == finishing_q:
            await release.wait()
        else:
            await anyio.sleep_forever()

    async with running(worker, client):
        done = await client.push("queue.job", [], queue=finishing_q)
        stuck = await client.push("queue.job", [], queue=stuck_q)
        with anyio.fail_after(WAIT):
            await both_running.wait()
        worker.stop()
        release.set()
        await outcomes.wait_for(lambda o: o.outcome == "abandoned")
    # run() has returned: every pull task of both queues ended.
    final = {o.id: o.outcome for o in outcomes.items}
    assert final == {done.id: "completed", stuck.id: "abandoned"}
    await wait_message_count(raw, client.names.job_queue(finishing_q), 0)
    with anyio.fail_after(WAIT):
        async with raw.channel(confirms=False) as ch:
            msg = await ch.get(client.names.job_queue(stuck_q))
            assert msg is not None
            await msg.ack()
    assert msg.redelivered is True and msg.properties.message_id == stuck.id


async def test_stop_before_the_worker_is_ready_is_not_lost(client: ojs.Client, q: str) -> None:
    """stop() right after scheduling run() (a signal during startup): run() returns
    instead of consuming forever, and runs no job."""
    worker = ojs.Worker(queues=[q])
    ran = False

    @worker.handler("any.job")
    async def handler(ctx: ojs.JobContext) -> None:
        nonlocal ran
        ran = True

    await client.push("any.job", [], queue=q)
    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run, client)
            worker.stop()
    assert not ran


async def test_dead_letter_of_a_full_queue_still_reaches_the_dlq(raw: amqp.Connection, q: str) -> None:
    """A job discarded while its queue is full (x-max-length=1, reject-publish) still
    reaches the DLQ: the Nack needs no room in the job queue.  The worker carries on."""
    worker = ojs.Worker(queues=[q], concurrency=1)
    outcomes = Outcomes(worker)
    release = anyio.Event()
    started = anyio.Event()

    @worker.handler("first.job")
    async def first(ctx: ojs.JobContext) -> None:
        started.set()
        await release.wait()
        raise ojs.Discard("no longer wanted")

    @worker.handler("second.job")
    async def second(ctx: ojs.JobContext) -> None:
        pass

    options = ojs.QueueOptions(max_length=1, overflow="reject-publish")
    async with ojs.connect(current_url(), queue_options=options) as client, running(worker, client):
        a = await client.push("first.job", [], queue=q)
        with anyio.fail_after(WAIT):
            await started.wait()
        b = await client.push("second.job", [], queue=q)  # the queue is now full
        release.set()
        final_a = await outcomes.wait_final(a.id)
        assert (await outcomes.wait_final(b.id)).outcome == "completed"
        await wait_message_count(raw, client.names.dlx_queue(q), 1)
    assert final_a.outcome == "dead_lettered" and final_a.error_code == "DISCARDED"
    with anyio.fail_after(WAIT):
        async with raw.channel(confirms=False) as ch:
            msg = await ch.get(ojs.Names().dlx_queue(q))
            assert msg is not None
            await msg.ack()
    assert msg.properties.message_id == a.id
    h = msg.properties.headers or {}
    assert h["x-death"][0]["reason"] == "rejected"
    assert "x-ojs-dead-letter" not in h


async def test_one_pull_task_runs_jobs_after_a_timeout_and_a_cancel(
    client: ojs.Client, raw: amqp.Connection, q: str
) -> None:
    """With concurrency 1 every job goes through the same pull task: a job that times out
    and a job that is cancelled each end as they should, and the jobs after them run as
    usual (the task's cancel scope, spent by each, is renewed)."""
    worker = ojs.Worker(queues=[q], concurrency=1)
    outcomes = Outcomes(worker)
    started = anyio.Event()
    ran: list[str] = []

    @worker.handler("hang.job")
    async def hang(ctx: ojs.JobContext) -> None:
        started.set()
        await anyio.sleep_forever()

    @worker.handler("quick.job")
    async def quick(ctx: ojs.JobContext, i: int) -> int:
        ran.append(ctx.id)
        return i

    once = ojs.RetryPolicy(max_attempts=1)
    async with running(worker, client):
        slow = await client.push("hang.job", [], queue=q, timeout=1, retry=once)
        first = await client.push("quick.job", [1], queue=q)
        timed_out = await outcomes.wait_final(slow.id)
        assert (await outcomes.wait_final(first.id)).outcome == "completed"
        started = anyio.Event()
        cancelled_job = await client.push("hang.job", [], queue=q, retry=once)
        with anyio.fail_after(WAIT):
            await started.wait()
        with anyio.fail_after(WAIT):
            await client.cancel(cancelled_job.id, queue=q)
        cancelled = await outcomes.wait_final(cancelled_job.id)
        second = await client.push("quick.job", [2], queue=q)
        done = await outcomes.wait_final(second.id)
    assert timed_out.outcome == "dead_lettered" and timed_out.error_code == "HANDLER_TIMEOUT"
    assert cancelled.outcome == "cancelled"
    assert done.outcome == "completed" and done.result == 2
    assert ran == [first.id, second.id]


async def test_a_shorter_timeout_started_later_still_cuts_its_handler_on_time(
    client: ojs.Client, q: str
) -> None:
    """The timeouts of running handlers are watched together: a job with a 1 s timeout
    that starts while a job with a long one runs is cut at its own deadline, and the
    long one runs on to its end."""
    worker = ojs.Worker(queues=[q], concurrency=2)
    outcomes = Outcomes(worker)
    long_started = anyio.Event()
    release = anyio.Event()

    @worker.handler("long.job")
    async def long(ctx: ojs.JobContext) -> str:
        long_started.set()
        await release.wait()
        return "done"

    worker.handler("hang.job")(_hang)
    async with running(worker, client):
        first = await client.push("long.job", [], queue=q, timeout=600, retry=ONCE)
        with anyio.fail_after(WAIT):
            await long_started.wait()
        await _a_one_second_job_is_cut_on_time(client, q, outcomes)
        assert first.id in worker._running  # the long job is still running
        release.set()
        done = await outcomes.wait_final(first.id)
    assert done.outcome == "completed" and done.result == "done"


ONCE = ojs.RetryPolicy(max_attempts=1)


async def _hang(ctx: ojs.JobContext) -> None:
    await anyio.sleep_forever()


async def _a_one_second_job_is_cut_on_time(client: ojs.Client, q: str, outcomes: Outcomes) -> None:
    """Push a ``hang.job`` with a 1 s timeout: it is dead-lettered as timed out after 1 s."""
    pushed = anyio.current_time()
    slow = await client.push("hang.job", [], queue=q, timeout=1, retry=ONCE)
    timed_out = await outcomes.wait_final(slow.id)
    took = anyio.current_time() - pushed
    assert timed_out.outcome == "dead_lettered" and timed_out.error_code == "HANDLER_TIMEOUT"
    assert 1.0 <= took < 1.0 + WAIT / 2


async def test_a_shorter_timeout_after_a_finished_long_one_still_cuts_on_time(
    client: ojs.Client, q: str
) -> None:
    """The watch keeps sleeping until the deadline of a handler that woke it after that
    handler is done (so quick jobs do not wake it each): a job with a 1 s timeout that
    starts after a 600 s job has finished still wakes it, and is cut at its own deadline."""
    worker = ojs.Worker(queues=[q], concurrency=1)
    outcomes = Outcomes(worker)

    @worker.handler("quick.job")
    async def quick(ctx: ojs.JobContext) -> str:
        return "done"

    worker.handler("hang.job")(_hang)
    async with running(worker, client):
        quick_jobs = [await client.push("quick.job", [], queue=q, timeout=600, retry=ONCE) for _ in range(3)]
        for job in quick_jobs:
            assert (await outcomes.wait_final(job.id)).outcome == "completed"
        await _a_one_second_job_is_cut_on_time(client, q, outcomes)


@pytest.mark.parametrize("prefetch", [None, 8])
async def test_prefetch_is_what_the_worker_asked_for(
    client: ojs.Client, q: str, prefetch: int | None
) -> None:
    """The job queue's consumer has the prefetch the worker asked for (as the broker reports
    it): the concurrency by default (001's FETCH mapping), or ``Worker(prefetch=...)``;
    jobs still run at most ``concurrency`` at once."""
    concurrency = 2
    worker = ojs.Worker(queues=[q], concurrency=concurrency, prefetch=prefetch)
    outcomes = Outcomes(worker)
    most = now = 0

    @worker.handler("count.job")
    async def handler(ctx: ojs.JobContext, i: int) -> None:
        nonlocal most, now
        now += 1
        most = max(most, now)
        await anyio.lowlevel.checkpoint()
        now -= 1

    async with running(worker, client):
        with anyio.fail_after(WAIT):
            consumers = await consumer_facts(client.names.job_queue(q))
        jobs = [await client.push("count.job", [i], queue=q) for i in range(12)]
        for job in jobs:
            assert (await outcomes.wait_final(job.id)).outcome == "completed"
    assert [c["prefetch_count"] for c in consumers] == [prefetch or concurrency]
    assert worker.prefetch == (prefetch or concurrency)
    assert most <= concurrency


@pytest.mark.parametrize("prefetch", [1, 0, True, 1.5, 70_000])
def test_prefetch_below_concurrency_or_not_an_int_is_refused(prefetch: Any) -> None:
    with pytest.raises(ojs.UsageError, match="prefetch"):
        ojs.Worker(queues=["q"], concurrency=2, prefetch=prefetch)


def test_prefetch_follows_a_concurrency_set_later() -> None:
    """The command line sets ``worker.concurrency`` after construction: the default
    prefetch follows it, and a chosen prefetch never falls below it."""
    default = ojs.Worker(queues=["q"], concurrency=2)
    default.concurrency = 5
    assert default.prefetch == 5
    chosen = ojs.Worker(queues=["q"], concurrency=1, prefetch=8)
    assert chosen.prefetch == 8
    chosen.concurrency = 20
    assert chosen.prefetch == 20


async def test_a_cut_while_the_worker_declares_its_queues_is_ridden_out(
    client: ojs.Client, q: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker started as its connection drops (the cut lands in its start-up
    declarations) declares again once the connection is back, and runs jobs; it does not
    fail its run()."""
    declare = client.declare_queue
    cuts = [amqp.ConnectionLostError("socket error: cut during start-up")]

    async def cut_once(queue: str) -> None:
        if cuts:
            raise cuts.pop()
        await declare(queue)

    monkeypatch.setattr(client, "declare_queue", cut_once)
    worker = ojs.Worker(queues=[q])
    outcomes = Outcomes(worker)

    @worker.handler("after.cut")
    async def handler(ctx: ojs.JobContext) -> str:
        return "ran"

    with caplog.at_level(logging.WARNING, logger="ojs_anyio.worker"):
        async with running(worker, client):
            job = await client.push("after.cut", [], queue=q)
            assert (await outcomes.wait_final(job.id)).outcome == "completed"
    assert cuts == []
    assert any("lost while declaring its queues" in r.getMessage() for r in caplog.records)
