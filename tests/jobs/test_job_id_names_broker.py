"""One name for a job's id (issue 27): ``id`` on every record of a job, as the OJS envelope
names it; the old ``job_id`` attributes of JobOutcome, JobInfo and DeadJob still work and
warn (DeprecationWarning).  RabbitMQ and memory://, asyncio and Trio."""

from __future__ import annotations

import pytest

import ojs_anyio as ojs

from .broker_support import WAIT, Outcomes, running, wait_message_count

pytestmark = pytest.mark.anyio


async def test_every_record_of_a_job_calls_its_id_id(client: ojs.Client, q: str) -> None:
    worker = ojs.Worker(queues=[q], retry=ojs.RetryPolicy(max_attempts=1))
    seen: list[str] = []

    @worker.handler("ids.ok")
    async def ok(ctx: ojs.JobContext) -> int:
        seen.append(ctx.id)
        return 1

    @worker.handler("ids.bad")
    async def bad(ctx: ojs.JobContext) -> None:
        raise ojs.Discard("no")

    outcomes = Outcomes(worker)
    async with running(worker, client):
        pending = await client.push_for_result("ids.ok", [], queue=q)
        assert await pending.result(timeout=WAIT) == 1
        dead = await client.push("ids.bad", [], queue=q)
        done = await outcomes.wait_final(pending.id)
        await outcomes.wait_final(dead.id)
        info = await client.info(pending.id, queue=q)
        await wait_message_count(client.conn, client.names.dlx_queue(q), 1)
    [dead_job] = await client.dead_letters(q).peek()

    assert seen == [pending.id] == [pending.job.id] == [done.id] == [info.id]
    assert dead_job.id == dead.id
    # The old names: the same value, with a DeprecationWarning naming the new one.
    for record, value in ((done, pending.id), (info, pending.id), (dead_job, dead.id)):
        with pytest.warns(
            DeprecationWarning, match=rf"{type(record).__name__}\.job_id is deprecated; use .*\.id"
        ):
            assert record.job_id == value  # type: ignore[attr-defined,union-attr]
