"""The cost of idempotency keys: push latency with and without a key, and broker memory per key.

``--keys`` pushes (default 1,000) run one after another on one client, three times: without
a key, each with a new key (declare the lock queue, publish the confirmed marker, then the
job), and each with a key already taken (the marker is nacked: ``DuplicateJobError``).
Then ``rabbitmqctl list_queues memory`` gives the memory of each lock queue.  Everything
is declared under a fresh prefix and deleted at the end.

Usage::

    python3 benchmarks/idempotency_lock.py [--keys 1000] [--url amqp://...] [--smoke]

Times are wall-clock and as noisy as the machine; ``--smoke`` runs 20 keys.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid

import anyio

import ojs_anyio as ojs


async def main(keys: int, url: str) -> None:
    prefix = f"bench{uuid.uuid4().hex[:6]}."
    async with ojs.connect(url, prefix=prefix) as client:
        queue = "lockbench"
        ch = await client.channel()
        try:
            await client.push("a.job", [], queue=queue)  # declares, warms up
            timings = {}
            for label, key in (("plain", None), ("new key", "k"), ("duplicate", "k")):
                refused = 0
                start = time.perf_counter()
                for i in range(keys):
                    try:
                        await client.push(
                            "a.job", [i], queue=queue, idempotency_key=None if key is None else f"{key}{i}"
                        )
                    except ojs.DuplicateJobError:
                        refused += 1
                timings[label] = (time.perf_counter() - start) / keys * 1000
                if label == "duplicate" and refused != keys:
                    raise SystemExit(f"only {refused} of {keys} duplicates were refused")
            print(
                f"push, mean of {keys}: plain {timings['plain']:.2f} ms, with a new key "
                f"{timings['new key']:.2f} ms, duplicate refused {timings['duplicate']:.2f} ms"
            )
            listed = await anyio.run_process(
                ["rabbitmqctl", "list_queues", "-q", "name", "memory", "--formatter", "json"], check=False
            )
            out = listed.stdout.decode()
            rows = [r for r in json.loads(out or "[]") if r["name"].startswith(f"{prefix}ojs.idempotency.")]
            if rows:
                memory = [r["memory"] for r in rows]
                mean, most = sum(memory) / len(memory) / 1024, max(memory) / 1024
                print(
                    f"{len(rows)} lock queues: broker memory per key mean {mean:.1f} KiB, max {most:.1f} KiB"
                )
        finally:
            with anyio.CancelScope(shield=True):
                for i in range(keys):
                    await ch.queue_delete(ojs.jobs._dedup.lock_queue(prefix, f"k{i}"))
                for name in (client.names.job_queue(queue), client.names.dlx_queue(queue)):
                    await ch.queue_delete(name)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--url", default=os.environ.get("OJS_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"))
    parser.add_argument("--smoke", action="store_true")
    options = parser.parse_args()
    anyio.run(main, 20 if options.smoke else options.keys, options.url)
