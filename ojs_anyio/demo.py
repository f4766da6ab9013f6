"""The README's demo: push a few hundred jobs, process them, report what happened.

``python -m ojs_anyio.demo [--backend trio|asyncio] [--url amqp://…] [--memory] [--jobs 300]``

``--memory`` runs it on the in-process ``memory://`` broker: no RabbitMQ needed.

Two job types: ``demo.resize`` (every 10th fails once, then succeeds on retry) and
``demo.notify`` (always succeeds), plus one ``demo.explode`` job that always fails and
ends in the dead-letter queue after its attempts run out.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import anyio
import anyio.lowlevel

import ojs_anyio as ojs

from ._cli._registry import sync_command

QUEUE = "demo"


async def run_demo(url: str | None, n_jobs: int) -> dict[str, int]:
    fast_retry = ojs.RetryPolicy(max_attempts=3, initial_interval="PT0.2S", max_interval="PT1S", jitter=False)
    worker = ojs.Worker(queues=[QUEUE], concurrency=20, retry=fast_retry)
    failed_once: set[str] = set()

    @worker.handler("demo.resize")
    async def resize(ctx: ojs.JobContext, image: str, width: int) -> None:
        if int(image.split("-")[1]) % 10 == 5 and ctx.id not in failed_once:
            failed_once.add(ctx.id)
            raise RuntimeError(f"transient failure resizing {image}")

    @worker.handler("demo.notify")
    async def notify(ctx: ojs.JobContext, user: str) -> None:
        await anyio.lowlevel.checkpoint()

    @worker.handler("demo.explode")
    async def explode(ctx: ojs.JobContext) -> None:
        raise ValueError("this job always fails")

    expected = n_jobs + 1
    done = anyio.Event()
    finished: dict[str, int] = {"completed": 0, "retried": 0, "dead_lettered": 0}
    final = 0

    def on_outcome(outcome: ojs.JobOutcome) -> None:
        nonlocal final
        finished[outcome.outcome] = finished.get(outcome.outcome, 0) + 1
        if outcome.outcome in ("completed", "dead_lettered"):
            final += 1
            if final >= expected:
                done.set()

    worker.add_listener(on_outcome)
    async with ojs.connect(url, retry=fast_retry) as client:
        # The demo's own queues start afresh, whatever an earlier run (or an older version,
        # with other queue arguments) left behind.
        async with client.conn.channel(confirms=False) as ch:
            names = client.names
            for name in (names.job_queue(QUEUE), names.dlx_queue(QUEUE), names.control_queue(QUEUE),
                         names.redelivered_queue(QUEUE)):  # fmt: skip
                await ch.queue_delete(name)
        await client.declare_queue(QUEUE)
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run, client)
            await worker.wait_ready()
            t0 = time.perf_counter()
            jobs = [
                client.build("demo.resize" if i % 2 else "demo.notify",
                             [f"img-{i}", 640] if i % 2 else [f"user-{i}"], queue=QUEUE)
                for i in range(n_jobs)
            ]  # fmt: skip
            results = await client.push_batch(jobs)
            await client.push("demo.explode", [], queue=QUEUE)
            pushed = sum(r.ok for r in results) + 1
            print(f"pushed {pushed} jobs in {time.perf_counter() - t0:.2f}s")
            with anyio.fail_after(60):
                await done.wait()
            worker.stop()
        dead = await client.dead_letters(QUEUE).peek(10)
    elapsed = time.perf_counter() - t0
    print(f"processed in {elapsed:.2f}s: completed={finished['completed']} "
          f"retried={finished['retried']} dead-lettered={finished['dead_lettered']}")  # fmt: skip
    for d in dead:
        print(f"  in ojs.queue.dlx.{QUEUE}: job {d.id} type={d.type}")
        print(f"      code={d.error_code} reason={d.error_message}")
    return finished


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's flags, shared by ``python -m ojs_anyio.demo`` and ``ojs-anyio demo``."""
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument(
        "--url", default=None, help="AMQP URL (default: $OJS_AMQP_URL or amqp://guest:guest@localhost/)"
    )
    parser.add_argument(
        "--memory", action="store_true", help="use the in-process memory:// broker (no RabbitMQ needed)"
    )
    parser.add_argument("--jobs", type=int, default=300, help="how many jobs to push (default 300)")
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log every job outcome, with the tracebacks of the failures the demo causes",
    )


@sync_command(
    "demo",
    help="push and process a few hundred demo jobs",
    description="Push and process demo jobs, then report what happened.",
    arguments=add_arguments,
    broker=False,
)
def run(args: argparse.Namespace) -> int:
    if args.jobs < 1:
        print("--jobs must be 1 or more", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    if not args.verbose:
        # The demo fails jobs on purpose; the worker logs each failed attempt (WARNING) and
        # the dead letter (ERROR) with its traceback.  By default the summary below says it
        # all; -v shows every log line and traceback.
        logging.getLogger("ojs_anyio.worker").setLevel(logging.CRITICAL)
    url = "memory://demo" if args.memory else args.url
    finished = anyio.run(run_demo, url, args.jobs, backend=args.backend)
    ok = finished["completed"] == args.jobs and finished["dead_lettered"] == 1
    print("demo OK" if ok else "demo FAILED")
    if not args.verbose:
        print("(-v shows the worker's log: each failed attempt and the dead letter, with tracebacks)")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ojs_anyio.demo",
        description="Push a few hundred demo jobs, process them, and report what happened.",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
