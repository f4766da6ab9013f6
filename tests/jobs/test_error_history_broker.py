"""A job's error history travels with its retries (``x-ojs-errors``: the last 10, messages
capped) and shows in INFO and on its dead letter.  RabbitMQ and memory://, asyncio and Trio."""

from __future__ import annotations

import anyio
import pytest

import ojs_anyio as ojs

from .broker_support import Outcomes, running

pytestmark = pytest.mark.anyio

FAST = dict(initial_interval="PT0.01S", max_interval="PT0.02S", jitter=False)


async def test_the_history_reaches_info_and_the_dead_letter(client: ojs.Client, q: str) -> None:
    worker = ojs.Worker(queues=[q], retry=ojs.RetryPolicy(max_attempts=3, **FAST))
    third = anyio.Event()
    release = anyio.Event()

    @worker.handler("flaky.job")
    async def flaky(ctx: ojs.JobContext) -> None:
        if ctx.attempt == 3:
            third.set()
            await release.wait()
        raise ConnectionError(f"refused on attempt {ctx.attempt}" + "!" * 1000)

    outcomes = Outcomes(worker)
    async with running(worker, client):
        job = await client.push("flaky.job", [], queue=q)
        await third.wait()
        info = await client.info(job.id, queue=q)
        release.set()
        assert (await outcomes.wait_final(job.id)).outcome == "dead_lettered"
        [dead] = await client.dead_letters(q).peek()
    assert info.state == "active" and info.errors is not None
    assert [(e["attempt"], e["code"], e["type"]) for e in info.errors] == [
        (1, "HANDLER_ERROR", "ConnectionError"),
        (2, "HANDLER_ERROR", "ConnectionError"),
    ]
    assert all(len(e["message"]) <= 300 and e["at"] for e in info.errors)
    assert [e["attempt"] for e in dead.errors] == [1, 2]


async def test_the_history_keeps_the_last_ten(client: ojs.Client, q: str) -> None:
    worker = ojs.Worker(queues=[q], retry=ojs.RetryPolicy(max_attempts=14, **FAST))

    @worker.handler("doomed.job")
    async def doomed(ctx: ojs.JobContext) -> None:
        raise ValueError(f"attempt {ctx.attempt}")

    outcomes = Outcomes(worker)
    async with running(worker, client):
        job = await client.push("doomed.job", [], queue=q)
        await outcomes.wait_final(job.id)
        [dead] = await client.dead_letters(q).peek()
    assert [e["attempt"] for e in dead.errors] == list(range(4, 14))
