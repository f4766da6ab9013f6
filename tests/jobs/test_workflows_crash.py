"""A batch whose worker processes are SIGKILLed at random points (docs/workflows.md): every
callback fires exactly once and no job is lost.

Two worker processes (``WorkflowMiddleware``) run a batch of 300 jobs with ``on_complete``
and ``on_success``; the test kills one of them with SIGKILL three times, at random moments
(whatever it held: a handler, a record publish, a token, a callback push), and starts a new
one each time.  Once both callbacks ran and the queues are empty, the workers stop
gracefully; what is left in the queues are repeats of jobs, never a callback, and the log
says: each job index ran at least once, each callback once, and
each callback saw all 300 results.
"""

from __future__ import annotations

import functools
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.brokers import RABBITMQ_URL as URL

import ojs_anyio as ojs
from ojs_anyio import amqp
from ojs_anyio.jobs._workflows import workflow_queues

pytestmark = pytest.mark.usefixtures("rabbitmq_url")

ROOT = Path(__file__).resolve().parents[2]
JOBS = 300
KILLS = 3

APP = """
import functools, os, random, signal, sys
import anyio
import ojs_anyio as ojs

QUEUE, LOG, URL = sys.argv[1], sys.argv[2], sys.argv[3]
fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT)


def note(line):
    os.write(fd, (line + "\\n").encode())  # one write(2) each: whole lines, even on SIGKILL


async def main():
    async with ojs.connect(URL) as client:
        worker = ojs.Worker(
            queues=[QUEUE], concurrency=16, max_deliveries=1000,
            middleware=[ojs.WorkflowMiddleware(client)],
        )

        @worker.handler("crash.work")
        async def work(ctx, i):
            await anyio.sleep(random.uniform(0, 0.05))
            note(f"done {i}")
            return i

        async def callback(name, ctx):  # partial(callback, name) is the handler
            results = ctx.parent_results
            note(f"cb {name} {len(results)} {sum(results.values())}")

        worker.register("crash.complete", functools.partial(callback, "complete"))
        worker.register("crash.success", functools.partial(callback, "success"))
        async with anyio.create_task_group() as tg:
            tg.start_soon(stop_on_sigterm, worker)
            tg.start_soon(worker.run, client)
            await worker.wait_ready()
            open(f"{LOG}.ready.{os.getpid()}", "w").close()  # SIGTERM now stops it gracefully


async def stop_on_sigterm(worker):
    with anyio.open_signal_receiver(signal.SIGTERM) as signals:
        async for _ in signals:
            worker.stop()  # graceful: running jobs finish and are acked
            return


anyio.run(main)
"""


def spawn(app: Path, q: str, log: Path, out: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "codec")]))
    with open(out, "ab") as sink:
        return subprocess.Popen(
            [sys.executable, str(app), q, str(log), URL], env=env, stdout=sink, stderr=subprocess.STDOUT
        )


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll observable state (the log, queue counts) until true; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)
    return value


def lines_at_least(log: Path, count: int) -> bool:
    return len(logged(log)) >= count


def logged(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def counts(*names: str) -> list[int]:
    async def go() -> list[int]:
        async with amqp.connect(URL) as conn, conn.channel(confirms=False) as ch:
            return [(await ch.queue_declare(n, passive=True)).message_count for n in names]

    result: list[int] = anyio.run(go)
    return result


def drain_types(*names: str) -> list[str]:
    async def go() -> list[str]:
        out = []
        async with amqp.connect(URL) as conn, conn.channel(confirms=False) as ch:
            for name in names:
                while (msg := await ch.get(name)) is not None:
                    out.append(str(msg.properties.type))
                    await msg.ack()
        return out

    result: list[str] = anyio.run(go)
    return result


@pytest.fixture
def queue() -> Iterator[tuple[str, list[str]]]:
    q = f"tcrash{uuid.uuid4().hex[:10]}"
    extra: list[str] = []
    yield q, extra

    async def cleanup() -> None:
        names = ojs.Names()
        async with amqp.connect(URL) as conn, conn.channel(confirms=False) as ch:
            for name in [names.job_queue(q), names.dlx_queue(q), names.redelivered_queue(q), *extra]:
                await ch.queue_delete(name)

    anyio.run(cleanup)


def test_batch_callbacks_fire_once_when_workers_are_killed(
    tmp_path: Path, queue: tuple[str, list[str]]
) -> None:
    q, extra = queue
    app, log, out = tmp_path / "app.py", tmp_path / "jobs.log", tmp_path / "workers.out"
    app.write_text(APP)
    rng = random.Random()
    workers = [spawn(app, q, log, out) for _ in range(2)]
    try:

        async def start() -> None:
            async with ojs.connect(URL) as client:
                handle = await client.batch(
                    [ojs.step("crash.work", [i], queue=q) for i in range(JOBS)],
                    on_complete=ojs.step("crash.complete", queue=q),
                    on_success=ojs.step("crash.success", queue=q),
                )
                extra.extend(workflow_queues("", handle.envelope))

        anyio.run(start)
        # Kill points: after a random number of finished jobs (a random point of a worker's
        # work: in a handler, a record publish, a token, a callback push...).
        for mark in sorted(rng.sample(range(10, JOBS), KILLS)):
            wait_for(functools.partial(lines_at_least, log, mark), 30, f"{mark} log lines")
            victim = rng.randrange(len(workers))
            workers[victim].send_signal(signal.SIGKILL)
            workers[victim].wait(timeout=10)
            workers[victim] = spawn(app, q, log, out)
        names = ojs.Names()
        wait_for(lambda: sum(line.startswith("cb ") for line in logged(log)) >= 2, 45, "both callbacks")
        wait_for(lambda: counts(names.job_queue(q), names.redelivered_queue(q)) == [0, 0], 30, "empty queues")
        for w in workers:  # a process started after a kill may still be starting up
            wait_for(Path(f"{log}.ready.{w.pid}").exists, 30, f"worker {w.pid} ready")
        for w in workers:
            w.send_signal(signal.SIGTERM)  # a graceful stop
        for w in workers:
            assert w.wait(timeout=30) == 0, out.read_text()[-3000:]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait(timeout=30)
    lines = logged(log)
    done = {int(line.split()[1]) for line in lines if line.startswith("done ")}
    callbacks = sorted(line for line in lines if line.startswith("cb "))
    total = sum(range(JOBS))
    assert done == set(range(JOBS))
    assert callbacks == [f"cb complete {JOBS} {total}", f"cb success {JOBS} {total}"], callbacks
    # What a stopped worker had prefetched is back in its queue: repeats of jobs (at least
    # once), never a second callback.
    left = drain_types(names.job_queue(q), names.redelivered_queue(q))
    assert set(left) <= {"crash.work"}, left
    assert counts(names.dlx_queue(q)) == [0]
