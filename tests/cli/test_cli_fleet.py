"""A supervised fleet (``ojs-anyio worker --processes 2``) against one bad job (issue 23).

* A hostile message in front of 2,000 good jobs: every good job completes, the poison is
  dead-lettered once, and no worker process restarts.
* A job that kills its worker process (``os._exit``): it is dead-lettered as WORKER_LOST
  after ``max_deliveries`` deliveries, every other job completes, and the supervisor keeps
  the fleet up (it gives up after 10 restarts a minute).
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest

import ojs_anyio as ojs
from ojs_anyio import amqp
from ojs_anyio.jobs import RETRY_LADDER_MS

from .cli_support import delete_queues, lines, queue_count, reaped, spawn_cli, wait_for

APP = """
import os
import ojs_anyio as ojs

QUEUE = os.environ["APP_QUEUE"]
LOG = os.environ["APP_LOG"]
worker = ojs.Worker(queues=[QUEUE], concurrency=4, max_deliveries=3, grace_period=5)


def note(kind, ctx):
    with open(LOG, "a") as f:
        f.write(f"{kind}:{ctx.id}:{os.getpid()}\\n")


@worker.handler("f.ok")
async def ok(ctx: ojs.JobContext) -> None:
    note("done", ctx)


@worker.handler("f.exit")
async def kills_its_process(ctx: ojs.JobContext) -> None:
    note("exit", ctx)
    os._exit(1)  # a segfault in a C extension, the OOM killer: the process is gone
"""


@pytest.fixture
def fleet(rabbitmq_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, str]]:
    q = f"tfleet{uuid.uuid4().hex[:10]}"
    (tmp_path / "app.py").write_text(APP)
    monkeypatch.setenv("APP_QUEUE", q)
    monkeypatch.setenv("APP_LOG", str(tmp_path / "jobs.log"))
    yield tmp_path, q
    names = ojs.Names()
    delete_queues([
        names.job_queue(q), names.dlx_queue(q), names.control_queue(q), names.redelivered_queue(q),
        *(names.retry_queue(q, ms) for ms in RETRY_LADDER_MS),
    ])  # fmt: skip


def push(q: str, poison: tuple[bytes, amqp.BasicProperties] | None, kinds: list[str]) -> list[str]:
    """The poison first (a raw publish), then one job of each kind in ``kinds``."""

    async def go() -> list[str]:
        async with ojs.connect() as client:
            await client.declare_queue(q)
            if poison is not None:
                async with client.conn.channel() as ch:
                    await ch.publish(poison[0], routing_key=client.names.job_queue(q), properties=poison[1])
            jobs = [client.build(kind, [], queue=q) for kind in kinds]
            results = await client.push_batch(jobs)
            assert all(r.ok for r in results)
            return [j.id for j in jobs]

    ids: list[str] = anyio.run(go)
    return ids


@contextmanager
def explained(out: Path) -> Iterator[None]:
    """A failed wait says what the supervisor and its workers printed."""
    try:
        yield
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the fleet printed:\n{out.read_text()[-4000:]}") from None


def logged(log: Path, kind: str) -> list[str]:
    return [line.split(":")[1] for line in lines(log) if line.startswith(kind + ":")]


def test_a_poison_message_in_front_of_2000_jobs_stops_no_worker(fleet: tuple[Path, str]) -> None:
    app, q = fleet
    log, out = app / "jobs.log", app / "sup.out"
    job = ojs.new_job("f.ok", [], queue=q)
    props = amqp.BasicProperties(message_id=job.id, headers={"x-ojs-attempt": 2**31 - 1})
    poison = (ojs.encode_job(job), props)
    ids = push(q, poison, ["f.ok"] * 2000)
    sup = spawn_cli("worker", "app:worker", "--processes", "2", cwd=app, log=out)
    with reaped(sup), explained(out):
        wait_for(lambda: len(logged(log, "done")) >= 2000, 90, "2,000 jobs done")
        wait_for(lambda: queue_count(f"ojs.queue.dlx.{q}") == 1, 30, "the poison in the DLQ")
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(timeout=60) == 0, out.read_text()[-3000:]
    assert sorted(logged(log, "done")) == sorted(ids)  # each good job once, the poison never
    text = out.read_text()
    assert text.count("outcome=dead_lettered code=INVALID_PAYLOAD") == 1
    assert "restarting" not in text and text.count("started (pid") == 2


def test_a_job_that_kills_its_process_is_dead_lettered_as_worker_lost(fleet: tuple[Path, str]) -> None:
    app, q = fleet
    log, out = app / "jobs.log", app / "sup.out"
    [killer, *ids] = push(q, None, ["f.exit"] + ["f.ok"] * 200)
    sup = spawn_cli("worker", "app:worker", "--processes", "2", cwd=app, log=out)
    with reaped(sup), explained(out):
        wait_for(lambda: queue_count(f"ojs.queue.dlx.{q}") == 1, 90, "the killer job in the DLQ")
        wait_for(lambda: len(logged(log, "done")) >= 200, 60, "every other job done")
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(timeout=60) == 0, out.read_text()[-3000:]
    text = out.read_text()
    assert logged(log, "exit") == [killer] * 3  # max_deliveries=3: three processes lost, no fourth
    assert f"job {killer}" in text and "code=WORKER_LOST" in text
    assert sorted(set(logged(log, "done"))) == sorted(ids)
    assert text.count("restarting") == 3  # the fleet kept going
