"""What the job API's extras cost: middleware, per-job-type metrics, and results.

One run, both backends, rounds interleaved so drift in the machine's load hits every
configuration alike; each figure is the median of ``--repeat`` rounds (default 3).

Worker (N no-op jobs pushed with ``push_batch``, then drained at concurrency 100):

* ``plain``: no middleware, no metrics, no tracing (what ``benchmarks/jobs.py`` measures);
* ``3 middleware``: three pass-through middlewares overriding ``around_handler`` and
  ``on_outcome`` (the chain's own cost);
* ``JobMetrics (SDK)``: per-job-type counters and the duration histogram recorded into an
  OpenTelemetry SDK ``MeterProvider`` with an in-memory reader;
* ``all redelivered``: every job's first delivery ended unsettled (as after a crash), so
  each is moved to ``ojs.queue.redelivered.{q}`` and run there one at a time (at most
  2,000 jobs a round).

Results (a worker at concurrency 100 serving ``push_for_result`` callers):

* ``result latency``: one caller, ``push_for_result`` then ``await result()``, one job at a
  time: the median and 99th-percentile round trip in ms;
* ``results x100``: 100 callers doing the same concurrently: results per second, against
  fire-and-forget ``push`` x100 (``push x100``) in the same round.

Usage::

    python3 benchmarks/job_api.py [--n 10000] [--repeat 3] [--backends asyncio,trio] [--smoke]

Wall-clock figures, as noisy as the machine: not timed assertions.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from jobs import ARGS, DEFAULT_URL, _ours_worker, _split  # beside this script

import ojs_anyio as ojs
from ojs_anyio import amqp

CONCURRENCY = 100
LATENCY_JOBS = 300
#: Jobs of the redelivered round (they run one at a time: a smaller N keeps the round short).
REDELIVERED_JOBS = 2000


class PassThrough(ojs.Middleware):
    async def around_handler(self, ctx: ojs.JobContext, call_next: Callable[[], Awaitable[Any]]) -> Any:
        return await call_next()

    def on_outcome(self, outcome: ojs.JobOutcome) -> None:
        return None


def _sdk_metrics() -> ojs.JobMetrics:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    return ojs.JobMetrics(MeterProvider(metric_readers=[InMemoryMetricReader()]))


WORKER_CONFIGS: dict[str, Callable[[], dict[str, Any]]] = {
    "plain": lambda: {"metrics": False, "tracing": False},
    "3 middleware": lambda: {
        "metrics": False,
        "tracing": False,
        "middleware": [PassThrough(), PassThrough(), PassThrough()],
    },
    "JobMetrics (SDK)": lambda: {"metrics": False, "tracing": False, "middleware": [_sdk_metrics()]},
}


@contextlib.asynccontextmanager
async def _scratch_queue(client: ojs.Client) -> Any:
    q = f"bench-{uuid.uuid4().hex[:10]}"
    await client.declare_queue(q)
    ch = await client.channel()
    try:
        yield q
    finally:
        names = client.names
        for name in (names.job_queue(q), names.dlx_queue(q), names.control_queue(q),
                     names.redelivered_queue(q)):  # fmt: skip
            with contextlib.suppress(amqp.AMQPError):
                await ch.queue_delete(name)


async def worker_round(url: str, n: int, options: dict[str, Any]) -> float:
    async with ojs.connect(url) as client, _scratch_queue(client) as q:
        results = await client.push_batch([client.build("bench.noop", ARGS, queue=q) for _ in range(n)])
        if not all(r.ok for r in results):
            raise RuntimeError("push_batch: some jobs failed")
        return await _ours_worker(client, q, n, CONCURRENCY, **options)


async def redelivered_round(url: str, n: int) -> float:
    """N jobs whose first delivery ended unsettled (a consumer took them all and went away
    without a word, as a crashed worker does), then drained by a worker at concurrency 100:
    each is moved to ``ojs.queue.redelivered.{q}`` (one confirmed publish) and run there one
    at a time (see ``Worker(max_deliveries=…)``): what recovering from a crash costs."""
    async with ojs.connect(url) as client, _scratch_queue(client) as q:
        results = await client.push_batch([client.build("bench.noop", ARGS, queue=q) for _ in range(n)])
        if not all(r.ok for r in results):
            raise RuntimeError("push_batch: some jobs failed")
        async with (
            client.conn.channel(confirms=False) as ch,
            ch.consume(client.names.job_queue(q), prefetch=n) as messages,
        ):
            taken = 0
            async for _ in messages:
                taken += 1
                if taken == n:
                    break  # the channel closes unsettled: all n come back redelivered
        return await _ours_worker(client, q, n, CONCURRENCY, metrics=False, tracing=False)


async def results_round(url: str, n: int, out: dict[str, list[float]]) -> None:
    async with ojs.connect(url) as client, _scratch_queue(client) as q:
        worker = ojs.Worker(queues=[q], concurrency=CONCURRENCY, heartbeat_interval=3600.0)

        @worker.handler("bench.echo")
        async def echo(ctx: ojs.JobContext, a: str, b: str) -> str:
            return a

        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run, client)
            await worker.wait_ready()
            latencies = []
            for _ in range(LATENCY_JOBS):
                t0 = time.perf_counter()
                pending = await client.push_for_result("bench.echo", ARGS, queue=q)
                if await pending.result(timeout=30) != ARGS[0]:
                    raise RuntimeError("wrong result")
                latencies.append(time.perf_counter() - t0)
            latencies.sort()
            out.setdefault("result latency median ms", []).append(1000 * statistics.median(latencies))
            out.setdefault("result latency p99 ms", []).append(1000 * latencies[int(0.99 * len(latencies))])

            async def with_result(count: int) -> None:
                for _ in range(count):
                    pending = await client.push_for_result("bench.echo", ARGS, queue=q)
                    await pending.result(timeout=60)

            async def fire(count: int) -> None:
                for _ in range(count):
                    await client.push("bench.echo", ARGS, queue=q)

            for label, fn in (("push x100 (no result) /s", fire), ("results x100 /s", with_result)):
                t0 = time.perf_counter()
                async with anyio.create_task_group() as inner:
                    for count in _split(n):
                        inner.start_soon(fn, count)
                out.setdefault(label, []).append(n / (time.perf_counter() - t0))
            worker.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=None, help="jobs per round (default 10000; 200 with --smoke)")
    ap.add_argument("--repeat", type=int, default=None, help="rounds, each figure their median (default 3)")
    ap.add_argument("--backends", default="asyncio,trio")
    ap.add_argument("--url", default=os.environ.get("OJS_AMQP_URL", DEFAULT_URL))
    ap.add_argument("--smoke", action="store_true", help="tiny N, one round")
    args = ap.parse_args()
    n = args.n or (200 if args.smoke else 10_000)
    repeat = args.repeat or (1 if args.smoke else 3)
    backends = args.backends.split(",")
    rates: dict[str, dict[str, list[float]]] = {b: {} for b in backends}
    started = time.monotonic()
    for rnd in range(repeat):
        order = list(WORKER_CONFIGS) if rnd % 2 == 0 else list(reversed(WORKER_CONFIGS))
        for backend in backends:
            for name in order:
                rate = anyio.run(worker_round, args.url, n, WORKER_CONFIGS[name](), backend=backend)
                rates[backend].setdefault(f"worker c={CONCURRENCY}, {name} /s", []).append(rate)
                print(f"round {rnd + 1} {backend}: {name}: {rate:,.0f} jobs/s", file=sys.stderr)
            anyio.run(results_round, args.url, n, rates[backend], backend=backend)
            rate = anyio.run(redelivered_round, args.url, min(n, REDELIVERED_JOBS), backend=backend)
            rates[backend].setdefault(f"worker c={CONCURRENCY}, all redelivered /s", []).append(rate)
            print(f"round {rnd + 1} {backend}: all redelivered: {rate:,.0f} jobs/s", file=sys.stderr)
    print(f"job API extras: N={n:,}, median of {repeat} round(s), took {time.monotonic() - started:.0f}s")
    keys = list(rates[backends[0]])
    print(f"{'':<40}" + "".join(f"{b:>12}" for b in backends))
    for key in keys:
        cells = []
        for b in backends:
            v = statistics.median(rates[b][key])
            cells.append(f"{v:>12,.1f}" if "ms" in key else f"{v:>12,.0f}")
        print(f"{key:<40}" + "".join(cells))
    for b in backends:
        plain = statistics.median(rates[b][f"worker c={CONCURRENCY}, plain /s"])
        shares = ", ".join(
            f"{name} {statistics.median(rates[b][f'worker c={CONCURRENCY}, {name} /s']) / plain:.0%}"
            for name in WORKER_CONFIGS
            if name != "plain"
        )
        print(f"  {b}: worker throughput against plain: {shares}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
