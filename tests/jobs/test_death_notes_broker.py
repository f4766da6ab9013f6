"""Operators see why a job died, in the default configuration (issue 27, item 4).

A job the worker Nacks (AMQP-009) reaches the DLQ with RabbitMQ's ``rejected`` only; the
worker's death note in ``ojs.dlx-notes.{q}`` gives the reason, and ``DeadLetters.peek`` /
``ojs-anyio dlq peek`` join them.  First-attempt deaths of every kind are covered.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import pytest

import ojs_anyio as ojs
from ojs_anyio import amqp

from .broker_support import WAIT, Outcomes, bindings_to, current_url, running, wait_message_count

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


class PaymentDeclined(Exception):
    pass


async def _four_first_attempt_deaths(client: ojs.Client, q: str, *, annotate: bool = False) -> dict[str, str]:
    """Push four jobs that each die on their first attempt, each in its own way; wait until
    they are in the DLQ.  Returns {job id: expected code}."""
    worker = ojs.Worker(
        queues=[q],
        annotate_dead_letters=annotate,
        unknown_type_grace=0,  # a rolling deploy's grace window would defer it first
        retry=ojs.RetryPolicy(non_retryable_errors=[PaymentDeclined]),
    )
    outcomes = Outcomes(worker)

    @worker.handler("charge.card")
    async def charge(ctx: ojs.JobContext, amount: int) -> None:
        if amount < 0:
            raise PaymentDeclined(f"declined: {amount}")
        raise RuntimeError(f"gateway down for {amount}")

    async with running(worker, client):
        declined = await client.push("charge.card", [-5], queue=q)
        bad_args = await client.push("charge.card", ["five", "six"], queue=q)
        unknown = await client.push("refund.card", [1], queue=q)
        once = await client.push("charge.card", [7], queue=q, retry=ojs.RetryPolicy(max_attempts=1))
        for job in (declined, bad_args, unknown, once):
            assert (await outcomes.wait_final(job.id)).outcome == "dead_lettered"
        await wait_message_count(client.conn, client.names.dlx_queue(q), 4)
    return {
        declined.id: "NON_RETRYABLE_ERROR",
        bad_args.id: "INVALID_ARGS",
        unknown.id: "INVALID_JOB_TYPE",
        once.id: "HANDLER_ERROR",
    }


async def test_first_attempt_deaths_show_their_reason_in_peek(client: ojs.Client, q: str) -> None:
    """Default configuration (Nack): a non-retryable error, invalid arguments, an unknown
    type and max_attempts=1 each show their code and message in peek; the DLQ copies are
    the broker's own dead letters (``rejected``), AMQP-009 unchanged."""
    expected = await _four_first_attempt_deaths(client, q)
    with anyio.fail_after(WAIT):
        peeked = await client.dead_letters(q).peek(10)
    assert {d.id: d.error_code for d in peeked} == expected
    assert all(d.noted and d.death_reason == "rejected" and d.attempt == 1 for d in peeked)
    by_id = {d.id: d for d in peeked}
    messages = {by_id[i].error_message or "" for i in expected}
    assert any("declined: -5" in m for m in messages)
    assert any("gateway down for 7" in m for m in messages)
    assert any("refund.card" in m for m in messages)
    # One note per death, in a bounded queue of this library's own, bound to no exchange.
    async with client.conn.channel(confirms=False) as ch:
        info = await ch.queue_declare(client.names.death_notes_queue(q), passive=True)
    assert info.message_count == 4
    bound = await bindings_to(client.names.death_notes_queue(q))
    assert bound[client.names.death_notes_queue(q)] == set()


async def test_peek_leaves_notes_and_dead_jobs_and_ignores_foreign_messages(
    client: ojs.Client, raw: amqp.Connection, q: str
) -> None:
    """Hostile or stray messages in the notes queue are skipped and kept; peek twice gives
    the same answer and removes nothing."""
    expected = await _four_first_attempt_deaths(client, q)
    notes = client.names.death_notes_queue(q)
    some_id = next(iter(expected))
    async with raw.channel() as ch:
        for body, kind in (
            (b"\xff not json", "ojs.death-note"),
            (b'{"id": 1}', "ojs.death-note"),
            (json.dumps({"id": some_id, "code": "FORGED", "message": "x"}).encode(), "other"),
        ):
            await ch.publish(body, exchange="", routing_key=notes, properties=amqp.BasicProperties(type=kind))
    with anyio.fail_after(WAIT):
        first = await client.dead_letters(q).peek(10)
        second = await client.dead_letters(q).peek(10)
    assert {d.id: d.error_code for d in first} == expected
    assert [(d.id, d.error_code) for d in first] == [(d.id, d.error_code) for d in second]
    await wait_message_count(raw, notes, 7)
    assert await client.dead_letters(q).count() == 4


async def test_annotated_mode_copies_only_to_the_dead_letter_queue(
    client: ojs.Client, raw: amqp.Connection, q: str
) -> None:
    """``annotate_dead_letters=True``: the annotated copy goes to ``ojs.queue.dlx.{q}`` only.
    The job queue (where a foreign consumer takes jobs) is empty, and no note is needed."""
    expected = await _four_first_attempt_deaths(client, q, annotate=True)
    with anyio.fail_after(WAIT):
        peeked = await client.dead_letters(q).peek(10)
        async with raw.channel(confirms=False) as ch:
            job_queue = await ch.queue_declare(client.names.job_queue(q), passive=True)
            redelivered = await ch.queue_declare(client.names.redelivered_queue(q), passive=True)
    assert {d.id: d.error_code for d in peeked} == expected
    assert not any(d.noted for d in peeked)
    assert job_queue.message_count == 0 and redelivered.message_count == 0
    bound = await bindings_to(client.names.dlx_queue(q), client.names.job_queue(q))
    # Only the DLQ is bound to the DLX (under the queue's name); the job queue is not.
    assert (client.names.dlx_exchange, q) in bound[client.names.dlx_queue(q)]
    assert not any(src == client.names.dlx_exchange for src, _ in bound[client.names.job_queue(q)])


@pytest.mark.rabbitmq_only("the CLI runs in another process; memory:// lives in this one")
async def test_cli_dlq_peek_shows_the_reason_of_a_first_attempt_death(client: ojs.Client, q: str) -> None:
    """``ojs-anyio dlq peek`` (a separate process) shows the codes, default configuration."""
    expected = await _four_first_attempt_deaths(client, q)
    cmd = [sys.executable, "-m", "ojs_anyio.cli", "dlq", "peek", q, "--json"]
    env = {**os.environ, "OJS_AMQP_URL": current_url(), "PYTHONPATH": str(ROOT)}
    with anyio.fail_after(60):
        done = await anyio.run_process(cmd, cwd=ROOT, check=False, env=env)
    assert done.returncode == 0, done.stderr.decode()
    out = json.loads(done.stdout)
    assert {j["id"]: j["reason"].split(":")[0] for j in out["jobs"]} == expected
