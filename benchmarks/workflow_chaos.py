"""Workflow chaos: a batch of N jobs while worker processes are SIGKILLed at random points
and every connection is cut; every callback must fire exactly once and no job be lost.

    python3 benchmarks/workflow_chaos.py [--jobs 2000] [--kills 4] [--cuts 4] [--runs 1]
                                         [--target 127.0.0.1:5672] [--quorum]
                                         [--stop-node a] [--smoke]

Two worker processes (``WorkflowMiddleware``, concurrency 16) reach the broker through a
fault-injecting TCP proxy (``tests/harness``).  The script starts a batch of ``--jobs``
jobs with ``on_complete`` and ``on_success``; while it runs, at random moments (after a
random number of finished jobs), it SIGKILLs one worker process (and starts a new one) or
cuts every proxied connection (the workers reconnect).  With ``--stop-node`` (the local
cluster of ``scripts/cluster``, ``--target`` one of its nodes, workers given the whole
cluster's URL), it stops that node's broker halfway and starts it again after the batch.
Then it waits for both callbacks, for the job queues to drain, stops the workers gracefully
and checks, from the workers' log: every job index ran at least once, each callback ran
exactly once with all N results.  It prints one line per run (PASS or FAIL, with the
counts) and exits 1 if a run failed.  ``--smoke``: 200 jobs, 2 kills, 2 cuts.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "codec"), str(ROOT / "tests")]

from harness import FaultProxy  # type: ignore[import-not-found]  # noqa: E402

import ojs_anyio as ojs  # noqa: E402
from ojs_anyio.jobs._workflows import workflow_queues  # noqa: E402

APP = """
import functools, os, random, signal, sys
import anyio
import ojs_anyio as ojs

QUEUE, LOG, URL, QUORUM = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT)


def note(line):
    os.write(fd, (line + "\\n").encode())  # one write(2) each: whole lines, even on SIGKILL


async def main():
    # A cut can land in this process's first connection (it starts while the run cuts):
    # connect() raises that to its caller, as a process supervisor would see it; this one
    # is its own supervisor and connects again.  Once connected, recovery carries it.
    for attempt in range(1, 21):
        connected = []
        try:
            await serve(connected)
            return
        except ojs.amqp.ConnectionLostError:
            if connected or attempt == 20:
                raise
            await anyio.sleep(0.05)  # a back-off, as a supervisor's restart delay


async def serve(connected):
    options = ojs.QueueOptions.quorum() if QUORUM else None
    recovery = ojs.amqp.RecoveryPolicy(initial_delay=0.05, max_delay=0.5)
    async with ojs.connect(URL, queue_options=options, recovery=recovery) as client:
        connected.append(True)
        worker = ojs.Worker(
            queues=[QUEUE], concurrency=16, max_deliveries=1000,
            middleware=[ojs.WorkflowMiddleware(client)],
        )

        @worker.handler("chaos.work")
        async def work(ctx, i):
            await anyio.sleep(random.uniform(0, 0.01))
            note(f"done {i}")
            return i

        async def callback(name, ctx):
            results = ctx.parent_results
            note(f"cb {name} {len(results)} {sum(results.values())}")

        worker.register("chaos.complete", functools.partial(callback, "complete"))
        worker.register("chaos.success", functools.partial(callback, "success"))
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

#: Retries fast and many: a cut during a job's transaction fails that attempt.
RETRY = ojs.RetryPolicy(max_attempts=100, initial_interval=0.05, max_interval=0.5, jitter=True)
WAIT = 240.0


