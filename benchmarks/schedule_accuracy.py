"""Scheduled-job accuracy: how late do scheduled jobs reach a worker, and is any early?

``--jobs`` jobs (default 1,000) are pushed with ``client.push(..., scheduled_at=t)`` where
``t = now + d`` and ``d`` is uniform in ``[0, --max-delay]`` seconds (default 120), drawn
from a seeded RNG (``--seed``).  Each push takes ``now`` right before it, so ``d`` is the
delay asked for.  A scheduled push goes through the binary delay levels (``_client.py``
``_message``: the delay in whole milliseconds, rounded up, picks the chain of
``ojs.queue.delay.NN`` TTL queues, one hop per set bit, then the landing queue and the
job's own queue); a job already due goes straight to its queue.

The pushes are spread over ``--push-tasks`` concurrent tasks (default 20); how long each
``push_job()`` took is reported too, since a push's own latency counts as lateness (the
delay is computed when the message is built, and the TTL clock starts when the broker has
it).  A worker (``--concurrency``, default 10) consumes the queue from before the first push.
Its handler records, on arrival, ``lateness = now - scheduled_at`` where ``scheduled_at``
is the job's own field (RFC 3339 with milliseconds, as the envelope stores it).  The run
ends when every job has arrived (or ``max-delay + 60`` s passed).

Reported: jobs received, **early** (lateness < 0: must be 0), lateness percentiles
p50/p90/p99/max and mean in ms, and the same per number of delay-level hops.  Also
counted, as information: arrivals before the ``datetime`` the caller passed (the envelope
keeps milliseconds, so ``scheduled_at`` may be up to 1 ms before it).

Usage::

    python3 benchmarks/schedule_accuracy.py [--jobs 1000] [--max-delay 120] [--seed 1]
                                            [--concurrency 10] [--smoke] [--json] [--url ...]

``--smoke``: 30 jobs within 3 s.  Exit status 1 when a job was early or went missing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import random
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import anyio

import ojs_anyio as ojs
from ojs_anyio import amqp
from ojs_anyio.jobs._envelope import parse_timestamp

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"
PUSH_TASKS = 20


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def summary(values: list[float]) -> dict[str, Any]:
    s = sorted(round(v, 3) for v in values)
    return {
        "count": len(s),
        "early": sum(v < 0 for v in s),
        "min_ms": s[0] if s else math.nan,
        "p50_ms": percentile(s, 50),
        "p90_ms": percentile(s, 90),
        "p99_ms": percentile(s, 99),
        "max_ms": s[-1] if s else math.nan,
        "mean_ms": round(sum(s) / len(s), 3) if s else math.nan,
    }


async def run(
    url: str, jobs: int, max_delay: float, seed: int, concurrency: int, push_tasks: int
) -> dict[str, Any]:
    rng = random.Random(seed)
    q = f"sched-{uuid.uuid4().hex[:10]}"
    requested: dict[str, datetime] = {}  # job id -> the datetime passed to push
    hops: dict[str, int] = {}  # job id -> delay-level hops (set bits of the delay in ms)
    lateness: dict[str, float] = {}  # job id -> ms after the job's scheduled_at
    push_ms: list[float] = []  # how long each push_job() took (build excluded), ms
    vs_requested: dict[str, float] = {}  # job id -> ms after the requested datetime
    done = anyio.Event()
    worker = ojs.Worker(queues=[q], concurrency=concurrency)

    @worker.handler("bench.scheduled")
    async def scheduled(ctx: ojs.JobContext, n: int) -> None:
        now = datetime.now(UTC)
        sched = ctx.job.scheduled_at
        if not isinstance(sched, str):
            raise TypeError(f"job {ctx.id} has no scheduled_at")
        lateness[ctx.id] = (now - parse_timestamp(sched)).total_seconds() * 1000
        want = requested.get(ctx.id)
        if want is not None:
            vs_requested[ctx.id] = (now - want).total_seconds() * 1000
        if len(lateness) >= jobs:
            done.set()

    delays = [rng.uniform(0.0, max_delay) for _ in range(jobs)]
    async with ojs.connect(url) as client:
        names = client.names
        try:
            await client.declare_queue(q)
            await client.declare_delay_levels()
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.run, client)
                await worker.wait_ready()

                async def pusher(mine: list[float]) -> None:
                    for d in mine:
                        now = datetime.now(UTC)
                        at = now + timedelta(seconds=d)
                        job = client.build("bench.scheduled", [len(requested)], queue=q, scheduled_at=at)
                        requested[job.id] = at
                        hops[job.id] = bin(max(0, math.ceil(d * 1000))).count("1")
                        t_push = time.perf_counter()
                        await client.push_job(job)
                        push_ms.append((time.perf_counter() - t_push) * 1000)

                t0 = time.monotonic()
                async with anyio.create_task_group() as ptg:
                    for k in range(push_tasks):
                        ptg.start_soon(pusher, delays[k::push_tasks])
                push_seconds = time.monotonic() - t0
                with anyio.move_on_after(max_delay + 60.0):
                    await done.wait()
                worker.stop()
        finally:
            ch = await client.channel()
            for name in (names.job_queue(q), names.dlx_queue(q), names.control_queue(q),
                         names.delay_landing_queue(q), names.redelivered_queue(q)):  # fmt: skip
                with contextlib.suppress(amqp.AMQPError):
                    await ch.queue_delete(name)

    late = list(lateness.values())
    result = summary(late)
    by_hops: dict[str, Any] = {}
    for h in sorted(set(hops.values())):
        vals = [lateness[j] for j, hh in hops.items() if hh == h and j in lateness]
        if vals:
            s = summary(vals)
            by_hops[str(h)] = {k: s[k] for k in ("count", "p50_ms", "p99_ms", "max_ms")}
    return {
        "benchmark": "schedule_accuracy",
        "jobs": jobs,
        "max_delay_s": max_delay,
        "seed": seed,
        "concurrency": concurrency,
        "python": platform.python_version(),
        "push_tasks": push_tasks,
        "push_seconds": round(push_seconds, 3),
        "push_latency": {k: v for k, v in summary(push_ms).items() if k in ("p50_ms", "p99_ms", "max_ms")},
        "received": len(lateness),
        "missing": jobs - len(lateness),
        "lateness": result,
        "early_vs_requested_datetime": sum(v < 0 for v in vs_requested.values()),
        "min_vs_requested_ms": round(min(vs_requested.values()), 3) if vs_requested else math.nan,
        "by_hops": by_hops,
    }


def print_report(r: dict[str, Any]) -> None:
    lat = r["lateness"]
    print(
        f"schedule accuracy: {r['jobs']:,} jobs at uniform random delays in [0, {r['max_delay_s']:g}] s "
        f"(seed {r['seed']}), worker concurrency {r['concurrency']}, python {r['python']}"
    )
    pl = r["push_latency"]
    print(
        f"pushed by {r['push_tasks']} tasks in {r['push_seconds']:.2f}s; one push took"
        f" p50 {pl['p50_ms']:.1f} ms, p99 {pl['p99_ms']:.1f} ms, max {pl['max_ms']:.1f} ms"
    )
    print(f"received {r['received']:,}, missing {r['missing']}")
    verdict = "PASS" if lat["early"] == 0 and r["missing"] == 0 else "FAIL"
    print(f"early (arrived before scheduled_at): {lat['early']}  {verdict}")
    print(
        "lateness ms: "
        f"p50 {lat['p50_ms']:.1f}  p90 {lat['p90_ms']:.1f}  p99 {lat['p99_ms']:.1f}  "
        f"max {lat['max_ms']:.1f}  (min {lat['min_ms']:.1f}, mean {lat['mean_ms']:.1f})"
    )
    print(
        f"arrivals before the requested datetime (scheduled_at keeps ms, so up to 1 ms earlier): "
        f"{r['early_vs_requested_datetime']} (min {r['min_vs_requested_ms']:.3f} ms)"
    )
    print("by delay-level hops (set bits of the delay in ms):")
    print(f"  {'hops':>4} {'jobs':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for h, s in r["by_hops"].items():
        print(f"  {h:>4} {s['count']:>5} {s['p50_ms']:>8.1f} {s['p99_ms']:>8.1f} {s['max_ms']:>8.1f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=None, help="jobs to schedule (default 1000; 30 with --smoke)")
    ap.add_argument("--max-delay", type=float, default=None, help="seconds (default 120; 3 with --smoke)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=10, help="worker concurrency")
    ap.add_argument("--push-tasks", type=int, default=PUSH_TASKS, help="concurrent pushers (default 20)")
    ap.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    ap.add_argument("--url", default=os.environ.get("OJS_AMQP_URL", DEFAULT_URL))
    ap.add_argument("--smoke", action="store_true", help="30 jobs within 3 s")
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    args = ap.parse_args(argv)
    jobs = args.jobs if args.jobs is not None else (30 if args.smoke else 1000)
    max_delay = args.max_delay if args.max_delay is not None else (3.0 if args.smoke else 120.0)
    if jobs < 1 or max_delay < 0:
        ap.error("--jobs must be >= 1 and --max-delay >= 0")
    result = anyio.run(
        run, args.url, jobs, max_delay, args.seed, args.concurrency, args.push_tasks, backend=args.backend
    )
    result["backend"] = args.backend
    if args.json:
        print(json.dumps(result))
    else:
        print_report(result)
    return 0 if result["lateness"]["early"] == 0 and result["missing"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
