"""What being in a workflow costs (docs/workflows.md), in one run against one broker.

* ``plain``: N no-op jobs pushed one by one, drained by one worker (concurrency 50): the
  time from the first push to the last job done, per job;
* ``batch``: the same N jobs as one ``ojs.batch`` with an ``on_complete`` callback: from
  ``client.batch(...)`` to the callback's start, per job (the difference to ``plain`` is
  the per-job overhead: a claimed, deterministic push, a confirmed record and a token);
* ``chain``: a chain of ``N / 10`` steps, per step, against ``plain-seq``: as many jobs
  pushed one at a time, each after the previous one is done (what a chain replaces);
* ``fan-in latency``: ``--batches`` batches of 10 jobs, from the last job's handler return
  to its batch's callback start, p50 and p99 in ms.

Usage::

    python3 benchmarks/workflows.py [--n 2000] [--batches 50] [--backend asyncio|trio]
                                    [--url amqp://guest:guest@127.0.0.1:5672/] [--smoke]

Wall-clock figures, as noisy as the machine: not timed assertions.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import Any

import anyio

import ojs_anyio as ojs
from ojs_anyio import amqp
from ojs_anyio.jobs._workflows import workflow_queues

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"


class Bench:
    def __init__(self, client: ojs.Client, q: str) -> None:
        self.client, self.q = client, q
        self.worker = ojs.Worker(queues=[q], concurrency=50, middleware=[ojs.WorkflowMiddleware(client)])
        self.done = 0
        self.target = -1
        self.all_done = anyio.Event()
        self.last_return = 0.0
        self.callbacks: list[tuple[float, float]] = []  # (callback start, last job return)
        self.callback_seen = anyio.Event()
        self.handles: list[Any] = []

        async def job(ctx: ojs.JobContext, *args: Any) -> int:
            self.last_return = time.perf_counter()
            self.done += 1
            if self.done == self.target:
                self.all_done.set()
            return 1

        async def callback(ctx: ojs.JobContext) -> None:
            self.callbacks.append((time.perf_counter(), self.last_return))
            self.callback_seen.set()

        self.worker.register("bench.job", job)
        self.worker.register("bench.callback", callback)

    def expect(self, n: int) -> None:
        self.done, self.target, self.all_done = 0, n, anyio.Event()

    async def wait_callback(self) -> None:
        await self.callback_seen.wait()
        self.callback_seen = anyio.Event()

    def step(self) -> ojs.Step:
        return ojs.step("bench.job", queue=self.q)

    async def plain(self, n: int) -> float:
        self.expect(n)
        started = time.perf_counter()
        for _ in range(n):
            await self.client.push("bench.job", queue=self.q)
        await self.all_done.wait()
        return (time.perf_counter() - started) / n

    async def batch(self, n: int) -> float:
        started = time.perf_counter()
        self.handles.append(
            await self.client.batch(
                [self.step() for _ in range(n)], on_complete=ojs.step("bench.callback", queue=self.q)
            )
        )
        await self.wait_callback()
        return (time.perf_counter() - started) / n

    async def plain_sequential(self, n: int) -> float:
        started = time.perf_counter()
        for _ in range(n):
            self.expect(1)
            await self.client.push("bench.job", queue=self.q)
            await self.all_done.wait()
        return (time.perf_counter() - started) / n

    async def chain(self, n: int) -> float:
        self.expect(n)
        started = time.perf_counter()
        self.handles.append(await self.client.chain(*(self.step() for _ in range(n))))
        await self.all_done.wait()
        return (time.perf_counter() - started) / n

    async def fan_in(self, batches: int) -> list[float]:
        self.callbacks.clear()
        for _ in range(batches):
            self.handles.append(
                await self.client.batch(
                    [self.step() for _ in range(10)], on_complete=ojs.step("bench.callback", queue=self.q)
                )
            )
            await self.wait_callback()
        return [(start - last) * 1000 for start, last in self.callbacks]


async def main(args: argparse.Namespace) -> None:
    q = f"bwf{uuid.uuid4().hex[:10]}"
    async with ojs.connect(args.url) as client:
        bench = Bench(client, q)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(bench.worker.run, client)
                await bench.worker.wait_ready()
                plain = await bench.plain(args.n)
                in_batch = await bench.batch(args.n)
                steps = max(2, args.n // 10)
                seq = await bench.plain_sequential(steps)
                in_chain = await bench.chain(steps)
                latencies = await bench.fan_in(args.batches)
                bench.worker.stop()
        finally:
            with anyio.CancelScope(shield=True):
                await _cleanup(args.url, client, q, bench.handles)
    lat = sorted(latencies)
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    print(f"broker {args.url.split('@')[-1]}  backend {args.backend}  N={args.n}")
    print(f"  plain       {plain * 1e6:9.0f} µs/job")
    print(f"  batch       {in_batch * 1e6:9.0f} µs/job   overhead {(in_batch - plain) * 1e6:+.0f} µs/job")
    print(f"  plain-seq   {seq * 1e6:9.0f} µs/job   ({steps} jobs, one after another)")
    print(f"  chain       {in_chain * 1e6:9.0f} µs/step  overhead {(in_chain - seq) * 1e6:+.0f} µs/step")
    print(
        f"  fan-in latency ({len(lat)} batches of 10): p50 {statistics.median(lat):.2f} ms  p99 {p99:.2f} ms"
    )


async def _cleanup(url: str, client: ojs.Client, q: str, handles: list[Any]) -> None:
    names = client.names
    queues = [names.job_queue(q), names.dlx_queue(q), names.redelivered_queue(q)]
    for handle in handles:
        queues += workflow_queues(names.prefix, handle.envelope)
    async with amqp.connect(url) as conn, conn.channel(confirms=False) as ch:
        for name in queues:
            await ch.queue_delete(name)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--n", type=int, help="jobs of the plain and batch rounds (default 2000; 50 with --smoke)"
    )
    ap.add_argument(
        "--batches", type=int, help="batches of the fan-in latency round (default 50; 5 with --smoke)"
    )
    ap.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    ap.add_argument("--url", default=DEFAULT_URL)
    ap.add_argument("--smoke", action="store_true", help="tiny N (a quick check that it runs)")
    parsed = ap.parse_args()
    parsed.n = parsed.n or (50 if parsed.smoke else 2000)
    parsed.batches = parsed.batches or (5 if parsed.smoke else 50)
    anyio.run(main, parsed, backend=parsed.backend)
