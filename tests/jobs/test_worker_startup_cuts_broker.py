"""A connection cut at any method of a worker's start-up is ridden out.

A worker started as its connection drops (a process restarted beside a network blip, the
workflow chaos run's SIGKILL then cut) sends each start-up method once: opening the
control channel, declaring and binding its queues, registering the consumers.  A cut while
one of them waits for its reply fails that call with ``ConnectionLostError`` (the AMQP
layer's rule: a call in flight at the drop may or may not have happened).  The worker must
take that as the connection loss it is, wait for the recovery and carry on: its ``run()``
does not fail, and it runs jobs.

The cut is exact: :class:`~harness.frames.MethodCutProxy` cuts every connection the moment
the n-th method of a kind reaches it, before the broker sees it.  The start-up sends, in
order, on the worker's connection: the declarations of the worker's queues (Channel.Open
1); the control plane's channel (Channel.Open 2: Exchange.Declare 4 is the control
exchange, Queue.Bind 3 its broadcast queue's binding), the relay's
channel and consumer (Channel.Open 3, Basic.Consume 1), the control consumer (Basic.Consume
2); each job queue's channel and consumer (Channel.Open 4 and 5, Basic.Consume 3 and 4).
"""

from __future__ import annotations

import json

import anyio
import pytest
from harness.broker import rabbitmqctl
from harness.frames import BASIC_CONSUME, CHANNEL_OPEN, MethodCutProxy
from support.workers import WAIT, Outcomes, running

import ojs_anyio as ojs
from ojs_anyio import amqp

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.rabbitmq_only("the proxy cuts a TCP connection: memory:// has no socket"),
]

EXCHANGE_DECLARE = (40, 10)
QUEUE_BIND = (50, 20)
CONFIRM_SELECT = (85, 10)

CUTS = [
    pytest.param(CHANNEL_OPEN, 2, id="control-channel-open"),
    pytest.param(CONFIRM_SELECT, 2, id="control-channel-confirms"),
    pytest.param(EXCHANGE_DECLARE, 4, id="control-exchange-declare"),
    pytest.param(QUEUE_BIND, 3, id="control-bind"),
    pytest.param(CHANNEL_OPEN, 3, id="relay-channel-open"),
    pytest.param(BASIC_CONSUME, 1, id="relay-consume"),
    pytest.param(BASIC_CONSUME, 2, id="control-consume"),
    pytest.param(CHANNEL_OPEN, 4, id="job-channel-open"),
    pytest.param(BASIC_CONSUME, 3, id="job-consume"),
    pytest.param(CHANNEL_OPEN, 5, id="redelivered-channel-open"),
    pytest.param(BASIC_CONSUME, 4, id="redelivered-consume"),
]


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "rst"])
@pytest.mark.parametrize(("method", "nth"), CUTS)
async def test_a_cut_during_the_worker_start_up_is_ridden_out(
    q: str, method: tuple[int, int], nth: int, reset: bool
) -> None:
    recovery = amqp.RecoveryPolicy(initial_delay=0.01, max_delay=0.1)
    worker = ojs.Worker(queues=[q], concurrency=2)
    outcomes = Outcomes(worker)

    @worker.handler("after.cut")
    async def handler(ctx: ojs.JobContext) -> str:
        return "ran"

    async with MethodCutProxy() as proxy, ojs.connect(proxy.url(), recovery=recovery) as client:
        proxy.cut_at(method, nth=nth, reset=reset)
        with anyio.fail_after(WAIT):
            async with running(worker, client):
                assert proxy.fired.is_set(), "the cut did not land in the worker's start-up"
                job = await client.push("after.cut", [], queue=q)
                assert (await outcomes.wait_final(job.id)).outcome == "completed"
                # One broadcast queue for the worker: none declared by a start-up cut short
                # is left bound (recovery would keep it, unread, for the connection's life).
                assert len(await control_bindings(client.names.control_exchange, q)) == 1
    assert proxy.connections_cut == 1


async def control_bindings(exchange: str, key: str) -> list[str]:
    """The queues bound to ``exchange`` with ``key``."""
    rows = json.loads(
        await rabbitmqctl(
            "list_bindings", "source_name", "destination_name", "routing_key", "--formatter", "json", "-q"
        )
    )
    return [r["destination_name"] for r in rows if r["source_name"] == exchange and r["routing_key"] == key]
