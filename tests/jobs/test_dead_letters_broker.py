"""The dead-letter API on the real broker: DeadLetters.count / peek / requeue / purge."""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.brokers import RABBITMQ_URL as URL

import ojs_anyio as ojs
from ojs_anyio import amqp

from .broker_support import (
    WAIT,
    Outcomes,
    current_url,
    header_type,
    peek_raw,
    running,
    wait_message_count,
)

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("annotate", [False, True], ids=["nack", "annotated"])
async def test_peek_requeue_purge(client: ojs.Client, raw: amqp.Connection, q: str, annotate: bool) -> None:
    """peek leaves the jobs where they are; requeue moves them back to ojs.queue.{q} with
    attempt 1 (int32), the same message id and no death headers, and they then complete;
    purge empties the DLQ and says how many it removed.  By default (Nack) the DLQ copy is
    the original message plus RabbitMQ's x-death (reason ``rejected``); in the opt-in
    annotated mode it also carries the final error code and message."""
    healthy = False
    worker = ojs.Worker(queues=[q], annotate_dead_letters=annotate)
    outcomes = Outcomes(worker)

    @worker.handler("fragile.job")
    async def handler(ctx: ojs.JobContext, n: int) -> None:
        if not healthy:
            raise ojs.Discard(f"dependency down ({n})")

    dead_letters = client.dead_letters(q)
    names = client.names
    async with running(worker, client):
        # Distinct priorities (AMQP 1, 5, 9): the dead letter and its requeue keep them.
        # max_attempts set by the job: the header travels (as int32) through the requeue.
        jobs = [
            await client.push("fragile.job", [n], queue=q, priority=p, retry=ojs.RetryPolicy(max_attempts=4))
            for n, p in enumerate((1, 5, 9))
        ]
        for job in jobs:
            assert (await outcomes.wait_final(job.id)).outcome == "dead_lettered"
        await wait_message_count(raw, names.dlx_queue(q), 3)

    with anyio.fail_after(WAIT):
        # peek: all three, with their reasons, none removed.
        peeked = await dead_letters.peek(limit=10)
        # (The three died concurrently: their order in the DLQ is not the push order.)
        assert sorted(d.id or "" for d in peeked) == sorted(j.id for j in jobs)
        if annotate:
            reasons = sorted(d.error_message or "" for d in peeked)
            assert reasons == [f"dependency down ({n})" for n in range(3)]
            assert all(d.error_code == "DISCARDED" for d in peeked)
            assert all(d.death_reason is None for d in peeked)  # published, not dead-lettered
        else:
            # Nack(requeue=false): the broker's own dead-lettering; the final reason comes
            # from the worker's death note, joined by job id.
            reasons = sorted(d.error_message or "" for d in peeked)
            assert reasons == [f"dependency down ({n})" for n in range(3)]
            assert all(d.error_code == "DISCARDED" and d.noted for d in peeked)
            assert all(d.death_reason == "rejected" for d in peeked)
        assert all(d.attempt == 1 and d.died_at is not None for d in peeked)
        assert await dead_letters.count() == 3
        assert len(await dead_letters.peek(limit=2)) == 2
        assert await dead_letters.count() == 3

        # requeue one: back in the job queue, attempt 1, same id, clean headers.
        assert await dead_letters.requeue(limit=1) == 1
        assert await dead_letters.count() == 2
        msg, wire = await peek_raw(names.job_queue(q))
        h = msg.properties.headers or {}
        by_id = {j.id: j for j in jobs}
        assert msg.properties.message_id == peeked[0].id  # the head of the DLQ
        requeued = by_id[msg.properties.message_id]
        assert msg.exchange == names.direct_exchange and msg.routing_key == q
        assert h["x-ojs-attempt"] == 1
        assert header_type(wire, "x-ojs-attempt") == header_type(wire, "x-ojs-max-attempts") == "I"
        assert not {
            "x-death",
            "x-first-death-reason",
            "x-ojs-error-code",
            "x-ojs-error-message",
            "x-ojs-dead-letter",
            "x-ojs-dead-lettered-at",
        } & set(h)
        assert msg.properties.priority == {jobs[0].id: 1, jobs[1].id: 5, jobs[2].id: 9}[requeued.id]
        assert ojs.decode_job(msg.body) == requeued

        # requeue the rest.
        assert await dead_letters.requeue() == 2
        assert await dead_letters.count() == 0

    healthy = True
    worker2 = ojs.Worker(queues=[q])
    outcomes2 = Outcomes(worker2)
    worker2.register("fragile.job", handler)
    async with running(worker2, client):
        for job in jobs:
            final = await outcomes2.wait_final(job.id)
            assert (final.outcome, final.attempt) == ("completed", 1)
    await wait_message_count(raw, names.job_queue(q), 0)

    # purge: dead-letter two more, purge them.
    healthy = False
    worker3 = ojs.Worker(queues=[q], annotate_dead_letters=annotate)
    outcomes3 = Outcomes(worker3)
    worker3.register("fragile.job", handler)
    async with running(worker3, client):
        more = [await client.push("fragile.job", [n], queue=q) for n in (10, 11)]
        for job in more:
            await outcomes3.wait_final(job.id)
        await wait_message_count(raw, names.dlx_queue(q), 2)
    with anyio.fail_after(WAIT):
        assert await dead_letters.purge() == 2
        assert await dead_letters.count() == 0
        assert await dead_letters.peek() == []


