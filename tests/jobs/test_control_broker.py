"""The control plane on the real broker (001 §5.6-5.8, DECISIONS 6 and 7): CANCEL, BEAT and
INFO with three workers competing for one queue, and long jobs against the broker's
consumer timeout.

Three :class:`ojs_anyio.Worker` objects share the client's connection.  They consume the
durable control queue competitively and relay each message to the broadcast exchange
``ojs.exchange.control``, where each reads its own exclusive queue, so each sees every
control message.  Every wait is bounded by ``anyio.fail_after``.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
import pytest
from support.waits import wait_until as _wait_until

import ojs_anyio as ojs
from ojs_anyio import amqp
from ojs_anyio.jobs._client import JobInfo

from .broker_support import WAIT, Outcomes, queue_facts, running, wait_message_count

wait_until = functools.partial(_wait_until, timeout=WAIT)

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def three_workers(
    client: ojs.Client, q: str, register: Callable[[ojs.Worker], None], **options: float
) -> AsyncIterator[list[tuple[ojs.Worker, Outcomes]]]:
    """Three workers on ``q`` (ids w1, w2, w3), running for the block."""
    workers = []
    for n in (1, 2, 3):
        worker = ojs.Worker(queues=[q], concurrency=2, worker_id=f"w{n}", **options)  # type: ignore[arg-type]
        register(worker)
        workers.append((worker, Outcomes(worker)))
    async with AsyncExitStack() as stack:
        for worker, _ in workers:
            await stack.enter_async_context(running(worker, client))
        yield workers


async def assert_settled_and_not_dead(client: ojs.Client, raw: amqp.Connection, q: str) -> None:
    """The job queue holds nothing, ready or unacked; the DLQ holds nothing."""
    jq, dlq = client.names.job_queue(q), client.names.dlx_queue(q)
    await wait_message_count(raw, jq, 0)
    with anyio.fail_after(WAIT):
        facts = await queue_facts(jq, dlq)
    assert facts[jq]["messages_ready"] == 0 and facts[jq]["messages_unacknowledged"] == 0
    assert facts[dlq]["messages_ready"] == 0


# --------------------------------------------------------------------------- CANCEL


async def test_cancel_running_job_only_its_worker_cancels(
    client: ojs.Client, raw: amqp.Connection, q: str
) -> None:
    """CANCEL reaches all three workers; only the one running the job cancels it.  The job
    is acked and reported "cancelled": not retried, not dead-lettered, not redelivered."""
    started = anyio.Event()
    runner: list[str] = []
    cancelled_in_handler: list[str] = []

    def register(worker: ojs.Worker) -> None:
        @worker.handler("long.job")
        async def handler(ctx: ojs.JobContext) -> None:
            runner.append(ctx.worker_id)
            started.set()
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                cancelled_in_handler.append(ctx.worker_id)
                raise

    async with three_workers(client, q, register) as workers:
        job = await client.push("long.job", [], queue=q, retry=ojs.RetryPolicy(max_attempts=5))
        with anyio.fail_after(WAIT):
            await started.wait()
        with anyio.fail_after(WAIT):
            await client.cancel(job.id, queue=q)
        owner = next((w, o) for w, o in workers if w.worker_id == runner[0])
        final = await owner[1].wait_final(job.id)
        # The others saw the CANCEL too (remembered, in case the job reaches them later).
        await wait_until(lambda: all(job.id in w.control.cancelled for w, _ in workers if w is not owner[0]))
        await assert_settled_and_not_dead(client, raw, q)
    assert final.outcome == "cancelled" and final.attempt == 1
    assert runner == [owner[0].worker_id]  # ran once, on one worker
    assert cancelled_in_handler == runner
    assert job.id not in owner[0].control.cancelled  # it ran here: nothing to remember
    for worker, outcomes in workers:
        expected = [("cancelled", 1)] if worker is owner[0] else []
        assert [(o.outcome, o.attempt) for o in outcomes.of(job.id)] == expected
        assert worker.counts.get("retried", 0) == 0
        assert worker.counts.get("dead_lettered", 0) == 0


async def test_cancel_before_the_job_arrives_skips_it(
    client: ojs.Client, raw: amqp.Connection, q: str
) -> None:
    """A CANCEL for a job no worker has seen yet is remembered by every worker; when the
    job arrives it is acked as "cancelled" without its handler running."""
    ran: list[str] = []

    def register(worker: ojs.Worker) -> None:
        @worker.handler("some.job")
        async def handler(ctx: ojs.JobContext) -> None:
            ran.append(ctx.id)

    job = client.build("some.job", [], queue=q)
    job_id = job.id
    async with three_workers(client, q, register) as workers:
        with anyio.fail_after(WAIT):
            await client.cancel(job_id, queue=q)
        await wait_until(lambda: all(job_id in w.control.cancelled for w, _ in workers))
        await client.push_job(job)
        other = await client.push("some.job", [], queue=q)
        with anyio.fail_after(WAIT):
            while True:
                found = [o for _, outs in workers for o in outs.of(job_id)]
                done = [o for _, outs in workers for o in outs.of(other.id)]
                if found and done:
                    break
                await anyio.sleep(0.01)
        await assert_settled_and_not_dead(client, raw, q)
    assert [o.outcome for o in found] == ["cancelled"]
    assert ran == [other.id]  # the cancelled job's handler never ran; others are unaffected


# ----------------------------------------------------------------------------- INFO


async def test_info_active_then_completed_and_unknown(client: ojs.Client, q: str) -> None:
    """INFO over RPC: "active" (with the running worker's id) while the job runs,
    "completed" after; a job no worker knows gives state "unknown" after the timeout,
    without raising."""
    started = anyio.Event()
    release = anyio.Event()

    def register(worker: ojs.Worker) -> None:
        @worker.handler("info.job")
        async def handler(ctx: ojs.JobContext) -> None:
            started.set()
            await release.wait()

    async with three_workers(client, q, register) as workers:
        job = await client.push("info.job", [], queue=q)
        with anyio.fail_after(WAIT):
            await started.wait()
        owner = next(w for w, _ in workers if job.id in w.active)
        with anyio.fail_after(WAIT):
            active = await client.info(job.id, queue=q, timeout=5)
        assert active.id == job.id
        assert active.state == "active"
        assert active.worker_id == owner.worker_id
        assert active.attempt == 1
        assert active.started_at is not None

        release.set()
        await next(o for w, o in workers if w is owner).wait_final(job.id)
        with anyio.fail_after(WAIT):
            completed = await client.info(job.id, queue=q, timeout=5)
        assert completed.state == "completed"
        assert completed.worker_id == owner.worker_id
        assert completed.finished_at is not None

        unknown_id = client.build("info.job", [], queue=q).id  # a job id nobody pushed
        t0 = time.monotonic()
        with anyio.fail_after(WAIT):
            unknown = await client.info(unknown_id, queue=q, timeout=0.5)
        elapsed = time.monotonic() - t0
    assert unknown == JobInfo(id=unknown_id, state="unknown")
    assert 0.5 <= elapsed < 3.0


# ----------------------------------------------------------------------------- BEAT


async def test_beat_reaches_every_worker_and_the_control_key(
    client: ojs.Client, raw: amqp.Connection, q: str
) -> None:
    """While a job runs, its worker publishes ojs.control.heartbeat {"job_id","worker_id"}
    to the control routing key every heartbeat_interval: every worker's ``liveness`` shows
    the job with the running worker's id, and a plain consumer bound to the key sees the
    messages.  ``client.heartbeat`` does the same from outside.  The durable
    ojs.queue.control.{q} exists."""
    names = client.names
    started = anyio.Event()
    release = anyio.Event()

    def register(worker: ojs.Worker) -> None:
        @worker.handler("beating.job")
        async def handler(ctx: ojs.JobContext) -> None:
            started.set()
            await release.wait()

    beats: list[tuple[str | None, dict[str, str]]] = []
    async with raw.channel(confirms=False) as ch:
        tap = await ch.queue_declare("", exclusive=True, auto_delete=True)
        await client.declare_queue(q)  # a control queue only for a queue that exists
        await client.declare_control_queue(q)
        await ch.queue_bind(tap.name, names.direct_exchange, names.control_routing_key(q))
        async with (
            ch.consume(tap.name, no_ack=True) as tapped,
            three_workers(client, q, register, heartbeat_interval=0.1) as workers,
        ):
            job = await client.push("beating.job", [], queue=q)
            with anyio.fail_after(WAIT):
                await started.wait()
            owner = next(w for w, _ in workers if job.id in w.active)
            await wait_until(
                lambda: all(w.liveness.get(job.id, ("",))[0] == owner.worker_id for w, _ in workers)
            )
            with anyio.fail_after(WAIT):
                async for msg in tapped:
                    beats.append((msg.properties.type, json.loads(msg.body)))
                    if len(beats) >= 2:
                        break
            # BEAT from outside (a supervisor, another process): every worker records it.
            with anyio.fail_after(WAIT):
                await client.heartbeat("external-job", "external-worker", queue=q)
            await wait_until(
                lambda: all(w.liveness.get("external-job", ("",))[0] == "external-worker" for w, _ in workers)
            )
            release.set()
            await next(o for w, o in workers if w is owner).wait_final(job.id)
    for kind, body in beats:
        assert kind == "ojs.control.heartbeat"
        assert body == {"job_id": job.id, "worker_id": owner.worker_id}

    cq = names.control_queue(q)
    with anyio.fail_after(WAIT):
        facts = await queue_facts(cq)
    assert cq in facts
    assert facts[cq]["durable"] is True
    assert facts[cq]["exclusive"] is False and facts[cq]["auto_delete"] is False


# ---------------------------------------------------------------- DECISIONS 7


async def test_job_timeout_beyond_consumer_timeout_is_capped(
    client: ojs.Client, raw: amqp.Connection, q: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A job whose timeout (5 s) exceeds the worker's broker_consumer_timeout (2 s) is
    warned about when it starts, and its timeout is capped: it ends as HANDLER_TIMEOUT
    after about 2 s (here dead-lettered, its one attempt used) instead of being redelivered
    forever by the broker's consumer timeout."""
    caplog.set_level(logging.WARNING, logger="ojs_anyio.worker")
    worker = ojs.Worker(queues=[q], broker_consumer_timeout=2.0)
    outcomes = Outcomes(worker)
    runs: list[float] = []

    @worker.handler("slow.job")
    async def handler(ctx: ojs.JobContext) -> None:
        runs.append(time.monotonic())
        await anyio.sleep(30)

    async with running(worker, client):
        job = await client.push("slow.job", [], queue=q, timeout=5, retry=ojs.RetryPolicy(max_attempts=1))
        final = await outcomes.wait_final(job.id)
        ended = time.monotonic()
        await wait_message_count(raw, client.names.dlx_queue(q), 1)
    assert final.outcome == "dead_lettered"
    assert final.error_code == "HANDLER_TIMEOUT"
    assert "1.8s" in (final.error_message or "")  # capped 10% below the consumer timeout
    assert len(runs) == 1  # not redelivered
    assert 1.7 <= ended - runs[0] < 4.0
    warnings = [r for r in caplog.records if r.name == "ojs_anyio.worker" and r.levelno == logging.WARNING]
    assert any(job.id in r.getMessage() and "consumer timeout" in r.getMessage() for r in warnings), [
        r.getMessage() for r in warnings
    ]


async def test_control_messages_are_relayed_once_each_and_never_loop(
    client: ojs.Client, raw: amqp.Connection, q: str
) -> None:
    """With three workers on the queue, 20 BEATs published to the durable control queue
    are relayed to the broadcast exchange exactly once each (a tap bound there sees 20
    distinct messages, then a marker, and nothing twice), every worker records every one,
    and the durable control queue ends empty: a relayed copy never returns to it."""
    names = client.names
    async with raw.channel(confirms=False) as ch:
        tap = await ch.queue_declare("", exclusive=True, auto_delete=True)
        await ch.exchange_declare(names.control_exchange, "direct", durable=True)
        await ch.queue_bind(tap.name, names.control_exchange, q)
        async with (
            ch.consume(tap.name, no_ack=True) as tapped,
            three_workers(client, q, lambda worker: None) as workers,
        ):
            for n in range(20):
                await client.heartbeat(f"job-{n}", "w-foreign", queue=q)
            seen: list[str] = []
            with anyio.fail_after(WAIT):
                async for msg in tapped:
                    seen.append(json.loads(msg.body)["job_id"])
                    if len(seen) == 20:
                        await client.heartbeat("marker", "w-foreign", queue=q)
                    if seen[-1] == "marker":
                        break
            assert sorted(seen) == sorted([f"job-{n}" for n in range(20)] + ["marker"])
            await wait_until(lambda: all("marker" in w.liveness for w, _ in workers))
            assert all({f"job-{n}" for n in range(20)} <= set(w.liveness) for w, _ in workers)
            await wait_message_count(raw, names.control_queue(q), 0)
