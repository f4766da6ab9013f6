"""Job latency at a light, steady load: push → handler start and push → ack, p50/p99/max.

::

    python3 benchmarks/latency.py [--rate 200] [--seconds 20] [--backends asyncio,trio]
    python3 benchmarks/latency.py --smoke        # 50 jobs/s for 1 s, a few seconds in all

Per backend, in one process: a client pushes no-op jobs at ``--rate`` jobs/s for
``--seconds`` (each push in its own task, started on a fixed schedule, so a slow confirm
does not delay the next push), and a ``Worker(concurrency=--concurrency)`` on another
connection runs them.  Each job carries the wall-clock time its push started; the handler
records when it starts (push → start), and an outcome listener when the worker reported
it, which is after its ``Basic.Ack`` was written or queued for the batched flush
(push → ack).  The first ``--warmup`` jobs are not counted.  Throughput is not the point:
at this rate every system is idle most of the time, and what is measured is the path one
job takes through the client, the broker and the worker.

The machine's load shows in the tail (p99, max): run it on a quiet machine, and read the
p50 first.  Peers are not measured yet (issue 29 asks for them in the same run).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from typing import Any

import anyio

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import ojs_anyio as ojs
from ojs_anyio import amqp

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"


def percentile(values: list[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


async def measure(
    url: str, rate: float, seconds: float, concurrency: int, warmup: int
) -> dict[str, list[float]]:
    """One backend's run: the latencies in ms, by path (``start``, ``ack``)."""
    total = warmup + max(1, round(rate * seconds))
    q = f"latency-{uuid.uuid4().hex[:10]}"
    started: dict[str, float] = {}
    acked: dict[str, float] = {}
    pushed_at: dict[str, float] = {}
    done = anyio.Event()
    worker = ojs.Worker(queues=[q], concurrency=concurrency, heartbeat_interval=3600.0)

    @worker.handler("latency.noop")
    async def noop(ctx: ojs.JobContext, at: float) -> None:
        started[ctx.id] = time.time()
        pushed_at[ctx.id] = at

    def on_outcome(outcome: ojs.JobOutcome) -> None:
        if outcome.job_id is not None and outcome.outcome == "completed":
            acked[outcome.job_id] = time.time()
            if len(acked) == total:
                done.set()

    worker.add_listener(on_outcome)
    async with ojs.connect(url) as client, ojs.connect(url) as consumer:
        await client.declare_queue(q)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.run, consumer)
                await worker.wait_ready()

                async def push_one() -> None:
                    await client.push("latency.noop", [time.time()], queue=q)

                t0 = anyio.current_time()
                async with anyio.create_task_group() as pushers:
                    for i in range(total):
                        delay = t0 + i / rate - anyio.current_time()
                        if delay > 0:
                            await anyio.sleep(delay)  # a steady load's schedule (not a synchronisation)
                        pushers.start_soon(push_one)
                with anyio.fail_after(max(30.0, 2 * seconds)):
                    await done.wait()
                worker.stop()
        finally:
            ch = await client.channel()
            names = client.names
            for name in (names.job_queue(q), names.dlx_queue(q), names.control_queue(q),
                         names.redelivered_queue(q)):  # fmt: skip
                try:
                    await ch.queue_delete(name)
                except amqp.AMQPError:
                    pass
    order = sorted(pushed_at, key=pushed_at.__getitem__)[warmup:]
    return {
        "start": [1000 * (started[j] - pushed_at[j]) for j in order],
        "ack": [1000 * (acked[j] - pushed_at[j]) for j in order],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--url", default=os.environ.get("OJS_AMQP_URL", DEFAULT_URL))
    ap.add_argument("--rate", type=float, default=None, help="jobs per second (default 200; 50 with --smoke)")
    ap.add_argument("--seconds", type=float, default=None, help="seconds of pushing (20; 1 with --smoke)")
    ap.add_argument("--concurrency", type=int, default=10, help="the worker's concurrency (default 10)")
    ap.add_argument("--warmup", type=int, default=None, help="jobs not counted (default 50; 5 with --smoke)")
    ap.add_argument("--backends", default="asyncio,trio")
    ap.add_argument("--smoke", action="store_true", help="50 jobs/s for 1 s: a check that it runs")
    args = ap.parse_args(argv)
    rate = args.rate or (50.0 if args.smoke else 200.0)
    seconds = args.seconds or (1.0 if args.smoke else 20.0)
    warmup = args.warmup if args.warmup is not None else (5 if args.smoke else 50)
    results: dict[str, dict[str, Any]] = {}
    for backend in [b for b in args.backends.split(",") if b]:
        c = args.concurrency
        print(f"ojs-anyio/{backend}: {rate:g} jobs/s for {seconds:g} s, concurrency {c}", file=sys.stderr)
        results[backend] = anyio.run(measure, args.url, rate, seconds, c, warmup, backend=backend)
    load = os.getloadavg()[0]
    print(f"\njob latency in ms at {rate:g} jobs/s for {seconds:g} s (first {warmup} jobs not counted), "
          f"concurrency {args.concurrency}; load average {load:.2f} on {os.cpu_count()} CPUs")  # fmt: skip
    print(f"{'system':<18}{'path':<16}{'n':>7}{'p50':>9}{'p99':>9}{'max':>9}")
    for backend, paths in results.items():
        for path, label in (("start", "push → start"), ("ack", "push → ack")):
            values = paths[path]
            print(f"{'ojs/' + backend:<18}{label:<16}{len(values):>7}{statistics.median(values):>9.2f}"
                  f"{percentile(values, 99):>9.2f}{max(values):>9.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
