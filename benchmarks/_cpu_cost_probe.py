"""At worker concurrency 1, what a microsecond of client CPU costs, before the ack and after it.

A probe behind the analysis in docs/benchmarks.md (issue 29), not a benchmark with targets
(hence the leading underscore: CI's smoke loop skips it).  The raw worker drains N job
messages at prefetch 1 on a bare asyncio protocol (``hotpath.RawConnection.consume_on_asyncio``)
while busy-waiting X µs before each ack's write, or after it.  Work before the ack sits on
the broker's round trip; work after it overlaps the broker's turn, unless the two compete
for the same cores.  The blocking raw client is measured in the same rounds.

    python3 benchmarks/_cpu_cost_probe.py --n 3000 --rounds 4
"""

from __future__ import annotations

import argparse
import statistics
import sys
import uuid
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hotpath
import jobs

URL = "amqp://guest:guest@127.0.0.1:5672/"
#: (before, after) µs of busy-waiting around each ack's write.
VARIANTS: tuple[tuple[int, int], ...] = ((0, 0), (30, 0), (0, 30), (60, 0), (0, 60), (0, 150), (0, 250))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--url", default=URL)
    args = ap.parse_args(argv)
    q = f"bench-{uuid.uuid4().hex[:10]}"
    exchange, props, body = anyio.run(jobs._job_message, args.url, q)
    job_queue = f"ojs.queue.{q}"
    filler = hotpath.RawConnection(args.url)
    rates: dict[str, list[float]] = {}

    def fill() -> None:
        filler.publish(q, args.n, exchange=exchange, properties=props, body=body, mandatory=True)
        if jobs.wait_for_count(args.url, job_queue, args.n) != args.n:
            raise RuntimeError("the queue did not fill")

    try:
        for r in range(args.rounds):
            fill()
            seconds = filler.consume(job_queue, args.n, prefetch=1)
            rates.setdefault("blocking socket", []).append(args.n / seconds)
            for before, after in VARIANTS:
                fill()
                conn = hotpath.RawConnection(args.url)
                seconds = conn.consume_on_asyncio(job_queue, args.n, prefetch=1, busy_us=(before, after))
                name = f"asyncio, {before} µs before / {after} µs after"
                rates.setdefault(name, []).append(args.n / seconds)
            print(f"round {r + 1} done", file=sys.stderr)
    finally:
        filler.close()
        jobs.delete_entities(args.url, [job_queue, f"ojs.queue.dlx.{q}", f"ojs.queue.control.{q}"])
    base = statistics.median(rates["asyncio, 0 µs before / 0 µs after"])
    print(f"worker c=1, N={args.n}, medians of {args.rounds} interleaved rounds (jobs/s)")
    for name, values in rates.items():
        med = statistics.median(values)
        print(f"  {name:<38} {med:8,.0f}  ({med / base:.0%} of the bare loop)  rounds: "
              + " ".join(f"{v:,.0f}" for v in values))
    return 0


if __name__ == "__main__":
    sys.exit(main())
