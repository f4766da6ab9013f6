"""The job layer end to end: push jobs, run a worker, see a success and a dead letter.

Run: python docs/examples/jobs_quickstart.py [--backend asyncio|trio] [--queue NAME]
(needs RabbitMQ at $OJS_AMQP_URL, default amqp://guest:guest@localhost:5672/).
tests/jobs/test_silent_failures_broker.py runs it on both backends.

It shows: an ``async def`` handler with annotated parameters (the ``datetime`` arrives as a
datetime), a plain ``def`` handler (run in a worker thread), a retry policy with
``non_retryable_errors`` given as an exception class, and how a failure reads in the
log (WARNING per failed attempt, ERROR for the dead letter, each with its traceback).
"""

from __future__ import annotations

import argparse
import logging
from datetime import UTC, datetime

import anyio

import ojs_anyio as ojs


class PaymentDeclined(Exception):
    """A failure that retrying will not fix."""


def build_worker(queue: str, done: dict[str, anyio.Event]) -> ojs.Worker:
    worker = ojs.Worker(
        queues=[queue],
        concurrency=4,
        # Worker-wide policy: jobs without their own policy get these values.
        retry=ojs.RetryPolicy(max_attempts=3, initial_interval=0.1, non_retryable_errors=(PaymentDeclined,)),
        grace_period="PT5S",  # durations: seconds, a timedelta, or ISO 8601
    )

    @worker.handler("email.welcome")
    async def welcome(ctx: ojs.JobContext, to: str, signed_up: datetime) -> None:
        # ``signed_up`` was pushed as an ISO 8601 string; the annotation converts it.
        assert isinstance(signed_up, datetime)
        print(f"welcome email sent to {to} (signed up {signed_up:%Y-%m-%d})")

    @worker.handler("invoice.charge")
    def charge(ctx: ojs.JobContext, invoice: int) -> None:
        # A plain function: it runs in a worker thread, so blocking calls are fine here.
        raise PaymentDeclined(f"card declined for invoice {invoice}")

    def on_outcome(outcome: ojs.JobOutcome) -> None:
        if outcome.type == "invoice.charge" and outcome.outcome == "dead_lettered":
            print(f"invoice 7 failed, as expected: dead-lettered ({outcome.error_message})")
        if outcome.outcome in ("completed", "dead_lettered") and outcome.type in done:
            done[outcome.type].set()

    worker.add_listener(on_outcome)
    return worker


async def main(queue: str) -> None:
    done = {"email.welcome": anyio.Event(), "invoice.charge": anyio.Event()}
    worker = build_worker(queue, done)
    async with ojs.connect() as client, anyio.create_task_group() as tg:  # $OJS_AMQP_URL
        tg.start_soon(worker.run, client)
        await worker.wait_ready()
        signed_up = datetime(2026, 2, 15, 10, 30, tzinfo=UTC)
        await client.push("email.welcome", ["user@example.com", signed_up.isoformat()], queue=queue)
        await client.push("invoice.charge", [7], queue=queue)
        with anyio.fail_after(30):
            for event in done.values():
                await event.wait()
        worker.stop()  # graceful: run() returns once running jobs are finished
    # The failed invoice waits in ojs.queue.dlx.{queue}: client.dead_letters(queue).peek()
    # lists it, .requeue() runs it again, .purge() drops it.


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument("--queue", default="example-jobs")
    options = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    anyio.run(main, options.queue, backend=options.backend)
