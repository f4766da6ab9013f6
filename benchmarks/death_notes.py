"""The cost of death notes (docs/jobs.md, "Dead letters"): what a dead letter costs the
worker with its note, and what ``DeadLetters.peek`` costs with a full notes queue.

1. ``--jobs`` jobs (default 500) that die on their first attempt, run by one worker at
   concurrency 1, default configuration (note, then Nack) and then
   ``annotate_dead_letters=True`` (the annotated copy: one confirmed publish too, no note):
   the time from the first push to the last dead letter, per job.
2. ``--notes`` notes (default 10,000, the queue's bound) in ``ojs.dlx-notes.{q}``, then
   ``peek(20)``: the notes are read with ``Basic.Get`` and put back, as the DLQ is.

Everything is declared under a fresh prefix and deleted at the end.  Usage::

    python3 benchmarks/death_notes.py [--jobs 500] [--notes 10000] [--url amqp://...] [--smoke]

Wall-clock times, as noisy as the machine.  The success path does not touch the notes (no
code of it runs when a job completes), so it is not measured here: benchmarks/jobs.py and
compare_trees.py measure the worker's throughput.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
import uuid

import anyio
import msgspec

import ojs_anyio as ojs
from ojs_anyio import amqp
from ojs_anyio.jobs._death_notes import NOTE_TYPE, DeathNote
from ojs_anyio.jobs._retry import RETRY_LADDER_MS


async def _deaths(client: ojs.Client, queue: str, jobs: int, *, annotate: bool) -> float:
    worker = ojs.Worker(queues=[queue], concurrency=1, annotate_dead_letters=annotate)
    dead = 0
    done = anyio.Event()

    @worker.handler("bench.die")
    async def die(ctx: ojs.JobContext) -> None:
        raise ojs.Discard("benchmark")

    def count(outcome: ojs.JobOutcome) -> None:
        nonlocal dead
        if outcome.outcome == "dead_lettered":
            dead += 1
            if dead == jobs:
                done.set()

    worker.add_listener(count)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run, client)
        with anyio.fail_after(60):
            await worker.wait_ready()
        start = time.perf_counter()
        await client.push_batch([ojs.new_job("bench.die", [], queue=queue) for _ in range(jobs)])
        with anyio.fail_after(300):
            await done.wait()
        elapsed = time.perf_counter() - start
        worker.stop()
    return elapsed / jobs * 1000


async def main(jobs: int, notes: int, url: str) -> None:
    prefix = f"bench{uuid.uuid4().hex[:6]}."
    names = ojs.Names(prefix)
    queues = {"nack": "dn-nack", "annotated": "dn-annotated"}
    async with ojs.connect(url, prefix=prefix) as client:
        try:
            nack = await _deaths(client, queues["nack"], jobs, annotate=False)
            annotated = await _deaths(client, queues["annotated"], jobs, annotate=True)
            print(
                f"dead letter, {jobs} jobs at concurrency 1: with a death note (default) "
                f"{nack:.2f} ms a job, annotated copy {annotated:.2f} ms a job"
            )
            # Fill the notes queue to ``notes`` (the worker wrote ``jobs`` already).
            ch = await client.channel()
            name = names.death_notes_queue(queues["nack"])
            body = msgspec.json.encode(DeathNote(id=str(uuid.uuid4()), code="X", message="filler"))
            props = amqp.BasicProperties(type=NOTE_TYPE, delivery_mode=2)
            for _ in range(max(notes - jobs, 0)):
                await ch.publish(body, exchange="", routing_key=name, properties=props)
            dead_letters = client.dead_letters(queues["nack"])
            start = time.perf_counter()
            peeked = await dead_letters.peek(20)
            took = time.perf_counter() - start
            noted = sum(d.noted for d in peeked)
            print(f"peek(20) with {max(notes, jobs)} notes: {took:.2f} s ({noted} of {len(peeked)} joined)")
        finally:
            ch = await client.channel()
            for queue in queues.values():
                retry_queues = [names.retry_queue(queue, ms) for ms in RETRY_LADDER_MS]
                for entity in (
                    names.job_queue(queue), names.dlx_queue(queue), names.control_queue(queue),
                    names.redelivered_queue(queue), names.death_notes_queue(queue),
                    names.delay_landing_queue(queue), *retry_queues,
                ):  # fmt: skip
                    await ch.queue_delete(entity)
            for exchange in (
                names.direct_exchange,
                names.dlx_exchange,
                names.retry_exchange,
                names.control_exchange,
            ):
                await ch.exchange_delete(exchange)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--notes", type=int, default=10_000)
    parser.add_argument("--url", default=os.environ.get("OJS_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"))
    parser.add_argument("--smoke", action="store_true", help="20 jobs, 100 notes")
    args = parser.parse_args()
    logging.getLogger("ojs_anyio").setLevel(logging.CRITICAL)  # every job dies: its log line is not the point
    if args.smoke:
        args.jobs, args.notes = 20, 100
    anyio.run(main, args.jobs, args.notes, args.url)


if __name__ == "__main__":
    cli()
