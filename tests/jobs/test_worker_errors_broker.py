"""A worker survives a failing outcome listener, and a handler that raises SystemExit
(the job is dead-lettered as HANDLER_PANIC; the worker carries on)."""

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


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_system_exit_in_a_handler_is_a_panic_and_the_worker_carries_on(
    client: ojs.Client, raw: amqp.Connection, q: str, sync: bool
) -> None:
    """argparse inside a handler calls sys.exit(): that job is dead-lettered as
    HANDLER_PANIC (the docs' outcome table), and the worker goes on to the next job."""
    worker = ojs.Worker(queues=[q], concurrency=1)
    outcomes = Outcomes(worker)

    def exits(ctx: ojs.JobContext) -> None:
        raise SystemExit(3)

    async def exits_async(ctx: ojs.JobContext) -> None:
        raise SystemExit(3)

    worker.register("exit.job", exits if sync else exits_async)

    @worker.handler("ok.job")
    async def ok(ctx: ojs.JobContext) -> None:
        pass

    async with running(worker, client):
        with anyio.fail_after(WAIT):
            bad = await client.push("exit.job", [], queue=q)
            good = await client.push("ok.job", [], queue=q)
        dead = await outcomes.wait_final(bad.id)
        assert (await outcomes.wait_final(good.id)).outcome == "completed"
    assert dead.outcome == "dead_lettered" and dead.error_code == "HANDLER_PANIC"
    assert "SystemExit" in (dead.error_message or "")
    await wait_message_count(raw, client.names.dlx_queue(q), 1)
    await wait_message_count(raw, client.names.job_queue(q), 0)
