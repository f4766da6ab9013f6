"""No single message stops a worker (issue 23): the hostile-delivery matrix.

A foreign client (pika, with its own encoder) publishes one poison message in front of good
jobs.  For every case: the poison ends as the rule says (dead-lettered with its reason, or
run), every good job behind it completes, and the worker is still consuming afterwards.
Then the control plane: a malformed CANCEL, and two deliveries of one job id.  RabbitMQ
only (the publisher is pika), asyncio and Trio.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import anyio
import pika
import pytest
import uuid6
from support.brokers import SECOND_USER

import ojs_anyio as ojs
from ojs_anyio import amqp

from .broker_support import WAIT, Outcomes, running, wait_message_count

pytestmark = [pytest.mark.anyio, pytest.mark.rabbitmq_only("the foreign publisher is pika")]

RETRY = ojs.RetryPolicy(max_attempts=3, initial_interval="PT0.1S", jitter=False)
FRAME_MAX = 131072
ALICE = SECOND_USER


def envelope(q: str, args: list[Any], **extra: Any) -> tuple[str, dict[str, Any]]:
    job_id = str(uuid6.uuid7())
    return job_id, {
        "specversion": "1.0", "id": job_id, "type": "h.job", "queue": q, "args": args,
        "created_at": datetime.now(UTC).isoformat(), **extra,
    }  # fmt: skip


@dataclass
class Poison:
    """One hostile message: its body, its properties, and what must become of it."""

    body: bytes
    headers: dict[str, Any] = field(default_factory=dict)
    user: tuple[str, str] = ("guest", "guest")
    props: dict[str, Any] = field(default_factory=dict)
    #: None: it runs (and completes); else (error code, words of the reason).
    dead: tuple[str, str] | None = None


def _job(q: str, args: list[Any], **extra: Any) -> tuple[str, bytes]:
    job_id, env = envelope(q, args, **extra)
    return job_id, json.dumps(env).encode()


def cases(q: str) -> Iterator[tuple[str, str, Poison]]:
    """(case, message id, poison) for queue ``q``."""
    def fail_once(**headers: Any) -> tuple[str, Poison]:
        job_id, body = _job(q, ["fail-once"])
        return job_id, Poison(body, headers)

    def dead(code: str, words: str, **headers: Any) -> tuple[str, Poison]:
        job_id, body = _job(q, ["fail-once"])
        return job_id, Poison(body, headers, dead=(code, words))

    yield "attempt 0 means 1", *fail_once(**{"x-ojs-attempt": 0})
    yield "attempt -1", *dead("INVALID_PAYLOAD", "x-ojs-attempt", **{"x-ojs-attempt": -1})
    yield "attempt 2**31-1", *dead("INVALID_PAYLOAD", "x-ojs-attempt", **{"x-ojs-attempt": 2**31 - 1})
    yield "attempt of 30 digits", *dead("INVALID_PAYLOAD", "x-ojs-attempt", **{"x-ojs-attempt": "9" * 30})
    yield "attempt 1.5", *dead("INVALID_PAYLOAD", "x-ojs-attempt", **{"x-ojs-attempt": Decimal("1.5")})
    yield "max attempts 0", *dead("INVALID_PAYLOAD", "x-ojs-max-attempts", **{"x-ojs-max-attempts": 0})
    job_id, body = _job(q, ["PLACEHOLDER"])
    yield "a JSON string that is not UTF-8", job_id, Poison(
        body.replace(b'"PLACEHOLDER"', b'"\xff\xfe"'), dead=("INVALID_PAYLOAD", "utf-8")
    )
    job_id, body = _job(q, ["ok"], meta={"deep": "PLACEHOLDER"})
    yield "JSON nested 100,000 deep", job_id, Poison(
        body.replace(b'"PLACEHOLDER"', b"[" * 100_000 + b"]" * 100_000), dead=("INVALID_PAYLOAD", "nested")
    )
    job_id, body = _job(q, ["ok"], expires_at="9999-12-31T23:59:60Z")
    yield "expires_at beyond the calendar", job_id, Poison(body, dead=("INVALID_PAYLOAD", "expires_at"))
    # ~130 KB of headers fit on the way in; the retry's error headers would not.
    job_id, body = _job(q, ["fail-once"])
    pad = "p" * (FRAME_MAX - 8 - 300)
    yield "130 KB of headers, then a failure", job_id, Poison(
        body, {"pad": pad}, dead=("HANDLER_ERROR", "frame_max")
    )
    yield "every AMQP field type pika writes, in headers", *fail_once(**{
        "s": "text", "i": 7, "l": 2**40, "neg": -(2**40), "t": True, "v": None,
        "dec": Decimal("3.14"), "when": datetime(2026, 1, 2, 3, 4, 5), "tbl": {"a": {"b": [1]}},
        "arr": [1, "two", None, [3]], "raw": b"\x00\xff",
    })  # fmt: skip
    job_id, body = _job(q, ["fail-once"])
    yield "the legacy x-ojs-dead-letter header", job_id, Poison(body, {"x-ojs-dead-letter": True})
    job_id, body = _job(q, ["fail-once"])
    yield "a validated user_id of another user", job_id, Poison(
        body, user=ALICE, props={"user_id": ALICE[0]}
    )
    job_id, body = _job(q, ["x" * 1_000_000])
    yield "a 1 MB body", job_id, Poison(body)


CASE_NAMES = [name for name, _, _ in cases("q")]


def pika_publish(q: str, messages: list[tuple[str, Poison]]) -> None:
    """Publish with pika, confirmed, straight to the job queue (default exchange)."""
    for user, group in _by_user(messages).items():
        params = pika.ConnectionParameters(
            host="127.0.0.1", credentials=pika.PlainCredentials(*user), blocked_connection_timeout=WAIT
        )
        conn = pika.BlockingConnection(params)
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            for message_id, poison in group:
                props = pika.BasicProperties(
                    message_id=message_id, delivery_mode=2, headers=poison.headers or None, **poison.props
                )
                ch.basic_publish("", f"ojs.queue.{q}", poison.body, props, mandatory=True)
        finally:
            conn.close()


def _by_user(messages: list[tuple[str, Poison]]) -> dict[tuple[str, str], list[tuple[str, Poison]]]:
    groups: dict[tuple[str, str], list[tuple[str, Poison]]] = {}
    for message_id, poison in messages:
        groups.setdefault(poison.user, []).append((message_id, poison))
    return groups


def hostile_worker(q: str) -> tuple[ojs.Worker, Outcomes, list[tuple[str, int]]]:
    worker = ojs.Worker(queues=[q], concurrency=4, retry=RETRY)
    outcomes = Outcomes(worker)
    runs: list[tuple[str, int]] = []

    @worker.handler("h.job")
    async def handler(ctx: ojs.JobContext, mode: str) -> None:
        runs.append((ctx.id, ctx.attempt))
        if mode == "fail-once" and ctx.attempt == 1:
            raise RuntimeError("fails on its first attempt")

    return worker, outcomes, runs


@pytest.mark.parametrize("case", CASE_NAMES)
async def test_one_poison_message_in_front_of_good_jobs(
    client: ojs.Client, raw: amqp.Connection, q: str, case: str, second_user_url: str
) -> None:
    [(message_id, poison)] = [(i, p) for name, i, p in cases(q) if name == case]
    goods = [_job(q, ["ok"]) for _ in range(5)]
    worker, outcomes, runs = hostile_worker(q)
    async with running(worker, client):
        messages = [(message_id, poison), *((i, Poison(b)) for i, b in goods)]
        with anyio.fail_after(WAIT):
            await anyio.to_thread.run_sync(pika_publish, q, messages)
        final = await outcomes.wait_final(message_id)
        for good_id, _ in goods:
            assert (await outcomes.wait_final(good_id)).outcome == "completed"
        after = await client.push("h.job", ["ok"], queue=q)  # still consuming
        assert (await outcomes.wait_final(after.id)).outcome == "completed"
    if poison.dead is None:
        assert final.outcome == "completed", final
        attempts = [a for i, a in runs if i == message_id]
        assert attempts == ([1, 2] if b"fail-once" in poison.body else [1])
        await wait_message_count(raw, client.names.dlx_queue(q), 0)
    else:
        code, words = poison.dead
        assert final.outcome == "dead_lettered", final
        assert final.error_code == code and words in (final.error_message or ""), final
        await wait_message_count(raw, client.names.dlx_queue(q), 1)


async def test_a_malformed_cancel_stops_no_worker_and_no_running_job(client: ojs.Client, q: str) -> None:
    worker, outcomes, _ = hostile_worker(q)
    started, release = anyio.Event(), anyio.Event()

    @worker.handler("h.long")
    async def long(ctx: ojs.JobContext) -> None:
        started.set()
        await release.wait()

    control = client.names.control_queue(q)
    bodies = [b'{"job_id": "\xff\xfe"}', b"[" * 100_000 + b"]" * 100_000, b"\x00garbage", b"[]"]
    async with running(worker, client):
        job = await client.push("h.long", [], queue=q)
        with anyio.fail_after(WAIT):
            await started.wait()
        async with client.conn.channel() as ch:
            for body in bodies:
                props = amqp.BasicProperties(type="ojs.control.cancel", content_type="application/json")
                await ch.publish(body, routing_key=control, properties=props)
        # Every bad CANCEL was taken and dropped; a good one still works.
        await client.cancel(job.id, queue=q)
        final = await outcomes.wait_final(job.id)
        after = await client.push("h.job", ["ok"], queue=q)
        assert (await outcomes.wait_final(after.id)).outcome == "completed"
    assert final.outcome == "cancelled"


async def test_two_deliveries_of_one_job_id_are_cancelled_and_stopped_together(
    client: ojs.Client, q: str
) -> None:
    """Normal after a re-push that followed PushOutcomeUnknownError: the same id twice."""
    worker = ojs.Worker(queues=[q], concurrency=4, grace_period=0.5)
    outcomes = Outcomes(worker)
    both_running = anyio.Event()
    running_now: list[int] = []

    @worker.handler("h.twice")
    async def twice(ctx: ojs.JobContext) -> None:
        running_now.append(ctx.message.delivery_tag)
        if len(running_now) == 2:
            both_running.set()
        await anyio.sleep_forever()

    job = client.build("h.twice", [], queue=q)
    async with running(worker, client):
        assert (await client.push_batch([job, job]))[1].ok
        with anyio.fail_after(WAIT):
            await both_running.wait()
        info = await client.info(job.id, queue=q)
        assert info.state == "active"
        await client.cancel(job.id, queue=q)
        cancelled = await outcomes.wait_for(
            lambda o: o.id == job.id and o.outcome == "cancelled", count=2
        )
    assert len(cancelled) == 2

    # And a graceful stop honours its grace period for both.
    second = client.build("h.twice", [], queue=q)
    running_now.clear()
    both_running = anyio.Event()
    assert (await client.push_batch([second, second]))[1].ok
    finished = anyio.Event()
    async with anyio.create_task_group() as tg:

        async def run() -> None:
            await worker.run(client)
            finished.set()

        tg.start_soon(run)
        with anyio.fail_after(WAIT):
            await both_running.wait()
        stopped_at = anyio.current_time()
        worker.stop()
        with anyio.fail_after(WAIT):
            await finished.wait()
        took = anyio.current_time() - stopped_at
    abandoned = outcomes.matching(lambda o: o.id == second.id and o.outcome == "abandoned")
    assert len(abandoned) == 2
    assert took < worker.grace_period + 5.0, took  # 0.5 s of grace, then both cancelled


def test_case_names_are_unique() -> None:
    assert len(set(CASE_NAMES)) == len(CASE_NAMES)
    assert all(isinstance(uuid.UUID(i), uuid.UUID) for _, i, _ in cases("q"))


# ------------------------------------------------------------- the trust boundary


async def test_results_go_only_to_a_requesters_own_queue(
    client: ojs.Client, raw: amqp.Connection, q: str
) -> None:
    """A job's ``reply_to`` is written by whoever published it; the worker's result goes
    out with the worker's credentials.  So it goes only to a queue exclusive to another
    connection (a waiting requester), never into a durable queue named by the message."""
    worker, outcomes, _ = hostile_worker(q)
    victim = f"ojs-test-victim-{uuid.uuid4().hex[:8]}"
    async with raw.channel() as ch:
        await ch.queue_declare(victim, durable=False, auto_delete=False)
    try:
        async with running(worker, client):
            job_id, body = _job(q, ["ok"])
            poison = Poison(body, props={"reply_to": victim})
            with anyio.fail_after(WAIT):
                await anyio.to_thread.run_sync(pika_publish, q, [(job_id, poison)])
            assert (await outcomes.wait_final(job_id)).outcome == "completed"
            # A result pushed the documented way still comes back.
            pending = await client.push_for_result("h.job", ["ok"], queue=q)
            assert (await pending.result(timeout=WAIT)) is None
        async with raw.channel() as ch:
            assert (await ch.queue_declare(victim, passive=True)).message_count == 0
    finally:
        async with raw.channel() as ch:
            await ch.queue_delete(victim)


async def raw_info(conn: amqp.Connection, names: ojs.Names, q: str, job_id: str) -> dict[str, Any]:
    """INFO as 001 §5.8 describes it, answer as the worker sent it (every key)."""
    async with conn.channel() as ch:
        reply = await ch.queue_declare("", exclusive=True, auto_delete=True)
        async with ch.consume(reply.name, prefetch=1) as answers:
            props = amqp.BasicProperties(
                type="ojs.control.info", reply_to=reply.name, correlation_id=uuid.uuid4().hex
            )
            body = json.dumps({"job_id": job_id}).encode()
            await ch.publish(body, routing_key=names.control_queue(q), properties=props)
            with anyio.fail_after(WAIT):
                async for msg in answers:
                    await msg.ack()
                    answer: dict[str, Any] = json.loads(msg.body)
                    return answer
    raise AssertionError("no answer")


@pytest.mark.parametrize("details", [True, False], ids=["details", "no-details"])
async def test_info_can_leave_out_results_and_backtraces(
    client: ojs.Client, raw: amqp.Connection, q: str, details: bool
) -> None:
    worker = ojs.Worker(queues=[q], info_details=details, retry=ojs.RetryPolicy(max_attempts=1))
    outcomes = Outcomes(worker)

    @worker.handler("h.secret")
    async def secret(ctx: ojs.JobContext, fail: bool) -> str:
        if fail:
            raise RuntimeError("the database password is hunter2")
        return "a secret result"

    async with running(worker, client):
        ok = await client.push("h.secret", [False], queue=q)
        bad = await client.push("h.secret", [True], queue=q)
        await outcomes.wait_final(ok.id)
        await outcomes.wait_final(bad.id)
        ok_info = await raw_info(raw, client.names, q, ok.id)
        bad_info = await raw_info(raw, client.names, q, bad.id)
    assert ok_info["state"] == "completed" and bad_info["state"] == "discarded"
    assert ("result" in ok_info) is details
    assert ("backtrace" in bad_info["error"]) is details
    assert "hunter2" in bad_info["error"]["message"]  # the message itself is what INFO is for
