"""Hostile deliveries, generated (issue 23): whatever a client of the vhost publishes, the
worker settles each message with a final outcome and carries on.

Hypothesis makes batches of messages through ``memory://`` (the in-process broker speaks
the real frames): bodies that are envelopes, random bytes, random JSON or deep nesting;
headers the worker reads (attempts, counts, the grace window's start…) with values of any
AMQP type; properties such as ``reply_to``.  For every batch: each message gets exactly
one final outcome (completed or dead-lettered), every dead-lettered one is in the
dead-letter queue, and a good job pushed after them completes.  Asyncio and Trio.
"""

from __future__ import annotations

import json
import os
from typing import Any

import anyio
import pytest
import uuid6
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ojs_anyio as ojs
from ojs_anyio import amqp
from ojs_anyio.memory import MemoryBroker

Q = "hq"
WAIT = 20.0

HEADER_KEYS = [
    "x-ojs-attempt", "x-ojs-max-attempts", "x-ojs-unknown-type-since", "x-delivery-count",
    "x-ojs-unsettled-deliveries", "x-ojs-dead-letter", "x-ojs-trace-id", "x-ojs-traceparent",
    "x-ojs-error-code", "x-ojs-error-backtrace", "x-death",
]  # fmt: skip

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.text(max_size=30),
    st.binary(max_size=20),
    st.decimals(allow_nan=False, allow_infinity=False, places=2, min_value=-1000, max_value=1000),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)
headers = st.dictionaries(
    st.one_of(st.sampled_from(HEADER_KEYS), st.text(min_size=1, max_size=12)), values, max_size=4
)


@st.composite
def bodies(draw: st.DrawFn, job_id: str) -> bytes:
    kind = draw(st.sampled_from(["job", "job", "bytes", "json", "deep"]))
    if kind == "job":
        job: dict[str, Any] = {
            "specversion": "1.0", "id": job_id, "queue": Q, "created_at": "2026-01-01T00:00:00Z",
            "type": draw(st.sampled_from(["p.ok", "p.fail", "p.nobody"])),
            "args": draw(st.lists(st.integers(-5, 5), max_size=2)),
        }  # fmt: skip
        if draw(st.booleans()):
            job[draw(st.sampled_from(["expires_at", "timeout", "priority", "meta", "retry"]))] = draw(
                st.one_of(st.just("9999-12-31T23:59:60Z"), st.integers(-3, 3), st.text(max_size=5), values)
            )
        return json.dumps(job, default=str).encode()
    if kind == "bytes":
        return draw(st.binary(max_size=60))
    if kind == "json":
        return json.dumps(draw(values), default=str).encode()
    return b"[" * 2_000 + b"]" * 2_000  # past the decoder's depth


@st.composite
def deliveries(draw: st.DrawFn) -> tuple[str, bytes, amqp.BasicProperties]:
    job_id = str(uuid6.uuid7())
    props = amqp.BasicProperties(
        message_id=job_id,
        headers=draw(headers),
        reply_to=draw(st.one_of(st.none(), st.text(min_size=1, max_size=20))),
        correlation_id=draw(st.one_of(st.none(), st.text(max_size=20))),
        type=draw(st.one_of(st.none(), st.text(max_size=20))),
        priority=draw(st.one_of(st.none(), st.integers(0, 255))),
    )
    return job_id, draw(bodies(job_id)), props


async def scenario(batch: list[tuple[str, bytes, amqp.BasicProperties]]) -> None:
    worker = ojs.Worker(
        queues=[Q], concurrency=4, unknown_type_grace=0, retry=ojs.RetryPolicy(max_attempts=1)
    )
    finals: dict[str, list[str]] = {}
    done = anyio.Event()
    expected = {job_id for job_id, _, _ in batch}

    def on_outcome(outcome: ojs.JobOutcome) -> None:
        if outcome.outcome in ("completed", "dead_lettered") and outcome.id is not None:
            finals.setdefault(outcome.id, []).append(outcome.outcome)
        if expected <= set(finals):
            done.set()

    worker.add_listener(on_outcome)

    @worker.handler("p.ok")
    async def ok(ctx: ojs.JobContext, *args: int) -> None:
        pass

    @worker.handler("p.fail")
    async def fail(ctx: ojs.JobContext, *args: int) -> None:
        raise ojs.Discard("always")

    @worker.handler("p.good")
    async def good(ctx: ojs.JobContext) -> None:
        pass

    async with MemoryBroker() as broker, ojs.connect(broker.url) as client, anyio.create_task_group() as tg:
        tg.start_soon(worker.run, client)
        good_job = client.build("p.good", [], queue=Q)
        expected.add(good_job.id)
        with anyio.fail_after(WAIT):
            await worker.wait_ready()
            async with client.conn.channel() as ch:
                for _, body, props in batch:
                    await ch.publish(body, routing_key=client.names.job_queue(Q), properties=props)
            await client.push_job(good_job)  # behind the hostile ones
        with anyio.move_on_after(WAIT):
            await done.wait()
        missing = [(i, b[:200], p.headers) for i, b, p in batch if i not in finals]
        assert done.is_set(), f"no final outcome for {missing} (good job: {finals.get(good_job.id)})"
        worker.stop()
        dead_in_queue = len(broker.queue_messages(client.names.dlx_queue(Q)))
    for job_id in expected:
        assert len(finals.get(job_id, [])) == 1, (job_id, finals.get(job_id))
    assert finals[good_job.id] == ["completed"]
    dead = sum(f == ["dead_lettered"] for f in finals.values())
    assert dead_in_queue == dead


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(
    max_examples=int(os.environ.get("OJS_HYPOTHESIS_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(batch=st.lists(deliveries(), min_size=1, max_size=6, unique_by=lambda d: d[0]))
def test_any_batch_of_hostile_deliveries_is_settled_and_the_worker_carries_on(
    backend: str, batch: list[tuple[str, bytes, amqp.BasicProperties]]
) -> None:
    anyio.run(scenario, batch, backend=backend)
