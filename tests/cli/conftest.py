"""Fixtures of the CLI tests: a fresh OJS queue (deleted afterwards) and an app directory.

The CLI runs as a subprocess, so its tests run on RabbitMQ only (a memory:// broker lives in
one process): ``q`` and the other fixtures that reach the broker take ``rabbitmq_url``,
which marks their tests ``broker``.  The tests that need no broker (help, argument errors,
the registry) take none of them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import ojs_anyio as ojs
from ojs_anyio.jobs import RETRY_LADDER_MS

from .cli_support import delete_queues


@pytest.fixture
def q(rabbitmq_url: str) -> Iterator[str]:
    name = f"tcli{uuid.uuid4().hex[:10]}"
    yield name
    names = ojs.Names()
    delete_queues(
        [
            names.job_queue(name),
            names.dlx_queue(name),
            names.control_queue(name),
            names.redelivered_queue(name),
            names.delay_landing_queue(name),
            *(names.retry_queue(name, ms) for ms in RETRY_LADDER_MS),
        ]
    )


APP = """
import os
import time
import anyio
import ojs_anyio as ojs

QUEUE = os.environ["APP_QUEUE"]
LOG = os.environ.get("APP_LOG", "")
worker = ojs.Worker(queues=[QUEUE], concurrency=int(os.environ.get("APP_CONCURRENCY", "4")), grace_period=20)


def note(kind, ctx):
    if LOG:
        with open(LOG, "a") as f:
            f.write(f"{kind}:{ctx.id}:{os.getpid()}\\n")


@worker.handler("t.work")
async def work(ctx: ojs.JobContext, seconds: float) -> None:
    note("start", ctx)
    await anyio.sleep(seconds)
    note("done", ctx)


@worker.handler("t.sync")
def sync_work(ctx: ojs.JobContext, release: str) -> None:
    # A plain def (runs in a thread): returns once the file release exists (2 min at most).
    note("start", ctx)
    deadline = time.monotonic() + 120
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.02)
    note("done", ctx)


sched = ojs.Scheduler(name=os.environ.get("APP_GROUP", "g"))
sched.add("t.work", "* * * * * *", name="every-second", queue=QUEUE, args=[0])
"""


@pytest.fixture
def app_dir(tmp_path: Path, q: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory holding ``app.py`` (a Worker ``worker`` of queue ``q`` and a Scheduler
    ``sched``); its handlers (``t.work``, async, and ``t.sync``, a plain def) log
    ``start:ID:PID`` / ``done:ID:PID`` lines to $APP_LOG."""
    (tmp_path / "app.py").write_text(APP)
    monkeypatch.setenv("APP_QUEUE", q)
    monkeypatch.setenv("APP_LOG", str(tmp_path / "jobs.log"))
    monkeypatch.setenv("APP_GROUP", f"g{q}")
    return tmp_path
