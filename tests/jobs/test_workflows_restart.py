"""A broker restart in the middle of a workflow, with quorum queues (docs/workflows.md,
"Broker restart"), on the suite's private node (``private_node``: the test is marked
``disruptive``), asyncio and Trio.

A batch of 30 jobs with ``on_complete`` and ``on_success`` runs on one worker
(concurrency 8) whose client has ``QueueOptions.quorum()``, so the job queue and the
workflow's own queues (tokens, records, lock, journal) are quorum queues.  The first 10
jobs run through; the next 8 hold in their handler until the test lets them go.  With 10
done and 8 held, the node's broker stops (``rabbitmqctl stop_app``) and starts again
(``start_app``); the held handlers are let go either while the broker is down or once it
is back, and they are ``async def`` handlers or plain ``def`` ones (run in a thread, which
nothing can interrupt: they return into the outage).  The held jobs' deliveries die with
the restart, so each of them runs again after it.  In every case every job completes,
each callback runs exactly once with all 30 results, nothing is left in the job queue or
its dead-letter queue, and inspection says ``completed``.

The same for a chain: ``chain(group(a, b), hold, c)`` with ``hold`` held across the
restart; ``c``, pushed under ``hold``'s permit, runs exactly once.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.from_thread
import pytest
from harness import PrivateNode
from support.workers import Outcomes, running

import ojs_anyio as ojs
from ojs_anyio import amqp
from ojs_anyio.jobs._workflows import workflow_queues

pytestmark = pytest.mark.anyio

#: Reconnect quickly once the node is back (the default backoff grows to seconds).
RECOVERY = amqp.RecoveryPolicy(initial_delay=0.05, multiplier=2.0, max_delay=0.5, jitter=0.1)
N = 30
FREE = 10  # jobs 0..9 run through; jobs 10.. hold until the test lets them go
CONCURRENCY = 8


@pytest.mark.parametrize("handler", ["async", "sync"])
@pytest.mark.parametrize("released", ["while_down", "after_restart"])
async def test_batch_callbacks_fire_once_across_a_broker_restart_with_quorum_queues(
    private_node: PrivateNode, released: str, handler: str
) -> None:
    q = f"wf-restart-{uuid.uuid4().hex[:12]}"
    gate = anyio.Event()
    held: list[int] = []
    all_held = anyio.Event()
    callbacks: list[tuple[str | None, dict[str, Any]]] = []
    both_callbacks = anyio.Event()
    handle: ojs.WorkflowHandle | None = None

    calls: list[int] = []
    thread_gate = threading.Event()

    def hold() -> None:
        if len(held) == CONCURRENCY:
            all_held.set()

    async def job(ctx: ojs.JobContext, i: int) -> int:
        calls.append(i)
        if i >= FREE and not gate.is_set():
            held.append(i)
            hold()
            await gate.wait()
        return i

    def sync_job(ctx: ojs.JobContext, i: int) -> int:
        calls.append(i)
        if i >= FREE and not thread_gate.is_set():
            held.append(i)
            anyio.from_thread.run_sync(hold)
            thread_gate.wait(timeout=120)
        return i

    async def callback(ctx: ojs.JobContext) -> None:
        callbacks.append((ctx.job.type, ctx.parent_results))
        if len(callbacks) >= 2:
            both_callbacks.set()

    with anyio.fail_after(300):
        async with ojs.connect(
            private_node.url, queue_options=ojs.QueueOptions.quorum(), recovery=RECOVERY
        ) as client:
            worker = ojs.Worker(
                queues=[q], concurrency=CONCURRENCY, middleware=[ojs.WorkflowMiddleware(client)]
            )
            outcomes = Outcomes(worker)
            worker.register("job", job if handler == "async" else sync_job)
            worker.register("done", callback)
            worker.register("ok", callback)
            try:
                async with running(worker, client, timeout=240):
                    handle = await client.batch(
                        [ojs.step("job", [i], queue=q) for i in range(N)],
                        on_complete=ojs.step("done", queue=q),
                        on_success=ojs.step("ok", queue=q),
                    )
                    await outcomes.wait_for(
                        lambda o: o.type == "job" and o.outcome == "completed", FREE, timeout=60
                    )
                    await all_held.wait()
                    async with private_node.broker_stopped():
                        if released == "while_down":
                            gate.set()
                            thread_gate.set()
                    gate.set()
                    thread_gate.set()
                    await both_callbacks.wait()
                    # Every job done, each at least once (the held ones twice or more).
                    await outcomes.wait_for(
                        lambda o: o.type == "job" and o.outcome == "completed", N, timeout=120
                    )
                    with anyio.fail_after(120):
                        while {o.result for o in outcomes.matching(_completed_job)} != set(range(N)):
                            await outcomes.wait_for(
                                _completed_job, len(outcomes.matching(_completed_job)) + 1
                            )
                # The worker has stopped: nothing it was running is left unsettled, so a
                # second copy of a callback would be in the job queue now.
                state = await client.workflow(handle.id)
                async with client.conn.channel(confirms=False) as ch:
                    left = await ch.queue_declare(client.names.job_queue(q), passive=True)
                    dead = await ch.queue_declare(client.names.dlx_queue(q), passive=True)
            finally:
                with anyio.CancelScope(shield=True), anyio.fail_after(60):
                    await _delete_queues(client, q, handle)

    # The held jobs' deliveries died with the restart: each ran again (at least once).
    assert sorted(held) == list(range(FREE, FREE + CONCURRENCY))
    assert all(calls.count(i) >= 2 for i in held)
    results = {str(i): i for i in range(N)}
    assert sorted(callbacks, key=lambda c: c[0] or "") == [("done", results), ("ok", results)]
    assert (left.message_count, dead.message_count) == (0, 0)
    assert state.state == "completed"
    assert state.failed_count == 0
    assert all(state.jobs[f"r.{i}"] == "completed" for i in range(N))


@pytest.mark.parametrize("released", ["while_down", "after_restart"])
async def test_chain_successor_runs_once_across_a_broker_restart_with_quorum_queues(
    private_node: PrivateNode, released: str
) -> None:
    """``chain(group(a, b), hold, c)`` on quorum queues: the group fans in before the
    restart; ``hold`` is held in its handler while the broker restarts, so its delivery dies
    and it runs again; its successor ``c`` is pushed under ``hold``'s permit and runs exactly
    once, with every result before it."""
    q = f"wf-restart-{uuid.uuid4().hex[:12]}"
    gate = anyio.Event()
    holding = anyio.Event()
    calls: list[tuple[str, dict[str, Any]]] = []
    handle: ojs.WorkflowHandle | None = None

    def record(name: str, value: Any) -> Callable[[ojs.JobContext], Awaitable[Any]]:
        async def handler(ctx: ojs.JobContext) -> Any:
            calls.append((name, ctx.parent_results))
            if name == "hold" and not gate.is_set():
                holding.set()
                await gate.wait()
            return value

        return handler

    with anyio.fail_after(300):
        async with ojs.connect(
            private_node.url, queue_options=ojs.QueueOptions.quorum(), recovery=RECOVERY
        ) as client:
            worker = ojs.Worker(queues=[q], concurrency=4, middleware=[ojs.WorkflowMiddleware(client)])
            outcomes = Outcomes(worker)
            for name, value in (("a", 1), ("b", 2), ("hold", "held"), ("c", "end")):
                worker.register(name, record(name, value))
            try:
                async with running(worker, client, timeout=240):
                    handle = await client.chain(
                        ojs.group(ojs.step("a", queue=q), ojs.step("b", queue=q)),
                        ojs.step("hold", queue=q),
                        ojs.step("c", queue=q),
                    )
                    await holding.wait()
                    async with private_node.broker_stopped():
                        if released == "while_down":
                            gate.set()
                    gate.set()
                    await outcomes.wait_for(lambda o: o.type == "c" and o.outcome == "completed", timeout=120)
                state = await client.workflow(handle.id)
                async with client.conn.channel(confirms=False) as ch:
                    left = await ch.queue_declare(client.names.job_queue(q), passive=True)
            finally:
                with anyio.CancelScope(shield=True), anyio.fail_after(60):
                    await _delete_queues(client, q, handle)

    assert [name for name, _ in calls].count("hold") >= 2  # its delivery died with the restart
    assert [(name, parents) for name, parents in calls if name == "c"] == [
        ("c", {"0": {"0": 1, "1": 2}, "1": "held"})
    ]
    assert left.message_count == 0
    assert state.state == "completed"


def _completed_job(o: ojs.JobOutcome) -> bool:
    return o.type == "job" and o.outcome == "completed"


async def _delete_queues(client: ojs.Client, q: str, handle: ojs.WorkflowHandle | None) -> None:
    names = client.names
    queues = [names.job_queue(q), names.dlx_queue(q), names.control_queue(q), names.redelivered_queue(q)]
    if handle is not None:
        queues += workflow_queues(names.prefix, handle.envelope)
    async with client.conn.channel(confirms=False) as ch:
        for name in queues:
            await ch.queue_delete(name)
