"""The FastAPI recipe under ``uvicorn --workers 2`` with an ``ojs-anyio worker`` process:
every result pushed through ``POST /reports`` is found by ``GET /reports/{id}``, whichever
uvicorn process answers (issue 27: 5 of 8 were lost before results could be read from any
process).  Real processes on RabbitMQ; every wait bounded."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import date
from decimal import Decimal
from pathlib import Path

import anyio
import anyio.abc
import httpx
import pytest
from support.brokers import RABBITMQ_URL as URL

from .broker_support import ProcessLog

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
#: Bound on starting a process, and on each request.
START = 60.0
JOBS = 24


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def _process(
    command: Sequence[str], env: dict[str, str], ready: str, count: int
) -> AsyncIterator[ProcessLog]:
    """Start ``command``; yield once its stderr showed ``ready`` ``count`` times; on exit
    SIGTERM it (SIGKILL after a bounded wait)."""
    process = await anyio.open_process(list(command), cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    log = ProcessLog()
    try:
        async with anyio.create_task_group() as tg:
            assert process.stderr is not None
            tg.start_soon(log.read, process.stderr)
            try:
                with anyio.fail_after(START):
                    await log.wait_for(ready, count)
                yield log
            finally:
                with anyio.CancelScope(shield=True):
                    process.send_signal(signal.SIGTERM)
                    with anyio.move_on_after(30):
                        await process.wait()
                    if process.returncode is None:
                        process.kill()
                        await process.wait()
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await process.aclose()


def _expected(region: str, day: date) -> dict[str, object]:
    orders = len(region) * day.day
    return {
        "day": day.isoformat(),
        "region": region,
        "orders": orders,
        "total": str(Decimal(orders) * Decimal("9.99")),
    }


@pytest.mark.rabbitmq_only("uvicorn and the worker are separate processes; memory:// lives in one")
async def test_two_uvicorn_processes_find_every_result(new_queue: Callable[..., str]) -> None:
    q = new_queue()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "codec")]),
        "OJS_AMQP_URL": URL,
        "OJS_EXAMPLE_QUEUE": q,
    }
    port = _free_port()
    uvicorn = [
        sys.executable, "-m", "uvicorn", "docs.examples.fastapi_app:app",
        "--host", "127.0.0.1", "--port", str(port), "--workers", "2",
    ]  # fmt: skip
    worker = [sys.executable, "-m", "ojs_anyio.cli", "worker", "docs.examples.fastapi_app:worker"]
    regions = ["north", "south", "east-coast", "west"]
    async with (
        _process(worker, env, r"worker \S+ starting: queues=", 1),
        _process(uvicorn, env, "Application startup complete", 2),
        # A connection per request (no keep-alive), so the kernel spreads them over both
        # uvicorn processes; the one that reads a result is often not the one that pushed.
        httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}",
            timeout=START,
            limits=httpx.Limits(max_keepalive_connections=0),
        ) as http,
    ):
        wanted: dict[str, dict[str, object]] = {}
        for i in range(JOBS):
            day = date(2026, 11, 1 + i)
            region = regions[i % len(regions)]
            response = await http.post("/reports", json={"day": day.isoformat(), "region": region})
            assert response.status_code == 202, response.text
            wanted[response.json()["job_id"]] = _expected(region, day)
        found: dict[str, dict[str, object]] = {}
        with anyio.fail_after(START):
            for job_id in wanted:
                while job_id not in found:  # 202 "pending" until it ran; each call waits ≤ 10 s
                    response = await http.get(f"/reports/{job_id}", params={"wait": 10})
                    assert response.status_code in (200, 202), response.text
                    if response.status_code == 200:
                        found[job_id] = response.json()
        # Model validation on the way out: a bad body is refused before any job is pushed.
        refused = await http.post("/reports", json={"day": "2026-11-01", "region": "X!"})
        assert refused.status_code == 422
        unknown = await http.get("/reports/not-a-job-id", params={"wait": 1})
        assert unknown.status_code == 404
    assert found == wanted
