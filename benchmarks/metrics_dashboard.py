"""A dashboard of the per-job-type metrics (``ojs.JobMetrics``) after a real run, as a PNG.

Runs a small mixed workload through a real worker (three job types: one that always
succeeds, one that fails its first attempt, one that is sometimes discarded), collects what
``JobMetrics`` recorded through the OpenTelemetry SDK, and draws what a Prometheus/Grafana
dashboard of those series shows: outcomes per job type and handler duration per type.

    python3 benchmarks/metrics_dashboard.py docs/metrics-dashboard.png
    python3 benchmarks/metrics_dashboard.py --url memory:// --jobs 300 out.png
    python3 benchmarks/metrics_dashboard.py --smoke            # CI: tiny run, no picture kept

Needs matplotlib (``pip install 'ojs-anyio[bench]'``) and opentelemetry-sdk.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import ojs_anyio as ojs

TYPES = ("email.send", "report.build", "image.resize")


async def workload(url: str, n: int, seed: int) -> InMemoryMetricReader:
    reader = InMemoryMetricReader()
    metrics = ojs.JobMetrics(MeterProvider(metric_readers=[reader]))
    queue = f"dash{random.Random().randrange(1 << 30):x}"
    policy = ojs.RetryPolicy(max_attempts=3, initial_interval=0.05, jitter=False)
    worker = ojs.Worker(queues=[queue], concurrency=20, middleware=[metrics], retry=policy)
    rng = random.Random(seed)
    failed_once: set[str] = set()
    done = anyio.Event()
    finals = 0

    @worker.job("email.send")
    async def send(ctx: ojs.JobContext, n: int) -> None:
        await anyio.sleep(rng.uniform(0.001, 0.01))

    @worker.job("report.build")
    async def build(ctx: ojs.JobContext, n: int) -> None:
        await anyio.sleep(rng.uniform(0.01, 0.05))
        if ctx.id not in failed_once:
            failed_once.add(ctx.id)
            raise RuntimeError("upstream timed out")

    @worker.job("image.resize")
    async def resize(ctx: ojs.JobContext, n: int) -> None:
        await anyio.sleep(rng.uniform(0.002, 0.02))
        if n % 7 == 0:
            raise ojs.Discard("unsupported format")

    def on_outcome(outcome: ojs.JobOutcome) -> None:
        nonlocal finals
        if outcome.outcome in ("completed", "dead_lettered"):
            finals += 1
            if finals == n:
                done.set()

    worker.add_listener(on_outcome)
    handles = (send, build, resize)  # registered on the worker by @worker.job
    async with ojs.connect(url) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run, client)
            await worker.wait_ready()
            try:
                jobs = [client.build(TYPES[i % 3], [i], queue=queue) for i in range(n)]
                results = await client.push_batch(jobs)
                assert all(r.ok for r in results), [r.error for r in results if not r.ok][:3]
                with anyio.fail_after(120):
                    await done.wait()
            finally:
                worker.stop()  # run() returns once the worker stopped; then the queues go
        async with client.conn.channel(confirms=False) as ch:
            names = client.names
            for name in (names.job_queue(queue), names.dlx_queue(queue), names.control_queue(queue),
                         names.redelivered_queue(queue)):  # fmt: skip
                await ch.queue_delete(name)
    del handles
    return reader


def collect(reader: InMemoryMetricReader) -> tuple[dict[str, dict[str, float]], dict[str, Any]]:
    counts: dict[str, dict[str, float]] = {}
    durations: dict[str, Any] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for p in metric.data.data_points:
                    job_type = str((p.attributes or {}).get("ojs.job.type"))
                    if metric.name == "messaging.process.duration":
                        # Completed and failed attempts (error.type) are separate points.
                        durations.setdefault(job_type, []).append(p)
                    else:
                        name = metric.name.removeprefix("ojs_jobs_").removesuffix("_total")
                        row = counts.setdefault(job_type, {})
                        row[name] = row.get(name, 0) + p.value
    return counts, durations


def draw(counts: dict[str, dict[str, float]], durations: dict[str, Any], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = ("started", "completed", "retried", "failed", "dead_lettered")
    types = [t for t in TYPES if t in counts]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    width = 0.8 / len(kinds)
    for k, kind in enumerate(kinds):
        xs = [i + (k - len(kinds) / 2) * width + width / 2 for i in range(len(types))]
        ys = [counts[t].get(kind, 0) for t in types]
        bars = left.bar(xs, ys, width, label=kind)
        left.bar_label(bars, fmt="%d", fontsize=7)
    left.set_xticks(range(len(types)), types)
    left.set_ylabel("jobs")
    left.set_title("ojs_jobs_*_total by ojs.job.type")
    left.legend(fontsize=8)
    for t in types:
        points = durations.get(t)
        if not points:
            continue
        bounds = list(points[0].explicit_bounds)
        n = sum(p.count for p in points)
        cumulative, total = [], 0
        for i in range(len(bounds)):
            total += sum(p.bucket_counts[i] for p in points)
            cumulative.append(total / max(n, 1))
        right.step([b * 1000 for b in bounds], cumulative, where="post", label=f"{t} (n={n})")
    right.set_xscale("symlog", linthresh=1)
    right.set_xlabel("handler duration (ms, histogram bucket bounds)")
    right.set_ylabel("share of attempts at or below")
    right.set_title("messaging.process.duration (cumulative buckets)")
    right.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", nargs="?", default="docs/metrics-dashboard.png")
    parser.add_argument("--url", default=os.environ.get("OJS_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"))
    parser.add_argument("--jobs", type=int, default=600)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--smoke", action="store_true", help="tiny run; the picture goes to a temp file")
    args = parser.parse_args()
    n = 30 if args.smoke else args.jobs
    reader = anyio.run(workload, args.url, n, args.seed, backend=args.backend)
    counts, durations = collect(reader)
    for t in TYPES:
        print(t, {k: int(v) for k, v in sorted(counts.get(t, {}).items())})
    title = f"JobMetrics after {n} jobs on {args.url.split('@')[-1]} ({args.backend})"
    if args.smoke:
        with tempfile.TemporaryDirectory() as tmp:
            draw(counts, durations, Path(tmp) / "dash.png", title)
        print("smoke OK")
    else:
        draw(counts, durations, Path(args.out), title)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
