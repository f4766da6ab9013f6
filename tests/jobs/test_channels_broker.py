"""AMQP-028 (channel per task / channel pool): which channel each part of the job layer uses.

* A worker consumes each of its queues on a channel of its own, and its control plane on
  others: the broker lists the consumers of two job queues (and the control queues) on
  distinct channels, so a channel error on one queue cannot stop another's consumer.
* The client's publishing channel is re-opened after the broker closed it: a push after a
  channel error (404 on a passive declare) goes through.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import anyio
import pytest
from harness.broker import rabbitmqctl

import ojs_anyio as ojs
from ojs_anyio import amqp

from .broker_support import WAIT, Outcomes, running

pytestmark = pytest.mark.anyio


async def consumer_channels(*queues: str) -> dict[str, list[str]]:
    rows = json.loads(
        await rabbitmqctl("list_consumers", "queue_name", "channel_pid", "--formatter", "json", "-q")
    )
    out: dict[str, list[str]] = {q: [] for q in queues}
    for row in rows:
        if row["queue_name"] in out:
            out[row["queue_name"]].append(row["channel_pid"])
    return out


@pytest.mark.rabbitmq_only("reads the broker's consumer channels through rabbitmqctl")
async def test_amqp_028_each_queue_and_the_control_plane_get_their_own_channels(
    client: ojs.Client, new_queue: Callable[..., str]
) -> None:
    a, b = new_queue(), new_queue()
    worker = ojs.Worker(queues=[a, b])
    names = client.names
    async with running(worker, client):
        with anyio.fail_after(60):  # rabbitmqctl starts an Erlang VM: slow on a loaded machine
            channels = await consumer_channels(
                names.job_queue(a), names.job_queue(b), names.control_queue(a), names.control_queue(b)
            )
    assert all(len(pids) == 1 for pids in channels.values()), channels
    job_a, job_b = channels[names.job_queue(a)][0], channels[names.job_queue(b)][0]
    control = {channels[names.control_queue(a)][0], channels[names.control_queue(b)][0]}
    assert job_a != job_b
    assert not control & {job_a, job_b}


async def test_amqp_028_publishing_channel_is_reopened_after_a_channel_error(
    client: ojs.Client, q: str
) -> None:
    worker = ojs.Worker(queues=[q])
    outcomes = Outcomes(worker)

    @worker.handler("after.error")
    async def handler(ctx: ojs.JobContext) -> None:
        pass

    async with running(worker, client):
        with anyio.fail_after(WAIT):
            before = await client.channel()
            with pytest.raises(amqp.NotFound):
                await client.dead_letters("no-such-queue-here").count()  # 404 closes the channel
            job = await client.push("after.error", [], queue=q)
            assert await client.channel() is not before
        assert (await outcomes.wait_final(job.id)).outcome == "completed"
