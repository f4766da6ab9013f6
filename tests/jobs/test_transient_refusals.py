"""Transient refusals are not final outcomes (docs/failure-handling.md).

The worker's settlement with the broker's answer injected at each settling publish (the
retry, the annotated dead letter, the control relay): ``memory://`` nacks the publish
(what RabbitMQ answers while a quorum queue elects a leader) or closes the connection
before the confirm (outcome unknown).  A job that still has attempts left is never
dead-lettered for it: the publish is tried again with backoff, and if it keeps being
refused the delivery goes back to the broker unchanged.  RabbitMQ's side of the same rule
is the cluster chaos soak (tests/cluster/test_cluster_failover.py), where a real quorum
queue nacks during its leader election.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator

import anyio
import pytest

import ojs_anyio as ojs
from ojs_anyio import amqp
from ojs_anyio.memory import MemoryBroker

from .broker_support import WAIT, Outcomes, running

pytestmark = pytest.mark.anyio

FAST = ojs.RepublishPolicy(initial_delay=0.01, max_delay=0.05, deadline=WAIT)
#: Gives up after three refusals, so a test sees the "requeued" path quickly.
SHORT = ojs.RepublishPolicy(attempts=3, initial_delay=0.01, max_delay=0.02, deadline=WAIT)
RECOVERY = amqp.RecoveryPolicy(initial_delay=0.01, max_delay=0.05)
RETRY = ojs.RetryPolicy(max_attempts=3, initial_interval="PT0.1S", jitter=False)


@pytest.fixture
async def broker() -> AsyncIterator[MemoryBroker]:
    async with MemoryBroker() as b:
        yield b


@pytest.fixture
async def client(broker: MemoryBroker) -> AsyncIterator[ojs.Client]:
    async with ojs.connect(broker.url, recovery=RECOVERY) as c:
        yield c


def fails_once(runs: Counter[int]) -> ojs.Worker:
    """A worker whose job ``flaky`` fails on its first attempt and then succeeds."""
    worker = ojs.Worker(queues=["tq"], retry=RETRY, republish=FAST, concurrency=2)

    @worker.handler("flaky")
    async def flaky(ctx: ojs.JobContext) -> None:
        runs[ctx.attempt] += 1
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")

    return worker


def finals(outcomes: Outcomes) -> Counter[str]:
    return Counter(o.outcome for o in outcomes.items)


async def test_a_retry_nacked_a_few_times_is_published_again_and_the_job_completes(
    broker: MemoryBroker, client: ojs.Client
) -> None:
    runs: Counter[int] = Counter()
    worker = fails_once(runs)
    outcomes = Outcomes(worker)
    async with running(worker, client):
        fault = broker.fail_publishes(exchange=client.names.retry_exchange, times=4)
        job = await client.push("flaky", [], queue="tq")
        final = await outcomes.wait_final(job.id)
    assert fault.hits == 4
    assert final.outcome == "completed" and final.attempt == 2
    assert [o.outcome for o in outcomes.of(job.id)] == ["retried", "completed"]
    assert runs == {1: 1, 2: 1}


async def test_a_retry_refused_past_the_policy_goes_back_to_the_broker_never_to_the_dlq(
    broker: MemoryBroker, client: ojs.Client
) -> None:
    runs: Counter[int] = Counter()
    worker = fails_once(runs)
    worker.republish = SHORT
    outcomes = Outcomes(worker)
    async with running(worker, client):
        fault = broker.fail_publishes(exchange=client.names.retry_exchange, times=None)
        job = await client.push("flaky", [], queue="tq")
        requeued = (await outcomes.wait_for(lambda o: o.outcome == "requeued"))[0]
        assert requeued.id == job.id and requeued.attempt == 1
        assert "not confirmed" in (requeued.error_message or "")
        broker.remove_fault(fault)  # the broker accepts publishes again
        final = await outcomes.wait_final(job.id)
    assert final.outcome == "completed" and final.attempt == 2
    assert "dead_lettered" not in finals(outcomes)
    assert fault.hits >= 3
    # The requeued delivery came back with the same attempt: the handler ran it again.
    assert runs[1] >= 2 and runs[2] == 1
    assert broker.queue_messages(client.names.dlx_queue("tq")) == []


async def test_a_connection_lost_before_the_retry_confirm_leaves_the_job_to_the_broker(
    broker: MemoryBroker, client: ojs.Client
) -> None:
    runs: Counter[int] = Counter()
    worker = fails_once(runs)
    outcomes = Outcomes(worker)
    async with running(worker, client):
        fault = broker.fail_publishes(exchange=client.names.retry_exchange, action="close")
        job = await client.push("flaky", [], queue="tq")
        final = await outcomes.wait_final(job.id)
    assert fault.hits == 1
    assert final.outcome == "completed" and final.attempt == 2
    assert "dead_lettered" not in finals(outcomes)
    assert runs[1] == 2  # the unsettled delivery was redelivered after the reconnection


async def test_an_annotated_dead_letter_rides_out_a_nack(broker: MemoryBroker, client: ojs.Client) -> None:
    worker = ojs.Worker(queues=["tq"], annotate_dead_letters=True, republish=FAST)
    outcomes = Outcomes(worker)

    @worker.handler("doomed")
    async def doomed(ctx: ojs.JobContext) -> None:
        raise ojs.Discard("not wanted")

    async with running(worker, client):
        fault = broker.fail_publishes(exchange=client.names.dlx_exchange, times=2)
        job = await client.push("doomed", [], queue="tq")
        final = await outcomes.wait_final(job.id)
    assert fault.hits == 2 and final.outcome == "dead_lettered"
    [dead] = broker.queue_messages(client.names.dlx_queue("tq"))
    assert dead.props.headers is not None and dead.props.headers["x-ojs-error-code"] == final.error_code


async def test_an_annotated_dead_letter_refused_throughout_is_still_dead(
    broker: MemoryBroker, client: ojs.Client
) -> None:
    worker = ojs.Worker(queues=["tq"], annotate_dead_letters=True, republish=SHORT)
    outcomes = Outcomes(worker)

    @worker.handler("doomed")
    async def doomed(ctx: ojs.JobContext) -> None:
        raise ojs.Discard("not wanted")

    async with running(worker, client):
        fault = broker.fail_publishes(exchange=client.names.dlx_exchange, times=None)
        job = await client.push("doomed", [], queue="tq")
        final = await outcomes.wait_final(job.id)
        broker.remove_fault(fault)
    assert final.outcome == "dead_lettered"
    # The fate is unchanged: the original was rejected into the DLQ by the broker instead.
    [dead] = broker.queue_messages(client.names.dlx_queue("tq"))
    assert "x-ojs-error-code" not in (dead.props.headers or {})
    assert dead.props.headers is not None and dead.props.headers["x-death"][0]["reason"] == "rejected"


async def test_a_cancel_whose_relay_is_nacked_still_reaches_the_running_job(
    broker: MemoryBroker, client: ojs.Client
) -> None:
    worker = ojs.Worker(queues=["tq"], republish=FAST)
    outcomes = Outcomes(worker)
    started = anyio.Event()

    @worker.handler("long")
    async def long(ctx: ojs.JobContext) -> None:
        started.set()
        await anyio.sleep_forever()

    async with running(worker, client):
        job = await client.push("long", [], queue="tq")
        with anyio.fail_after(WAIT):
            await started.wait()
        fault = broker.fail_publishes(exchange=client.names.control_exchange, times=3)
        await client.cancel(job.id, queue="tq")
        final = await outcomes.wait_final(job.id)
    assert fault.hits == 3 and final.outcome == "cancelled"


async def test_a_retry_copy_that_cannot_fit_a_frame_is_dead_lettered_with_that_reason(
    broker: MemoryBroker, client: ojs.Client
) -> None:
    """About 130 KB of headers fit on the way in; the retry's error headers push the copy's
    content header past frame_max: a final refusal, dead-lettered with the reason."""
    worker = ojs.Worker(queues=["tq"], retry=RETRY, republish=FAST)
    outcomes = Outcomes(worker)

    @worker.handler("big")
    async def big(ctx: ojs.JobContext) -> None:
        raise RuntimeError("x" * 2000)

    # The original's content header stays ~600 bytes under frame_max (less the 8-byte frame
    # overhead); the retry adds over 1000 bytes of error headers.
    pad = "p" * (131072 - 8 - 600)
    async with running(worker, client):
        job = client.build("big", [], queue="tq")
        async with amqp.connect(broker.url) as raw, raw.channel() as ch:
            body = ojs.encode_job(job)
            props = amqp.BasicProperties(
                content_type="application/json", message_id=job.id, headers={"pad": pad}
            )
            await ch.publish(body, exchange="", routing_key=client.names.job_queue("tq"), properties=props)
        final = await outcomes.wait_final(job.id)
    assert final.outcome == "dead_lettered" and final.attempt == 1
    assert "the retry cannot be published" in (final.error_message or "")
    assert "frame_max" in (final.error_message or "")