async def test_prune_enforces_retention_by_count_then_age_and_from_the_cli(
    client: ojs.Client, raw: amqp.Connection, q: str
) -> None:
    """The DLQ has no broker limits; prune() enforces retention: beyond ``max_jobs`` the
    oldest go first; jobs younger than ``older_than`` stay; ``ojs-anyio dlq prune``
    does the same from a shell."""
    worker = ojs.Worker(queues=[q])
    outcomes = Outcomes(worker)

    @worker.handler("fragile.job")
    async def handler(ctx: ojs.JobContext, n: int) -> None:
        raise ojs.Discard("unwanted")

    jobs = []
    async with running(worker, client):
        for n in range(5):  # one at a time: their order in the DLQ is their order here
            jobs.append(await client.push("fragile.job", [n], queue=q))
            await outcomes.wait_final(jobs[-1].id)
            await wait_message_count(raw, client.names.dlx_queue(q), n + 1)
    dead_letters = client.dead_letters(q)
    with anyio.fail_after(WAIT):
        assert await dead_letters.prune() == 0  # defaults: 180 days, 10,000 jobs
        assert await dead_letters.prune(max_jobs=3) == 2
        assert [d.id for d in await dead_letters.peek()] == [j.id for j in jobs[2:]]
        assert await dead_letters.prune(timedelta(days=1), max_jobs=None) == 0
        assert await dead_letters.prune(None, max_jobs=0, stop=lambda: True) == 0  # asked to stop at once
        assert await dead_letters.prune(timedelta(days=1), max_jobs=2) == 1
    if current_url().startswith("memory://"):
        # The CLI runs in another process, which cannot reach an in-process broker.
        assert await dead_letters.prune(None, max_jobs=1) == 1
    else:
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'codec'}"}
        with anyio.fail_after(60):
            done = await anyio.run_process(
                [sys.executable, "-m", "ojs_anyio.cli", "dlq", "prune", q,
                 "--url", URL, "--max-count", "1", "--yes"],
                env=env,
            )
        assert done.stdout.decode().strip() == f"pruned 1 dead job(s) from {client.names.dlx_queue(q)}"
    with anyio.fail_after(WAIT):
        assert [d.id for d in await dead_letters.peek()] == [jobs[4].id]
        progress: list[int] = []
        assert await dead_letters.prune(timedelta(0), max_jobs=None, on_dropped=progress.append) == 1  # old
        assert progress == [1]


async def test_requeue_by_id_finds_a_job_a_concurrent_peek_holds(
    client: ojs.Client, raw: amqp.Connection, q: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peek (a dashboard's refresh, another command) holds the messages it looks at
    unacked for a moment, and the broker does not count them as present: a requeue by id
    that starts then looks again before it says the job is not there."""
    from ojs_anyio import _dead_letter_queue

    worker = ojs.Worker(queues=[q])
    outcomes = Outcomes(worker)

    @worker.handler("held.job")
    async def handler(ctx: ojs.JobContext) -> None:
        raise ojs.Discard("dead at once")

    async with running(worker, client):
        job = await client.push("held.job", [], queue=q)
        assert (await outcomes.wait_final(job.id)).outcome == "dead_lettered"
        await wait_message_count(raw, client.names.dlx_queue(q), 1)

    first_scan_done = anyio.Event()
    scan = _dead_letter_queue.DeadLetterQueue._move_scan

    async def observed_scan(self: Any, *args: Any, **kwargs: Any) -> int:
        moved: int = await scan(self, *args, **kwargs)
        first_scan_done.set()
        return moved

    monkeypatch.setattr(_dead_letter_queue.DeadLetterQueue, "_move_scan", observed_scan)
    dead_letters = client.dead_letters(q)
    moved: list[int] = []
    with anyio.fail_after(WAIT):
        async with raw.channel() as ch:
            held = await ch.get(client.names.dlx_queue(q))  # the other reader's Basic.Get
            assert held is not None and held.properties.message_id == job.id
            async with anyio.create_task_group() as tg:

                async def requeue() -> None:
                    moved.append(await dead_letters.requeue(ids=[job.id]))

                tg.start_soon(requeue)
                await first_scan_done.wait()  # the first scan did not see it
                await held.reject(requeue=True)  # the peek puts it back
        assert moved == [1]
        assert await dead_letters.count() == 0
        # An id that is not there is reported so after the scans, not waited for.
        assert await dead_letters.requeue(ids=["no-such-job"]) == 0
