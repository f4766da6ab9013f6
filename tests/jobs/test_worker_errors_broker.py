"""A worker survives a failing outcome listener, and lets the process stop when a
handler raises SystemExit (the job is neither failed nor dead-lettered)."""

from __future__ import annotations

import logging

import anyio
import pytest

import ojs_anyio as ojs
from ojs_anyio import amqp

from .broker_support import WAIT, Outcomes, running, wait_message_count

pytestmark = pytest.mark.anyio


async def test_a_failing_listener_is_logged_and_the_worker_keeps_running(
    client: ojs.Client, q: str, caplog: pytest.LogCaptureFixture
) -> None:
    worker = ojs.Worker(queues=[q])
    outcomes = Outcomes(worker)
    calls = 0

    def broken(outcome: ojs.JobOutcome) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("listener bug")

    worker.add_listener(broken)

    @worker.handler("ok.job")
    async def handler(ctx: ojs.JobContext) -> None:
        pass

    with caplog.at_level(logging.ERROR, logger="ojs_anyio.worker"):
        async with running(worker, client):
            with anyio.fail_after(WAIT):
                first = await client.push("ok.job", [], queue=q)
                second = await client.push("ok.job", [], queue=q)
            assert (await outcomes.wait_final(first.id)).outcome == "completed"
            assert (await outcomes.wait_final(second.id)).outcome == "completed"
    assert calls >= 2
    failures = [r for r in caplog.records if "listener" in r.getMessage()]
    assert failures and failures[0].exc_info is not None
    assert isinstance(failures[0].exc_info[1], RuntimeError)


# asyncio re-raises SystemExit from a task out of the event loop itself, which would end
# the test session; Trio delivers it through the task tree like any exception.
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_system_exit_in_a_handler_propagates_and_the_job_is_not_failed(
    client: ojs.Client, raw: amqp.Connection, q: str
) -> None:
    worker = ojs.Worker(queues=[q])
    outcomes = Outcomes(worker)

    @worker.handler("exit.job")
    async def handler(ctx: ojs.JobContext) -> None:
        raise SystemExit(3)

    with anyio.fail_after(WAIT):
        await client.push("exit.job", [], queue=q)
    with pytest.raises(BaseException) as info:  # which one: checked below
        with anyio.fail_after(WAIT):
            await worker.run(client)
    exc: BaseException = info.value
    while isinstance(exc, BaseExceptionGroup):
        assert len(exc.exceptions) == 1
        exc = exc.exceptions[0]
    assert isinstance(exc, SystemExit) and exc.code == 3
    assert not [o for o in outcomes.items if o.outcome in ("failed", "dead_lettered", "retried")]
    # Left unacked, so back in its queue once the worker's channel closed; not dead-lettered.
    await wait_message_count(raw, client.names.job_queue(q), 1)
    await wait_message_count(raw, client.names.dlx_queue(q), 0)
