"""A Worker made at import time (as in the README, docs/cli.md and typed handles) runs
again and again, on whichever event loop each run uses."""

from __future__ import annotations

import anyio

import ojs_anyio as ojs
from ojs_anyio.testing import job_tester

WORKER = ojs.Worker(queues=["reuse"])  # made outside any event loop
SEEN: list[int] = []


@WORKER.handler("reuse.job")
async def record(ctx: ojs.JobContext, n: int) -> None:
    SEEN.append(n)


async def _run_once(n: int) -> list[str]:
    async with job_tester(worker=WORKER) as jobs:
        await jobs.client.push("reuse.job", [n], queue="reuse")
        return [o.outcome for o in await jobs.drain()]


def test_one_worker_runs_on_asyncio_then_trio_then_asyncio() -> None:
    SEEN.clear()
    outcomes = [
        anyio.run(_run_once, n, backend=backend) for n, backend in enumerate(["asyncio", "trio", "asyncio"])
    ]
    assert outcomes == [["completed"]] * 3
    assert SEEN == [0, 1, 2]
