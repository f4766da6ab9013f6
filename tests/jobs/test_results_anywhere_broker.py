"""Results read from any process: ``client.result(job_id)`` and INFO's ``result`` and
``started_at``, from a client that did not push the job (another connection, as another web
worker process would have).  RabbitMQ and memory://, asyncio and Trio."""

from __future__ import annotations

import anyio
import pytest

import ojs_anyio as ojs

from .broker_support import Outcomes, running

pytestmark = pytest.mark.anyio


async def test_another_client_reads_the_result_and_the_failure(
    client: ojs.Client, broker_url: str, q: str
) -> None:
    worker = ojs.Worker(queues=[q], retry=ojs.RetryPolicy(max_attempts=1))

    @worker.handler("report.total")
    async def total(ctx: ojs.JobContext, xs: list[int]) -> dict[str, int]:
        return {"total": sum(xs)}

    @worker.handler("report.broken")
    async def broken(ctx: ojs.JobContext) -> None:
        raise ValueError("no data for that day")

    outcomes = Outcomes(worker)
    async with running(worker, client), ojs.connect(broker_url) as other:
        ok = await client.push("report.total", [[1, 2, 3]], queue=q)
        bad = await client.push("report.broken", [], queue=q)
        # the other process's view: it never saw these pushes
        assert await other.result(ok.id, queue=q, timeout=30) == {"total": 6}
        with pytest.raises(ojs.JobFailedError) as failed:
            await other.result(bad.id, queue=q, timeout=30)
        assert failed.value.error_type == "ValueError" and "no data" in (failed.value.message or "")
        await outcomes.wait_final(ok.id)
        info = await other.info(ok.id, queue=q)
        assert info.state == "completed" and info.result == {"total": 6}
        assert info.started_at is not None and info.finished_at is not None
        assert info.started_at <= info.finished_at
        # a job no worker has heard of: no answer within the timeout
        unknown = ojs.new_job("report.total", [[0]], queue=q).id
        with anyio.fail_after(10), pytest.raises(TimeoutError):
            await other.result(unknown, queue=q, timeout=0.5)


async def test_a_finished_job_is_forgotten_after_the_retention(
    client: ojs.Client, q: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time as real_time
    from types import SimpleNamespace

    from ojs_anyio.jobs import _control

    worker = ojs.Worker(queues=[q])

    @worker.handler("report.total")
    async def total(ctx: ojs.JobContext) -> int:
        return 42

    outcomes = Outcomes(worker)
    async with running(worker, client):
        job = await client.push("report.total", [], queue=q)
        await outcomes.wait_final(job.id)
        assert (await client.info(job.id, queue=q)).result == 42
        later = real_time.time() + _control.RECENT_MAX_AGE + 1
        monkeypatch.setattr(_control, "time", SimpleNamespace(time=lambda: later))
        assert (await client.info(job.id, queue=q, timeout=1)).state == "unknown"
