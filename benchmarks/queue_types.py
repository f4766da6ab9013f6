"""What a quorum job queue costs against a classic one: push and worker throughput, one run.

For each queue kind, in interleaved rounds (so drift in the machine's load hits all alike):
``push_batch`` of N no-op jobs into a fresh queue (publisher confirms), then one
``Worker(concurrency=10)`` draining it, timed from the first job's completion to the N-th.
Kinds:

* ``classic``: the OJS default declaration (durable classic queue, ``x-max-priority`` 10);
* ``classic-no-priority``: ``QueueOptions(max_priority=None)``;
* ``quorum``: ``QueueOptions.quorum()`` (replicated with Raft on every cluster member,
  at-least-once dead-lettering).

Run it against the local cluster to see the replication cost::

    scripts/cluster start
    python benchmarks/queue_types.py --url "$(scripts/cluster url a)" --n 20000 --repeat 3

Against a single broker (the default URL) a quorum queue has one member, so only its
log-based storage is measured, not replication.  Figures are jobs per second, best of the
rounds; on a shared machine they are indicative only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path

import anyio

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "codec")]

import ojs_anyio as ojs  # noqa: E402

KINDS: dict[str, ojs.QueueOptions | None] = {
    "classic": None,
    "classic-no-priority": ojs.QueueOptions(max_priority=None),
    "quorum": ojs.QueueOptions.quorum(),
}
DEFAULT_URL = os.environ.get("OJS_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")


async def one_round(url: str, kind: str, n: int) -> tuple[float, float]:
    """(push jobs/s, worker jobs/s) for one fresh queue of ``kind``."""
    queue = f"bench-{kind}-{uuid.uuid4().hex[:8]}"
    async with ojs.connect(url, queue_options=KINDS[kind]) as client:
        await client.declare_queue(queue)
        try:
            started = time.perf_counter()
            jobs = [client.build("bench.noop", ["a", "b"], queue=queue) for _ in range(n)]
            results = await client.push_batch(jobs)
            push_s = time.perf_counter() - started
            if not all(r.ok for r in results):
                raise RuntimeError(f"{sum(not r.ok for r in results)} pushes failed")
            stamps: list[float] = []
            all_done = anyio.Event()
            worker = ojs.Worker(queues=[queue], concurrency=10)

            async def noop(ctx: ojs.JobContext, a: str, b: str) -> None:
                pass

            def count(outcome: ojs.JobOutcome) -> None:
                stamps.append(time.perf_counter())
                if len(stamps) == n:
                    all_done.set()

            worker.register("bench.noop", noop)
            worker.add_listener(count)
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.run, client)
                with anyio.fail_after(60 + n / 50):
                    await all_done.wait()
                worker.stop()
        finally:
            ch = await client.channel()
            for name in (client.names.job_queue(queue), client.names.dlx_queue(queue)):
                await ch.queue_delete(name)
    work_s = stamps[-1] - stamps[0]
    return n / push_s, (n - 1) / work_s if work_s > 0 else float("inf")


async def run(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    best: dict[str, dict[str, float]] = {k: {"push": 0.0, "worker": 0.0} for k in KINDS}
    for _ in range(args.repeat):
        for kind in KINDS:
            push, work = await one_round(args.url, kind, args.n)
            best[kind]["push"] = max(best[kind]["push"], push)
            best[kind]["worker"] = max(best[kind]["worker"], work)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--url", default=DEFAULT_URL)
    ap.add_argument("--n", type=int, default=None, help="jobs per round (default 20000; 200 with --smoke)")
    ap.add_argument("--repeat", type=int, default=None, help="rounds, best kept (default 3; 1 with --smoke)")
    ap.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    ap.add_argument("--smoke", action="store_true", help="tiny N, one round")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args(argv)
    args.n = args.n or (200 if args.smoke else 20_000)
    args.repeat = args.repeat or (1 if args.smoke else 3)
    best = anyio.run(run, args, backend=args.backend)
    if args.json:
        print(json.dumps({"n": args.n, "repeat": args.repeat, "backend": args.backend, "results": best}))
        return 0
    print(f"N={args.n}, best of {args.repeat}, {args.backend}, {args.url.split('@')[-1]} (jobs/s)")
    base = best["classic"]
    for kind, figures in best.items():
        print(
            f"  {kind:<20} push {figures['push']:>8.0f} ({figures['push'] / base['push']:4.0%})"
            f"   worker c=10 {figures['worker']:>8.0f} ({figures['worker'] / base['worker']:4.0%})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
