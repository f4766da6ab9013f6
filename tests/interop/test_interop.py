"""ojs_anyio beside a foreign OJS AMQP client (plain pika, ``foreign.py``) on one broker.

Vhost ``/ojs`` as in the binding's examples, a fresh queue name per test.  The foreign side
runs in worker threads (pika is blocking); everything it does has a deadline.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
import pytest
from jobs.broker_support import header_type, peek_raw, wait_message_count
from support.workers import WAIT, Outcomes, running

import ojs_anyio as ojs
from ojs_anyio import amqp

from . import foreign
from .foreign import SPEC_RETRY_DELAYS_MS, Consumed, RetryableError

pytestmark = pytest.mark.anyio

#: The foreign client is pika, over TCP: it cannot reach an in-process memory:// broker.
PIKA = pytest.mark.rabbitmq_only("the foreign client (pika) speaks TCP: memory:// has no socket")


def in_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return anyio.to_thread.run_sync(partial(fn, *args, **kwargs))


def register_interop_handler(worker: ojs.Worker, runs: list[tuple[str, int]]) -> None:
    """``interop.job`` with one argument: ``ok``, ``fail`` (always raises), ``retry-once``
    (``ojs.Retry`` after 1 s on its first attempt) or ``discard``."""

    @worker.handler("interop.job")
    async def handler(ctx: ojs.JobContext, mode: str) -> None:
        runs.append((ctx.id, ctx.attempt))
        if mode == "fail":
            raise RuntimeError("always fails")
        if mode == "retry-once" and ctx.attempt == 1:
            raise ojs.Retry("try again", delay=1.0)  # 1000 ms: a §15.3 retry queue
        if mode == "discard":
            raise ojs.Discard("not wanted")


@asynccontextmanager
async def foreign_consumer(
    q: str, process: Callable[[dict[str, Any], int], None], consumed: Consumed
) -> AsyncIterator[None]:
    """The §15.2 consumer on ``ojs.queue.{q}`` in a thread, for the duration of the block."""
    stop = threading.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(in_thread, foreign.consume, q, process, stop, consumed)
        try:
            yield
        finally:
            stop.set()


async def dlq_ids(client: ojs.Client, q: str) -> list[str | None]:
    return [d.id for d in await client.dead_letters(q).peek(limit=1000)]


# ------------------------------------------------------------------ declaration order


@PIKA
async def test_foreign_declares_first_then_our_push_worker_retry_and_dead_letter_work(
    ojs_vhost: str, spec_queue: str
) -> None:
    """The foreign client declares every entity first, plainly; then our eager declaration
    (job, dead-letter, control queues, no conflict), push, worker, retry through a §15.3
    retry queue and dead letter into its plain DLQ all work."""
    q = spec_queue
    with anyio.fail_after(WAIT):
        await in_thread(foreign.declare_everything, q)
    worker = ojs.Worker(queues=[q])
    outcomes = Outcomes(worker)
    runs: list[tuple[str, int]] = []
    register_interop_handler(worker, runs)
    async with (
        ojs.connect(ojs_vhost, declare="eager", queues=[q]) as client,
        running(worker, client),
    ):
        ok = await client.push("interop.job", ["ok"], queue=q)
        retried = await client.push("interop.job", ["retry-once"], queue=q)
        dead = await client.push("interop.job", ["discard"], queue=q)
        assert (await outcomes.wait_final(ok.id)).outcome == "completed"
        final = await outcomes.wait_final(retried.id)
        assert (final.outcome, final.attempt) == ("completed", 2)
        assert [o.delay_ms for o in outcomes.of(retried.id) if o.outcome == "retried"] == [1000]
        assert (await outcomes.wait_final(dead.id)).outcome == "dead_lettered"
        await wait_message_count(client.conn, client.names.dlx_queue(q), 1)
        assert await dlq_ids(client, q) == [dead.id]


@PIKA
async def test_ours_declare_first_then_foreign_declarations_succeed(
    ojs_vhost: str, spec_queue: str
) -> None:
    """Our eager declaration, §15.3's retry delays and a running worker (control queue)
    first; then every foreign declaration succeeds (a 406 would raise in the thread), and
    a job the foreign client publishes runs in our worker."""
    q = spec_queue
    worker = ojs.Worker(queues=[q])
    outcomes = Outcomes(worker)
    register_interop_handler(worker, [])
    async with ojs.connect(ojs_vhost, declare="eager", queues=[q]) as client:
        for delay in SPEC_RETRY_DELAYS_MS:
            await client.declare_retry_queue(q, delay)
        async with running(worker, client):
            with anyio.fail_after(WAIT):
                await in_thread(foreign.declare_everything, q)
                job_id = await in_thread(foreign.publish, q, "interop.job", ["ok"])
            assert (await outcomes.wait_final(job_id)).outcome == "completed"


# ------------------------------------------------------------------ shared job queue


@PIKA
async def test_spec_queue_200_jobs_failing_ones_dead_lettered_exactly_once(
    ojs_vhost: str, spec_queue: str
) -> None:
    """Our worker and a foreign §15.2 consumer share one queue with 200 jobs (half pushed
    by each side); every fifth always fails, with 2 attempts.  Counting executions per job
    id across both consumers: each good job ran once, each failing job exactly twice (the
    second run being its last attempt), and each failing job is in the DLQ exactly once.
    Once the job and retry queues are empty, nothing can run again: the counts are final."""
    q = spec_queue
    with anyio.fail_after(WAIT):
        await in_thread(foreign.declare_everything, q)
    ours_runs: list[tuple[str, int]] = []
    consumed = Consumed()
    policy = ojs.RetryPolicy(max_attempts=2, initial_interval="PT1S", jitter=False)
    worker = ojs.Worker(queues=[q], concurrency=5, retry=policy)
    register_interop_handler(worker, ours_runs)

    def process(job: dict[str, Any], attempt: int) -> None:
        if job["args"][0] == "fail":
            raise RetryableError("always fails")

    modes = ["fail" if n % 5 == 0 else "ok" for n in range(200)]
    async with ojs.connect(ojs_vhost) as client:
        await client.declare_queue(q)
        names = client.names
        async with running(worker, client), foreign_consumer(q, process, consumed):
            results = await client.push_batch(
                [client.build("interop.job", [m], queue=q, retry=policy) for m in modes[:100]]
            )
            assert all(r.ok for r in results)
            ids = {r.job.id: m for r, m in zip(results, modes[:100], strict=True)}
            with anyio.fail_after(WAIT):
                theirs = await in_thread(
                    foreign.publish_many, q, [("interop.job", [m]) for m in modes[100:]], max_attempts=2
                )
            ids.update(zip(theirs, modes[100:], strict=True))
            failing = {i for i, m in ids.items() if m == "fail"}
            assert len(ids) == 200 and len(failing) == 40

            def runs() -> Counter[str]:
                with consumed.lock:
                    return Counter([i for i, _ in ours_runs] + [i for i, _, _ in consumed.runs])

            queues = [names.job_queue(q), *(names.retry_queue(q, d) for d in (1000,))]
            with anyio.fail_after(60):
                async with client.conn.channel(confirms=False) as ch:
                    while True:
                        counts = [(await ch.queue_declare(n, passive=True)).message_count for n in queues]
                        dead = (await ch.queue_declare(names.dlx_queue(q), passive=True)).message_count
                        done = sum(1 for i, n in runs().items() if ids.get(i) == "ok" and n >= 1)
                        if dead >= 40 and done >= 160 and not any(counts) and not worker.active:
                            break
                        await anyio.sleep(0.05)  # polling broker state: no event for it
            settled = runs()
        assert runs() == settled  # nothing ran after the queues drained and both stopped
        dead_ids = await dlq_ids(client, q)
    assert sorted(i or "" for i in dead_ids) == sorted(failing)  # each failing job once
    assert {i: settled[i] for i in ids} == {i: (2 if i in failing else 1) for i in ids}
    attempts: dict[str, list[int]] = {}
    for i, a in ours_runs + [(i, a) for i, a, _ in consumed.runs]:
        attempts.setdefault(i, []).append(a)
    assert all(sorted(attempts[i]) == [1, 2] for i in failing)
    # Both consumers took part.
    assert ours_runs and consumed.runs


# ------------------------------------------------------------------ raw header types


async def test_attempt_headers_are_int32_on_the_wire_push_retry_dead_letter_requeue(
    ojs_vhost: str, spec_queue: str
) -> None:
    """x-ojs-attempt / x-ojs-max-attempts read as type codes from the bytes: ``I`` on a
    push; on a retry (even of a message that came in with int8 headers); in the DLQ (the
    Nacked message we pushed; the annotated copy we wrote of an int8 one); and after
    DeadLetters.requeue."""
    q = spec_queue
    attempt_keys = ("x-ojs-attempt", "x-ojs-max-attempts")

    def types(wire: bytes) -> tuple[str, str]:
        return header_type(wire, attempt_keys[0]), header_type(wire, attempt_keys[1])

    async def raw_publish(client: ojs.Client, job: ojs.Job) -> None:
        # plain ints: our codec writes them as int8 ("b"), like many clients would
        async with client.conn.channel(confirms=True) as ch:
            await ch.publish(
                ojs.encode_job(job),
                exchange=client.names.direct_exchange,
                routing_key=q,
                properties=amqp.BasicProperties(
                    message_id=job.id,
                    type=job.type,
                    delivery_mode=2,
                    headers={"x-ojs-queue": q, "x-ojs-attempt": 1, "x-ojs-max-attempts": 3},
                ),
                mandatory=True,
            )

    runs: list[tuple[str, int]] = []
    async with ojs.connect(ojs_vhost) as client:
        names = client.names
        await client.declare_queue(q)
        with anyio.fail_after(WAIT):
            # max_attempts set by the job, so both attempt headers are on the message
            pushed = await client.push(
                "interop.slow_retry", [], queue=q, retry=ojs.RetryPolicy(max_attempts=3)
            )
            msg, wire = await peek_raw(names.job_queue(q), url=ojs_vhost)
            assert msg.properties.message_id == pushed.id and types(wire) == ("I", "I")
            int8 = client.build("interop.slow_retry", [], queue=q)
            await raw_publish(client, int8)

        worker = ojs.Worker(queues=[q], concurrency=1)
        outcomes = Outcomes(worker)

        @worker.handler("interop.slow_retry")
        async def slow_retry(ctx: ojs.JobContext) -> None:
            runs.append((ctx.id, ctx.attempt))
            raise ojs.Retry("later", delay=60.0)  # parks it in ojs.queue.retry.{q}.60000

        async with running(worker, client):
            await outcomes.wait_for(lambda o: o.outcome == "retried", count=2)
        retry_queue = names.retry_queue(q, 60000)
        await wait_message_count(client.conn, retry_queue, 2)
        async with client.conn.channel(confirms=False) as ch:
            for _ in range(2):
                msg, wire = await peek_raw(retry_queue, url=ojs_vhost)
                assert types(wire) == ("I", "I"), msg.properties.message_id
                got = await ch.get(retry_queue)  # move on to the next one
                assert got is not None
                await got.ack()

        # Dead-letter path: the Nacked message we pushed; the annotated copy of an int8 one.
        discarded = await client.push(
            "interop.job", ["discard"], queue=q, retry=ojs.RetryPolicy(max_attempts=3)
        )
        worker = ojs.Worker(queues=[q], concurrency=1)
        outcomes = Outcomes(worker)
        register_interop_handler(worker, runs)
        async with running(worker, client):
            assert (await outcomes.wait_final(discarded.id)).outcome == "dead_lettered"
        await wait_message_count(client.conn, names.dlx_queue(q), 1)
        msg, wire = await peek_raw(names.dlx_queue(q), url=ojs_vhost)
        assert msg.properties.message_id == discarded.id and types(wire) == ("I", "I")

        annotated_worker = ojs.Worker(queues=[q], concurrency=1, annotate_dead_letters=True)
        outcomes = Outcomes(annotated_worker)
        register_interop_handler(annotated_worker, runs)
        int8_discard = client.build("interop.job", ["discard"], queue=q)
        await raw_publish(client, int8_discard)
        _, wire = await peek_raw(names.job_queue(q), url=ojs_vhost)
        assert types(wire) == ("b", "b")  # what came in
        async with running(annotated_worker, client):
            assert (await outcomes.wait_final(int8_discard.id)).outcome == "dead_lettered"
        await wait_message_count(client.conn, names.dlx_queue(q), 2)
        # the second in the DLQ is the annotated copy: read it after moving the first aside
        assert [d.id for d in await client.dead_letters(q).peek()] == [discarded.id, int8_discard.id]
        assert await client.dead_letters(q).requeue(limit=1) == 1
        msg, wire = await peek_raw(names.dlx_queue(q), url=ojs_vhost)
        assert msg.properties.message_id == int8_discard.id
        assert (msg.properties.headers or {}).get("x-ojs-error-code") == "DISCARDED"
        assert types(wire) == ("I", "I")

        # Requeue: the job we requeued above, and the int8-born one now.
        msg, wire = await peek_raw(names.job_queue(q), url=ojs_vhost)
        assert msg.properties.message_id == discarded.id and types(wire) == ("I", "I")
        async with client.conn.channel(confirms=False) as ch:
            await ch.queue_purge(names.job_queue(q))
        assert await client.dead_letters(q).requeue() == 1
        msg, wire = await peek_raw(names.job_queue(q), url=ojs_vhost)
        assert msg.properties.message_id == int8_discard.id and types(wire) == ("I", "I")


# ------------------------------------------------------------------ priority


@PIKA
async def test_unprioritised_jobs_stay_fifo_across_clients_and_150_arrives_as_9(
    ojs_vhost: str, spec_queue: str
) -> None:
    """Foreign §15.1 jobs (no priority) and ours (no priority), interleaved, come out in
    the order they went in.  A job with OJS priority 150 is accepted, overtakes them with
    AMQP priority 9, and runs (never dead-lettered for its priority)."""
    q = spec_queue
    with anyio.fail_after(WAIT):
        await in_thread(foreign.declare_everything, q)
    order: list[str] = []
    async with ojs.connect(ojs_vhost) as client:
        with anyio.fail_after(WAIT):
            for _ in range(4):
                order.append(await in_thread(foreign.publish, q, "interop.job", ["ok"]))
                order.append((await client.push("interop.job", ["ok"], queue=q)).id)
            urgent = await client.push("interop.job", ["ok"], queue=q, priority=150)
            assert urgent.priority == 150
            _, props, _ = await in_thread(foreign.basic_get, f"ojs.queue.{q}")
            assert (props.message_id, props.priority) == (urgent.id, 9)
            got = []
            for _ in order:
                _, props, _ = await in_thread(foreign.basic_get, f"ojs.queue.{q}")
                assert props.priority is None
                got.append(props.message_id)
            assert got == order

        worker = ojs.Worker(queues=[q])
        outcomes = Outcomes(worker)
        register_interop_handler(worker, [])
        async with running(worker, client):
            jobs = [await client.push("interop.job", ["ok"], queue=q, priority=p) for p in (150, -7, 10**9)]
            for job in jobs:
                assert (await outcomes.wait_final(job.id)).outcome == "completed"


# ------------------------------------------------------------------ control plane


class Blocked:
    """Three workers (concurrency 1) whose ``interop.block`` handler waits for ``release``."""

    def __init__(self, q: str) -> None:
        self.release = anyio.Event()
        self.started: set[str] = set()
        self._changed = anyio.Event()
        self.workers = [ojs.Worker(queues=[q], concurrency=1) for _ in range(3)]
        self.outcomes = [Outcomes(w) for w in self.workers]
        for worker in self.workers:
            worker.register("interop.block", self._block)

    async def _block(self, ctx: ojs.JobContext) -> None:
        self.started.add(ctx.id)
        changed, self._changed = self._changed, anyio.Event()
        changed.set()
        await self.release.wait()

    async def wait_running(self, ids: list[str]) -> None:
        with anyio.fail_after(WAIT):
            while not set(ids) <= self.started:
                await self._changed.wait()

    def owner(self, job_id: str) -> int:
        return next(i for i, w in enumerate(self.workers) if job_id in w.active)


@asynccontextmanager
async def three_blocked_workers(client: ojs.Client, q: str) -> AsyncIterator[Blocked]:
    blocked = Blocked(q)
    w = blocked.workers
    async with running(w[0], client), running(w[1], client), running(w[2], client):
        try:
            yield blocked
        finally:
            blocked.release.set()


@pytest.mark.parametrize("via", ["default", "direct"])
@PIKA
async def test_foreign_cancel_reaches_the_worker_running_the_job(
    ojs_vhost: str, spec_queue: str, via: str
) -> None:
    """A foreign CANCEL published to ojs.queue.control.{q} (through the default exchange,
    or through ojs.exchange.direct), with three workers on the queue each running one job:
    only the named job is cancelled, by the worker running it, exactly once; the others
    complete."""
    q = spec_queue
    async with ojs.connect(ojs_vhost) as client, three_blocked_workers(client, q) as blocked:
        workers, outcomes = blocked.workers, blocked.outcomes
        jobs = [await client.push("interop.block", [], queue=q) for _ in range(3)]
        await blocked.wait_running([j.id for j in jobs])
        assert sorted(blocked.owner(j.id) for j in jobs) == [0, 1, 2]  # one job per worker
        target = jobs[1]
        owner = blocked.owner(target.id)
        with anyio.fail_after(WAIT):
            await in_thread(foreign.cancel, q, target.id, via=via)
        final = await outcomes[owner].wait_final(target.id)
        assert final.outcome == "cancelled"
        assert all(any(j.id in w.active for w in workers) for j in (jobs[0], jobs[2]))
        others = {j.id: outcomes[blocked.owner(j.id)] for j in (jobs[0], jobs[2])}
        blocked.release.set()
        for job_id, owner_outcomes in others.items():
            assert (await owner_outcomes.wait_final(job_id)).outcome == "completed"
        cancelled = [o for oc in outcomes for o in oc.matching(lambda o: o.outcome == "cancelled")]
        assert [o.id for o in cancelled] == [target.id]


@PIKA
async def test_foreign_info_is_answered_on_the_foreign_reply_queue(ojs_vhost: str, spec_queue: str) -> None:
    """A foreign INFO (exclusive auto-delete reply queue, reply_to, correlation_id) sent to
    the control queue through the default exchange, with three workers on the queue: the
    worker running the job answers, on that reply queue, with the same correlation id."""
    q = spec_queue
    async with ojs.connect(ojs_vhost) as client, three_blocked_workers(client, q) as blocked:
        job = await client.push("interop.block", [], queue=q)
        await blocked.wait_running([job.id])
        owner = blocked.workers[blocked.owner(job.id)]
        with anyio.fail_after(WAIT):
            answer, theirs, ours = await in_thread(foreign.info, q, job.id)
        assert theirs == ours
        assert (answer["job_id"], answer["state"], answer["attempt"], answer["worker_id"]) == (
            job.id,
            "active",
            1,
            owner.worker_id,
        )
        # Our own client's INFO uses its own reply queue the same way.
        info = await client.info(job.id, queue=q)
        assert (info.state, info.worker_id) == ("active", owner.worker_id)


# ------------------------------------------------------------------ retries both ways


@PIKA
async def test_foreign_retry_runs_in_our_worker_and_ours_in_theirs(ojs_vhost: str, spec_queue: str) -> None:
    """A retry the foreign client publishes through ojs.exchange.retry (§15.4, attempt 2,
    1000 ms) is run by our worker as attempt 2.  A retry our worker publishes (attempt 1
    failed) is run by the foreign §15.2 consumer as attempt 2, with our error headers."""
    q = spec_queue
    with anyio.fail_after(WAIT):
        await in_thread(foreign.declare_everything, q)
    runs: list[tuple[str, int]] = []
    worker = ojs.Worker(queues=[q])
    outcomes = Outcomes(worker)
    register_interop_handler(worker, runs)
    async with ojs.connect(ojs_vhost) as client:
        async with running(worker, client):
            job = client.build("interop.job", ["ok"], queue=q)
            with anyio.fail_after(WAIT):
                await in_thread(foreign.publish_retry_of, q, job.id, "interop.job", ["ok"], attempt=2)
            final = await outcomes.wait_final(job.id)
            assert (final.outcome, final.attempt) == ("completed", 2)
            assert runs == [(job.id, 2)]

            ours = await client.push(
                "interop.job", ["retry-once"], queue=q, retry=ojs.RetryPolicy(max_attempts=3)
            )
            retried = await outcomes.wait_for(lambda o: o.id == ours.id and o.outcome == "retried")
            assert retried[0].delay_ms == 1000
        # Our worker has stopped; the retry comes back to the job queue for the foreign side.
        consumed = Consumed()
        seen = anyio.Event()

        def process(job: dict[str, Any], attempt: int) -> None:
            if job["id"] == ours.id:
                anyio.from_thread.run_sync(seen.set)

        async with foreign_consumer(q, process, consumed):
            with anyio.fail_after(WAIT):
                await seen.wait()
    [(_, attempt, headers)] = [r for r in consumed.runs if r[0] == ours.id]
    assert attempt == 2
    assert headers["x-ojs-error-code"] == "HANDLER_ERROR" and "try again" in headers["x-ojs-error-message"]
    assert headers["x-ojs-max-attempts"] == 3
