"""A rolling deploy: jobs of a type this worker does not know yet are not dead-lettered at
once (issue 24).  Within ``Worker(unknown_type_grace=...)`` they go back through the retry
queues, not counted as an attempt, and a worker that knows the type takes them; past the
window they are dead-lettered as ``INVALID_JOB_TYPE``.  RabbitMQ and memory://, asyncio
and Trio."""

from __future__ import annotations

import logging

import anyio
import pytest

import ojs_anyio as ojs

from .broker_support import WAIT, Outcomes, running

pytestmark = pytest.mark.anyio


async def test_a_job_of_an_unknown_type_waits_for_a_worker_that_knows_it(
    client: ojs.Client, q: str, caplog: pytest.LogCaptureFixture
) -> None:
    old = ojs.Worker(queues=[q], concurrency=2, unknown_type_grace=60)
    old_outcomes = Outcomes(old)
    new = ojs.Worker(queues=[q], concurrency=2)
    new_outcomes = Outcomes(new)
    ran: list[tuple[str, int]] = []

    @new.handler("report.v2")
    async def report(ctx: ojs.JobContext, n: int) -> None:
        ran.append((ctx.id, ctx.attempt))

    with caplog.at_level(logging.WARNING, logger="ojs_anyio.worker"):
        async with running(old, client):
            jobs = [await client.push("report.v2", [n], queue=q) for n in range(2)]
            deferred = await old_outcomes.wait_for(lambda o: o.outcome == "deferred", count=2)
        # Only the old worker ran so far: both jobs wait in the retry queues, not in the DLQ.
        assert {o.id for o in deferred} == {j.id for j in jobs}
        assert all(o.attempt == 1 and o.error_code == "INVALID_JOB_TYPE" for o in deferred)
        assert not old_outcomes.matching(lambda o: o.outcome == "dead_lettered")
        async with running(new, client):
            finals = [await new_outcomes.wait_final(j.id, timeout=WAIT * 2) for j in jobs]
    assert [f.outcome for f in finals] == ["completed", "completed"]
    assert sorted(ran) == sorted((j.id, 1) for j in jobs)  # the detour was not an attempt
    said = [r for r in caplog.records if "has no handler" in r.getMessage()]
    assert len(said) == 1 and "report.v2" in said[0].getMessage()  # once per type


async def test_past_the_window_the_job_is_dead_lettered_as_invalid_job_type(
    client: ojs.Client, q: str
) -> None:
    worker = ojs.Worker(queues=[q], unknown_type_grace=1.0)
    outcomes = Outcomes(worker)
    async with running(worker, client):
        job = await client.push("nobody.knows", [], queue=q)
        final = await outcomes.wait_final(job.id, timeout=WAIT * 2)
    kinds = [o.outcome for o in outcomes.of(job.id)]
    assert kinds[0] == "deferred" and kinds[-1] == "dead_lettered"
    assert final.error_code == "INVALID_JOB_TYPE" and final.attempt == 1
    assert "past the 1s grace window" in (final.error_message or "")


async def test_with_the_window_off_an_unknown_type_is_dead_lettered_at_once(
    client: ojs.Client, q: str
) -> None:
    worker = ojs.Worker(queues=[q], unknown_type_grace=0)
    outcomes = Outcomes(worker)
    async with running(worker, client):
        job = await client.push("nobody.knows", [], queue=q)
        final = await outcomes.wait_final(job.id)
    assert [o.outcome for o in outcomes.of(job.id)] == ["dead_lettered"]
    assert final.error_code == "INVALID_JOB_TYPE"


def test_the_window_is_checked_when_the_worker_is_made() -> None:
    with pytest.raises(ValueError, match="unknown_type_grace"):
        ojs.Worker(unknown_type_grace=-1)
    assert ojs.Worker().unknown_type_grace == 600.0


async def test_a_future_start_time_cannot_hold_the_window_open(client: ojs.Client, q: str) -> None:
    """The window's start travels in ``x-ojs-unknown-type-since``; a start in the future
    (any vhost client can write the header) counts as now."""
    worker = ojs.Worker(queues=[q], unknown_type_grace=1.0)
    outcomes = Outcomes(worker)
    async with running(worker, client):
        job = client.build("nobody.knows", [], queue=q)
        props = ojs.amqp.BasicProperties(
            message_id=job.id, headers={"x-ojs-unknown-type-since": 2**62}, delivery_mode=2
        )
        async with client.conn.channel() as ch:
            await ch.publish(
                ojs.encode_job(job), exchange="", routing_key=client.names.job_queue(q), properties=props
            )
        with anyio.fail_after(WAIT * 2):
            final = await outcomes.wait_final(job.id, timeout=WAIT * 2)
    assert final.outcome == "dead_lettered" and final.error_code == "INVALID_JOB_TYPE"