def spawn(app: Path, q: str, log: Path, url: str, quorum: bool, out: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "codec")]))
    with open(out, "ab") as sink:
        return subprocess.Popen(
            [sys.executable, str(app), q, str(log), url, "1" if quorum else "0"],
            env=env, stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip


def output(out: Path) -> str:
    """Where the workers' output is, and its end (their tracebacks), for a failure's message."""
    text = out.read_text(errors="replace") if out.exists() else ""
    return f"the workers' output ({out}) ends:\n{text[-4000:]}"


def logged(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


async def wait_for(predicate: object, what: str, timeout: float = WAIT) -> None:
    """Poll observable state (the log, queue counts, process states); fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not await _check(predicate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        await anyio.sleep(0.05)


async def _check(predicate: object) -> bool:
    value = predicate()  # type: ignore[operator]
    if hasattr(value, "__await__"):
        value = await value
    return bool(value)


def cluster(*args: str) -> str:
    done = subprocess.run(
        [str(ROOT / "scripts" / "cluster"), *args], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


async def one_run(args: argparse.Namespace, rng: random.Random, tmp: Path) -> tuple[bool, str]:
    q = f"chaos{uuid.uuid4().hex[:10]}"
    host, port = args.target.rsplit(":", 1)
    direct = f"amqp://guest:guest@{host}:{port}/"
    app, log, out = tmp / f"{q}.py", tmp / f"{q}.log", tmp / f"{q}.out"
    app.write_text(APP)
    names = ojs.Names()
    extra: list[str] = []
    options = ojs.QueueOptions.quorum() if args.quorum else None
    kills = cuts = 0
    async with FaultProxy(host, int(port)) as proxy:
        url = proxy.url()
        if args.stop_node:  # the proxy fronts one node; the workers may rotate to the others
            others = cluster("url").removeprefix("amqp://guest:guest@").split("/")[0]
            url = f"amqp://guest:guest@127.0.0.1:{proxy.port},{others}/"
        workers = [spawn(app, q, log, url, args.quorum, out) for _ in range(2)]
        try:
            async with ojs.connect(direct, queue_options=options) as client:
                handle = await client.batch(
                    [ojs.step("chaos.work", [i], queue=q, retry=RETRY) for i in range(args.jobs)],
                    on_complete=ojs.step("chaos.complete", queue=q, retry=RETRY),
                    on_success=ojs.step("chaos.success", queue=q, retry=RETRY),
                )
                extra.extend(workflow_queues("", handle.envelope))
                events = ["kill"] * args.kills + ["cut"] * args.cuts
                rng.shuffle(events)
                marks = sorted(rng.sample(range(10, max(11, args.jobs - 10)), len(events)))
                stopped = False
                for mark, event in zip(marks, events, strict=True):
                    await wait_for(lambda m=mark: len(logged(log)) >= m, f"{mark} finished jobs")
                    if args.stop_node and not stopped and mark >= args.jobs // 2:
                        cluster("stop_app", args.stop_node)
                        stopped = True
                    if event == "kill":
                        victim = rng.randrange(len(workers))
                        workers[victim].send_signal(signal.SIGKILL)
                        workers[victim].wait(timeout=10)
                        workers[victim] = spawn(app, q, log, url, args.quorum, out)
                        kills += 1
                    else:
                        proxy.cut_all(reset=rng.random() < 0.5)
                        cuts += 1
                await wait_for(lambda: sum(x.startswith("cb ") for x in logged(log)) >= 2, "both callbacks")
                if stopped:
                    cluster("restart", args.stop_node)

                async def drained() -> bool:
                    ch = await client.channel()
                    for n in (names.job_queue(q), names.redelivered_queue(q)):
                        if (await ch.queue_declare(n, passive=True)).message_count:
                            return False
                    return True

                await wait_for(drained, "empty job queues")
                for w in workers:
                    if w.poll() is not None:
                        raise RuntimeError(f"worker {w.pid} exited with {w.returncode}; {output(out)}")
                    ready = Path(f"{log}.ready.{w.pid}").exists
                    await wait_for(ready, f"worker {w.pid} ready ({output(out)})", 60)
                for w in workers:
                    w.send_signal(signal.SIGTERM)
                for w in workers:
                    await anyio.to_thread.run_sync(w.wait, 60)
                lines = logged(log)
                ch = await client.channel()
                left = 0
                for n in (names.job_queue(q), names.redelivered_queue(q), names.dlx_queue(q)):
                    left += (await ch.queue_declare(n, passive=True)).message_count
                for n in [names.job_queue(q), names.dlx_queue(q), names.redelivered_queue(q), *extra]:
                    await ch.queue_delete(n)
        finally:
            for w in workers:
                if w.poll() is None:
                    w.kill()
                    w.wait(timeout=30)
    done = [int(x.split()[1]) for x in lines if x.startswith("done ")]
    callbacks = sorted(x for x in lines if x.startswith("cb "))
    total = sum(range(args.jobs))
    want = [f"cb complete {args.jobs} {total}", f"cb success {args.jobs} {total}"]
    ok = set(done) == set(range(args.jobs)) and callbacks == want
    text = (
        f"{'PASS' if ok else 'FAIL'} jobs={args.jobs} distinct_done={len(set(done))} runs={len(done)} "
        f"kills={kills} cuts={cuts} node_stopped={args.stop_node or '-'} "
        f"on_complete={sum(x.startswith('cb complete') for x in callbacks)} "
        f"on_success={sum(x.startswith('cb success') for x in callbacks)} "
        f"callbacks_ok={callbacks == want} left_in_queues={left} proxy_cut={proxy.connections_cut}"
    )
    return ok, text


async def main(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    failed = 0
    tmp = Path(tempfile.mkdtemp(prefix="ojs-workflow-chaos-"))
    for run in range(args.runs):
        started = time.monotonic()
        ok, text = await one_run(args, rng, tmp)
        failed += not ok
        print(f"run {run + 1}/{args.runs}: {text} seconds={time.monotonic() - started:.1f}", flush=True)
    if not args.keep and not failed:
        shutil.rmtree(tmp)
    return 1 if failed else 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, help="jobs in the batch (default 2000; 200 with --smoke)")
    ap.add_argument("--kills", type=int, help="worker SIGKILLs per run (default 4; 2 with --smoke)")
    ap.add_argument("--cuts", type=int, help="connection cuts per run (default 4; 2 with --smoke)")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--target", default="127.0.0.1:5672", help="the broker (node) the proxy fronts")
    ap.add_argument("--quorum", action="store_true", help="QueueOptions.quorum() job (and workflow) queues")
    ap.add_argument("--stop-node", help="scripts/cluster node to stop halfway (and restart after)")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--keep", action="store_true", help="keep the workers' logs and output")
    ap.add_argument("--smoke", action="store_true", help="a small run (a quick check that it runs)")
    args = ap.parse_args(argv)
    small = args.smoke
    args.jobs = args.jobs or (200 if small else 2000)
    args.kills = args.kills if args.kills is not None else (2 if small else 4)
    args.cuts = args.cuts if args.cuts is not None else (2 if small else 4)
    return args


if __name__ == "__main__":
    sys.exit(anyio.run(main, parse()))
