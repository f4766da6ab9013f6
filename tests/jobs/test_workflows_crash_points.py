"""A worker process SIGKILLed at exactly the moments that could lose or double a workflow's
successor (docs/workflows.md, "Guarantees"): each successor still runs exactly once.

* ``fire``: the guard (a chain step's permit, a batch's fan-in lock) is taken and the
  successor's messages are published in the transaction, not committed.  The kill rolls
  them back and returns the guard (and the token): the job is redelivered to the next
  worker, which fires.  (Before the transaction, a claim then a publish: a kill between
  the two left the key claimed and the successor never pushed.)
* ``fired``: committed, the job not acknowledged yet: the repeat finds the guard spent and
  pushes nothing.

The worker kills itself at the point, through the test hook
``_workflow_progress.crash_point``, once (a marker file); a second worker finishes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from support.brokers import RABBITMQ_URL as URL

import ojs_anyio as ojs
from ojs_anyio import amqp
from ojs_anyio.jobs._workflows import workflow_queues

from .test_workflows_crash import counts, drain_types, logged, wait_for

pytestmark = pytest.mark.usefixtures("rabbitmq_url")

ROOT = Path(__file__).resolve().parents[2]

APP = """
import os, signal, sys
import anyio
import ojs_anyio as ojs
from ojs_anyio.jobs import _workflow_progress

QUEUE, LOG, URL, POINT, MARKER = sys.argv[1:6]
fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT)


def note(line):
    os.write(fd, (line + "\\n").encode())


async def crash(point):
    if point == POINT and not os.path.exists(MARKER):
        open(MARKER, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)


_workflow_progress.crash_point = crash


async def main():
    async with ojs.connect(URL) as client:
        worker = ojs.Worker(queues=[QUEUE], concurrency=4, middleware=[ojs.WorkflowMiddleware(client)])

        @worker.handler("cp.work")
        async def work(ctx, i):
            note(f"work {i}")
            return i

        # A successor delivered to the first process before it kills itself (between the
        # commit and the kill) waits, unacked, and is redelivered: each line below is one
        # push of it, not a rerun of a delivery the kill interrupted.
        @worker.handler("cp.next")
        async def next_step(ctx):
            if not os.path.exists(MARKER):
                await anyio.sleep_forever()
            note(f"next {sorted(ctx.parent_results.items())}")

        @worker.handler("cp.complete")
        async def complete(ctx):
            if not os.path.exists(MARKER):
                await anyio.sleep_forever()
            note(f"complete {sorted(ctx.parent_results.items())}")

        async with anyio.create_task_group() as tg:
            tg.start_soon(stop_on_sigterm, worker)
            tg.start_soon(worker.run, client)
            await worker.wait_ready()
            open(f"{LOG}.ready.{os.getpid()}", "w").close()


async def stop_on_sigterm(worker):
    with anyio.open_signal_receiver(signal.SIGTERM) as signals:
        async for _ in signals:
            worker.stop()
            return


anyio.run(main)
"""


@pytest.fixture
def queue() -> Iterator[tuple[str, list[str]]]:
    q = f"tcpoint{uuid.uuid4().hex[:10]}"
    extra: list[str] = []
    yield q, extra

    async def cleanup() -> None:
        names = ojs.Names()
        async with amqp.connect(URL) as conn, conn.channel(confirms=False) as ch:
            for name in [names.job_queue(q), names.dlx_queue(q), names.redelivered_queue(q), *extra]:
                await ch.queue_delete(name)

    anyio.run(cleanup)


def spawn(app: Path, args: list[str], out: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "codec")]))
    with open(out, "ab") as sink:
        return subprocess.Popen(
            [sys.executable, str(app), *args], env=env, stdout=sink, stderr=subprocess.STDOUT
        )


@pytest.mark.parametrize("point", ["fire", "fired"])
@pytest.mark.parametrize("shape", ["chain", "batch"])
def test_a_kill_at_the_fire_point_neither_loses_nor_doubles_the_successor(
    tmp_path: Path, queue: tuple[str, list[str]], point: str, shape: str
) -> None:
    q, extra = queue
    app, log, out, marker = tmp_path / "app.py", tmp_path / "jobs.log", tmp_path / "out", tmp_path / "killed"
    app.write_text(APP)
    args = [q, str(log), URL, point, str(marker)]
    first = spawn(app, args, out)
    second: subprocess.Popen[bytes] | None = None
    try:
        wait_for(Path(f"{log}.ready.{first.pid}").exists, 30, "the first worker ready")

        async def start() -> None:
            async with ojs.connect(URL) as client:
                if shape == "chain":
                    wf: ojs.Chain | ojs.Batch = ojs.chain(
                        ojs.step("cp.work", [7], queue=q), ojs.step("cp.next", queue=q)
                    )
                else:
                    wf = ojs.batch(
                        [ojs.step("cp.work", [i], queue=q) for i in range(3)],
                        on_complete=ojs.step("cp.complete", queue=q),
                    )
                handle = await client.start_workflow(wf)
                extra.extend(workflow_queues("", handle.envelope))

        anyio.run(start)
        assert first.wait(timeout=30) == -signal.SIGKILL, out.read_text()[-3000:]
        assert marker.exists()
        second = spawn(app, args, out)
        successor = "next " if shape == "chain" else "complete "
        wait_for(lambda: any(line.startswith(successor) for line in logged(log)), 30, "the successor")
        names = ojs.Names()
        wait_for(lambda: counts(names.job_queue(q), names.redelivered_queue(q)) == [0, 0], 30, "empty queues")
        wait_for(Path(f"{log}.ready.{second.pid}").exists, 30, "the second worker ready")
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0, out.read_text()[-3000:]
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    lines = logged(log)
    if shape == "chain":
        assert [line for line in lines if line.startswith("next ")] == ["next [('0', 7)]"]
    else:
        expected = "complete [('0', 0), ('1', 1), ('2', 2)]"
        assert [line for line in lines if line.startswith("complete ")] == [expected]
    assert set(drain_types(names.job_queue(q), names.redelivered_queue(q))) <= {"cp.work"}
    assert counts(names.dlx_queue(q)) == [0]
