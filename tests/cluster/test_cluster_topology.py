"""Quorum queues through the whole OJS topology, and the cron leader's failover, on the cluster."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable

import anyio
import pytest

import ojs_anyio as ojs
from ojs_anyio import amqp

from .conftest import NODES, Cluster

pytestmark = [pytest.mark.anyio, pytest.mark.cluster, pytest.mark.timeout(600)]

FAST_RECOVERY = amqp.RecoveryPolicy(initial_delay=0.1, multiplier=2.0, max_delay=1.0, jitter=0.1)


async def test_every_queue_of_a_quorum_client_is_quorum_and_at_least_once(cluster: Cluster) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}."
    opts = ojs.QueueOptions.quorum()
    done: Counter[str] = Counter()
    all_done = anyio.Event()
    worker = ojs.Worker(queues=["q"], concurrency=4, retry=ojs.RetryPolicy(initial_interval="PT0.1S"))

    @worker.handler("t.fail_once")
    async def fail_once(ctx: ojs.JobContext) -> None:
        if ctx.attempt == 1:
            raise RuntimeError("retry me")
        done["retried"] += 1
        if len(done) == 2:
            all_done.set()

    @worker.handler("t.scheduled")
    async def scheduled(ctx: ojs.JobContext) -> None:
        done["scheduled"] += 1
        if len(done) == 2:
            all_done.set()

    with anyio.fail_after(120):
        async with ojs.connect(cluster.url(), prefix=prefix, queue_options=opts, recovery=FAST_RECOVERY) as c:
            await c.push("t.fail_once", queue="q")
            await c.push("t.scheduled", queue="q", delay=0.3)
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.run, c)
                await all_done.wait()
                worker.stop()
            names = c.names
    listing = ("list_queues", "name", "type", "arguments", "--no-table-headers")
    out = await cluster.run("ctl", "a", "-q", *listing)
    ours = {line.split("\t")[0]: line for line in out.splitlines() if line.startswith(prefix)}
    kinds = {
        "job": names.job_queue("q"),
        "dead letters": names.dlx_queue("q"),
        "landing": names.delay_landing_queue("q"),
        "delay level 0": names.delay_queue(0),
        "delay level 31": names.delay_queue(31),
    }
    retry = [n for n in ours if n.startswith(f"{prefix}ojs.queue.retry.q.")]
    assert len(retry) == 1, ours
    kinds["retry"] = retry[0]
    for kind, name in kinds.items():
        assert name in ours, f"{kind} queue {name} not declared: {sorted(ours)}"
        assert "\tquorum\t" in ours[name], f"{kind}: {ours[name]}"
        if kind != "dead letters":  # every queue a job leaves by dead-lettering
            assert "at-least-once" in ours[name] and "reject-publish" in ours[name], f"{kind}: {ours[name]}"
    assert dict(done) == {"retried": 1, "scheduled": 1}

    # A spec-default (classic) declaration of the same queue is refused, never silently mixed.
    async with ojs.connect(cluster.url(), prefix=prefix, recovery=FAST_RECOVERY) as classic:
        with pytest.raises(ojs.TopologyConflictError, match="quorum"):
            await classic.declare_queue("q")


class Recorder:
    def __init__(self) -> None:
        self.fired: list[tuple[str, ojs.Fired]] = []
        self._changed = anyio.Event()

    def listener(self, who: str) -> Callable[[ojs.SchedulerEvent], None]:
        def on_event(event: ojs.SchedulerEvent) -> None:
            if isinstance(event, ojs.Fired):
                self.fired.append((who, event))
            self._changed.set()
            self._changed = anyio.Event()

        return on_event

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            await self._changed.wait()


async def test_cron_leader_moves_to_a_surviving_node(cluster: Cluster) -> None:
    """The leader's node stops: its connection fails over, the token goes to the other instance."""
    prefix = f"t{uuid.uuid4().hex[:8]}."
    opts = ojs.QueueOptions.quorum()
    rec = Recorder()
    scheds: dict[str, ojs.Scheduler] = {}
    for who in ("x", "y"):
        sched = ojs.Scheduler("g", instance_id=who)
        sched.add("cron.tick", "* * * * * *", queue="q", name="tick")
        sched.add_listener(rec.listener(who))
        scheds[who] = sched
    urls = {"x": cluster.url("a", "b", "c"), "y": cluster.url("b", "c", "a")}

    async def run(who: str) -> None:
        async with ojs.connect(urls[who], prefix=prefix, queue_options=opts, recovery=FAST_RECOVERY) as c:
            await scheds[who].run(c)

    with anyio.fail_after(240):
        async with anyio.create_task_group() as tg:
            for who in scheds:
                tg.start_soon(run, who)
            await rec.wait_for(lambda: len(rec.fired) >= 2)
            leader = "x" if scheds["x"].is_leader else "y"
            other = "y" if leader == "x" else "x"
            node = urls[leader].split("@")[1].split(",")[0]
            node_name = NODES[int(node.rsplit(":", 1)[1]) - cluster.port("a")]
            before = len(rec.fired)
            await cluster.stop_app(node_name)  # the leader's connection is closed by the broker
            try:
                await rec.wait_for(lambda: any(who == other for who, _ in rec.fired[before:]))
                assert scheds[other].is_leader
            finally:
                await cluster.restart(node_name)
            tg.cancel_scope.cancel()
    ticks = [event.tick for _, event in rec.fired]
    assert len(ticks) == len(set(ticks)), "a tick fired twice"
