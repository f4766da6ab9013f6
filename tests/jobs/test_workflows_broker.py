"""OJS workflows (chain, group, batch) on RabbitMQ and memory://, asyncio and Trio:
each primitive, the nestings, ``parent_results`` and failure propagation
(``docs/workflows.md``).  Every wait is on worker outcomes, bounded by ``fail_after``."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.to_thread
import pytest
from support.cleanup import Cleanup
from support.waits import wait_until

import ojs_anyio as ojs
from ojs_anyio.jobs._workflows import workflow_queues

from .broker_support import Outcomes, queue_facts, running

pytestmark = pytest.mark.anyio


@pytest.fixture
def client(client: ojs.Client, cleanup: Cleanup) -> ojs.Client:
    """The test's client: every workflow it starts has its queues deleted after the test."""
    start = client.start_workflow

    async def start_and_register(workflow: Any) -> Any:
        handle = await start(workflow)
        for name in workflow_queues(client.names.prefix, handle.envelope):
            cleanup.queue(name)
        return handle

    client.start_workflow = start_and_register  # type: ignore[method-assign]
    return client


NO_RETRY = ojs.RetryPolicy(max_attempts=1)


class Recorder:
    """A worker whose handlers record what they ran with: (type, args, parent_results)."""

    def __init__(self, client: ojs.Client, q: str, concurrency: int = 8) -> None:
        self.worker = ojs.Worker(
            queues=[q], concurrency=concurrency, middleware=[ojs.WorkflowMiddleware(client)]
        )
        self.outcomes = Outcomes(self.worker)
        self.calls: list[tuple[str, list[Any], dict[str, Any], str | None]] = []

    def handle(self, job_type: str, fn: Callable[..., Any] | None = None) -> None:
        async def handler(ctx: ojs.JobContext, *args: Any) -> Any:
            self.calls.append((job_type, list(args), ctx.parent_results, ctx.workflow_id))
            return fn(*args) if fn is not None else {"ran": job_type, "args": list(args)}

        self.worker.register(job_type, handler)

    def ran(self, job_type: str) -> list[tuple[str, list[Any], dict[str, Any], str | None]]:
        return [c for c in self.calls if c[0] == job_type]

    async def wait_completed(self, job_type: str, count: int = 1) -> None:
        await self.outcomes.wait_for(lambda o: o.type == job_type and o.outcome == "completed", count)


def fail(*args: Any) -> Any:
    raise RuntimeError("boom")


@asynccontextmanager
async def recorder(client: ojs.Client, q: str, *types: str) -> AsyncIterator[Recorder]:
    rec = Recorder(client, q)
    for t in types:
        rec.handle(t)
    yield rec


async def test_chain_runs_steps_in_order_with_parent_results(client: ojs.Client, q: str) -> None:
    rec = Recorder(client, q)
    rec.handle("a", lambda: 1)
    rec.handle("b", lambda: 2)
    rec.handle("c", lambda: 3)
    async with running(rec.worker, client):
        handle = await client.chain(ojs.step("a", queue=q), ojs.step("b", queue=q), ojs.step("c", queue=q))
        await rec.wait_completed("c")
    assert [c[0] for c in rec.calls] == ["a", "b", "c"]
    assert [c[2] for c in rec.calls] == [{}, {"0": 1}, {"0": 1, "1": 2}]
    assert {c[3] for c in rec.calls} == {handle.id}
    assert handle.type == "chain" and len(handle.job_ids) == 1


async def test_chain_stops_at_a_failed_step(client: ojs.Client, q: str) -> None:
    rec = Recorder(client, q)
    rec.handle("a", lambda: 1)
    rec.handle("b", fail)
    rec.handle("c")
    async with running(rec.worker, client):
        await client.chain(
            ojs.step("a", queue=q), ojs.step("b", queue=q, retry=NO_RETRY), ojs.step("c", queue=q)
        )
        await rec.outcomes.wait_for(lambda o: o.type == "b" and o.outcome == "dead_lettered")
        # The chain stopped: nothing else is pushed (the queue drains to empty).
        await rec.wait_completed("a")
    assert rec.ran("c") == []


async def test_group_runs_all_jobs_and_failure_leaves_siblings_running(client: ojs.Client, q: str) -> None:
    rec = Recorder(client, q)
    rec.handle("ok")
    rec.handle("bad", fail)
    async with running(rec.worker, client):
        handle = await client.group(
            ojs.step("ok", [1], queue=q),
            ojs.step("bad", queue=q, retry=NO_RETRY),
            ojs.step("ok", [2], queue=q),
        )
        await rec.wait_completed("ok", 2)
        await rec.outcomes.wait_for(lambda o: o.type == "bad" and o.outcome == "dead_lettered")
    assert sorted(c[1][0] for c in rec.ran("ok")) == [1, 2]
    assert len(handle.job_ids) == 3 and len(set(handle.job_ids)) == 3


@pytest.mark.parametrize("failing", [False, True])
async def test_batch_fires_callbacks_per_the_matrix(client: ojs.Client, q: str, failing: bool) -> None:
    rec = Recorder(client, q)
    rec.handle("work", lambda i: i * 10)
    rec.handle("bad", fail)
    for cb in ("done", "yay", "alert"):
        rec.handle(cb)
    jobs = [ojs.step("work", [i], queue=q) for i in range(5)]
    if failing:
        jobs.append(ojs.step("bad", queue=q, retry=NO_RETRY))
    async with running(rec.worker, client):
        await client.batch(
            jobs,
            on_complete=ojs.step("done", queue=q),
            on_success=ojs.step("yay", queue=q),
            on_failure=ojs.step("alert", queue=q),
        )
        await rec.wait_completed("done")
        await rec.wait_completed("alert" if failing else "yay")
        # A marker job after the callbacks: the other callback never came before it.
        await client.push("done", queue=q)
        await rec.wait_completed("done", 2)
    assert len(rec.ran("yay")) == (0 if failing else 1)
    assert len(rec.ran("alert")) == (1 if failing else 0)
    expected = {str(i): i * 10 for i in range(5)}
    if failing:
        expected["5"] = None
    assert rec.ran("done")[0][2] == expected
    assert rec.ran("alert" if failing else "yay")[0][2] == expected


async def test_group_as_a_chain_step(client: ojs.Client, q: str) -> None:
    rec = Recorder(client, q)
    rec.handle("extract", lambda: {"report": 456})
    rec.handle("transform", lambda fmt: {"path": f"/x.{fmt}"})
    rec.handle("load", lambda: "loaded")
    async with running(rec.worker, client):
        await client.chain(
            ojs.step("extract", queue=q),
            ojs.group(*(ojs.step("transform", [f], queue=q) for f in ("csv", "pdf", "xlsx"))),
            ojs.step("load", queue=q),
        )
        await rec.wait_completed("load")
    transforms = rec.ran("transform")
    assert len(transforms) == 3
    assert all(t[2] == {"0": {"report": 456}} for t in transforms)
    (load,) = rec.ran("load")
    assert load[2] == {
        "0": {"report": 456},
        "1": {"0": {"path": "/x.csv"}, "1": {"path": "/x.pdf"}, "2": {"path": "/x.xlsx"}},
    }


async def test_chain_inside_a_group_and_a_batch(client: ojs.Client, q: str) -> None:
    rec = Recorder(client, q)
    rec.handle("first", lambda n: n)
    rec.handle("second", lambda n: n + 100)
    rec.handle("report")
    async with running(rec.worker, client):
        await client.batch(
            [ojs.chain(ojs.step("first", [i], queue=q), ojs.step("second", [i], queue=q)) for i in range(3)],
            on_complete=ojs.step("report", queue=q),
        )
        await rec.wait_completed("report")
    assert len(rec.ran("second")) == 3
    assert {tuple(sorted(c[2].items())) for c in rec.ran("second")} == {(("0", i),) for i in range(3)}
    # A chain's result is its last step's.
    assert rec.ran("report")[0][2] == {str(i): i + 100 for i in range(3)}


async def test_a_failed_group_stops_its_chain(client: ojs.Client, q: str) -> None:
    rec = Recorder(client, q)
    rec.handle("ok")
    rec.handle("bad", fail)
    rec.handle("after")
    async with running(rec.worker, client):
        await client.chain(
            ojs.group(ojs.step("ok", queue=q), ojs.step("bad", queue=q, retry=NO_RETRY)),
            ojs.step("after", queue=q),
        )
        await rec.outcomes.wait_for(lambda o: o.type == "bad" and o.outcome == "dead_lettered")
        await rec.wait_completed("ok")
        await client.push("ok", queue=q)  # a marker: the successor would have come before it
        await rec.wait_completed("ok", 2)
    assert rec.ran("after") == []


async def test_a_batch_step_advances_its_chain_after_its_callbacks(client: ojs.Client, q: str) -> None:
    rec = Recorder(client, q)
    rec.handle("work", lambda i: i)
    rec.handle("cb", lambda: "cb done")
    rec.handle("next")
    async with running(rec.worker, client):
        await client.chain(
            ojs.batch(
                [ojs.step("work", [i], queue=q) for i in range(3)], on_complete=ojs.step("cb", queue=q)
            ),
            ojs.step("next", queue=q),
        )
        await rec.wait_completed("next")
    assert rec.calls[-1][0] == "next"
    assert rec.ran("cb")[0][2] == {"0": 0, "1": 1, "2": 2}


async def test_retried_jobs_count_once(client: ojs.Client, q: str) -> None:
    """A job that fails and then succeeds on retry is one success for the fan-in."""
    rec = Recorder(client, q)
    attempts: list[int] = []

    async def flaky(ctx: ojs.JobContext) -> str:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            raise ojs.Retry("once more", delay=0.01)
        return "ok"

    rec.worker.register("flaky", flaky)
    rec.handle("yay")
    async with running(rec.worker, client):
        await client.batch([ojs.step("flaky", queue=q)], on_success=ojs.step("yay", queue=q))
        await rec.wait_completed("yay")
    assert attempts == [1, 2]
    assert rec.ran("yay")[0][2] == {"0": "ok"}


def test_envelope_round_trips_as_json() -> None:
    wf = ojs.chain(
        ojs.step(
            "order.validate", [{"order_id": "o1"}], queue="orders", retry=ojs.RetryPolicy(max_attempts=5)
        ),
        ojs.group(ojs.step("export.csv"), ojs.step("export.pdf"), name="exports"),
        ojs.batch([ojs.step("email.send", ["a@example.com"])], on_failure=ojs.step("alert")),
        name="pipeline",
    )
    data = wf.to_dict()
    assert data["type"] == "chain" and data["name"] == "pipeline" and data["id"] == wf.id
    assert data["steps"][0] == {
        "type": "order.validate",
        "args": [{"order_id": "o1"}],
        "options": {"queue": "orders", "retry": {"max_attempts": 5}},
    }
    assert data["steps"][2]["callbacks"] == {
        "on_failure": {"type": "alert", "args": [], "options": {"queue": "default"}}
    }
    assert ojs.workflow_from_dict(data) == wf


def test_misuse_is_refused() -> None:
    with pytest.raises(ojs.ArgumentTypeError):
        ojs.chain()
    with pytest.raises(ojs.ArgumentTypeError):
        ojs.batch([ojs.step("a")])
    with pytest.raises(ojs.ArgumentTypeError):
        ojs.group("a")  # type: ignore[arg-type]
    with pytest.raises(ojs.ArgumentTypeError):
        ojs.workflow_from_dict({"type": "a", "args": []})


async def test_three_levels_chain_group_chain(client: ojs.Client, q: str) -> None:
    """§10.2: a chain holding a group of chains (three levels)."""
    rec = Recorder(client, q)
    rec.handle("start", lambda: "s")
    rec.handle("inner", lambda i: i)
    rec.handle("inner2", lambda i: i * 2)
    rec.handle("end")
    async with running(rec.worker, client):
        await client.chain(
            ojs.step("start", queue=q),
            ojs.group(
                *(
                    ojs.chain(ojs.step("inner", [i], queue=q), ojs.step("inner2", [i], queue=q))
                    for i in range(3)
                )
            ),
            ojs.step("end", queue=q),
        )
        await rec.wait_completed("end")
    assert rec.ran("end")[0][2] == {"0": "s", "1": {"0": 0, "1": 2, "2": 4}}
    # A nested chain's first step sees what its group inherited; its next step its own results.
    assert all(c[2] == {"0": "s"} for c in rec.ran("inner"))
    assert sorted(c[2]["0"] for c in rec.ran("inner2")) == [0, 1, 2]


async def test_a_nested_batch_with_no_triggered_callback_moves_its_chain_on(
    client: ojs.Client, q: str
) -> None:
    rec = Recorder(client, q)
    rec.handle("work", lambda: 1)
    rec.handle("alert")
    rec.handle("next")
    async with running(rec.worker, client):
        await client.chain(
            ojs.batch([ojs.step("work", queue=q)] * 2, on_failure=ojs.step("alert", queue=q)),
            ojs.step("next", queue=q),
        )
        await rec.wait_completed("next")
    assert rec.ran("alert") == []
    assert rec.ran("next")[0][2] == {"0": {"0": 1, "1": 1}}


async def test_fan_in_queues_are_declared_as_documented(client: ojs.Client, q: str) -> None:
    """docs/conformance.md: durable, x-expires 7 days; tokens x-max-length N, records 4N+64
    (reject-publish); the lock one message (free), no length bound (it is replaced inside a
    transaction)."""
    handle = await client.group(ojs.step("a", queue=q), ojs.step("b", queue=q))
    base = f"ojs.workflow.{handle.id}.r"
    facts = await queue_facts(f"{base}.tokens", f"{base}.results", f"{base}.lock")
    week = 7 * 86_400_000
    bounded = {"x-expires": week, "x-overflow": "reject-publish"}
    expected = [
        (f"{base}.tokens", {**bounded, "x-max-length": 2}, 2),
        (f"{base}.results", {**bounded, "x-max-length": 72}, 0),
        (f"{base}.lock", {"x-expires": week}, 1),
    ]
    for name, arguments, ready in expected:
        assert facts[name]["durable"] is True
        assert facts[name]["arguments"] == arguments
        assert facts[name]["messages_ready"] == ready
    assert len(handle.job_ids) == 2


async def test_a_job_that_times_out_for_good_counts_as_failed(client: ojs.Client, q: str) -> None:
    """A handler timeout on the last attempt is a failure of the fan-in (the middleware sees
    the cancellation of the job's own scope, not an exception)."""
    rec = Recorder(client, q)
    rec.handle("ok", lambda: 1)
    rec.handle("alert")

    async def hangs(ctx: ojs.JobContext) -> None:
        await anyio.Event().wait()

    rec.worker.register("hangs", hangs)
    async with running(rec.worker, client):
        await client.batch(
            [ojs.step("ok", queue=q), ojs.step("hangs", queue=q, timeout=1, retry=NO_RETRY)],
            on_failure=ojs.step("alert", queue=q),
        )
        await rec.wait_completed("alert")
        await rec.outcomes.wait_for(lambda o: o.type == "hangs" and o.error_code == "HANDLER_TIMEOUT")
    assert rec.ran("alert")[0][2] == {"0": 1, "1": None}


async def test_inspection_from_another_client(client: ojs.Client, q: str, broker_url: str) -> None:
    """client.workflow(id): state, per-job states and counters (§8, §3.3, §9.6), from a
    client that did not start the workflow."""
    rec = Recorder(client, q)
    rec.handle("a", lambda: 1)
    rec.handle("bad", fail)
    rec.handle("c")
    handle = await client.chain(
        ojs.step("a", queue=q),
        ojs.group(ojs.step("a", queue=q), ojs.step("bad", queue=q, retry=NO_RETRY)),
        ojs.step("c", queue=q),
    )
    async with ojs.connect(broker_url) as other:
        before = await other.workflow(handle.id)
        assert (before.type, before.state, before.job_count) == ("chain", "pending", 4)
        assert before.jobs == {"r.0": "pending", "r.1.0": "waiting", "r.1.1": "waiting", "r.2": "waiting"}
        async with running(rec.worker, client):
            await rec.outcomes.wait_for(lambda o: o.type == "bad" and o.outcome == "dead_lettered")
            await rec.wait_completed("a", 2)
        after = await other.workflow(handle.id)
        with pytest.raises(ojs.amqp.NotFound):
            await other.workflow(ojs.step("x").type + "-no-such-workflow")
    assert after.state == "failed"
    assert (after.completed_count, after.failed_count) == (2, 1)
    assert after.jobs == {"r.0": "completed", "r.1.0": "completed", "r.1.1": "failed", "r.2": "cancelled"}
    assert [e["code"] for e in after.errors] == ["HANDLER_ERROR"]
    assert after.envelope == handle.envelope


async def test_inspection_of_a_completed_batch(client: ojs.Client, q: str) -> None:
    rec = Recorder(client, q)
    rec.handle("w", lambda: 1)
    rec.handle("done")
    async with running(rec.worker, client):
        handle = await client.batch(
            [ojs.step("w", queue=q)] * 3,
            on_complete=ojs.step("done", queue=q),
            on_failure=ojs.step("done", queue=q),
        )
        await rec.wait_completed("done")
        state = await client.workflow(handle.id)
    assert state.state == "completed"
    assert (state.job_count, state.completed_count, state.failed_count) == (5, 4, 0)
    assert state.jobs["r.on_failure"] == "cancelled"


async def test_cancel_stops_a_chain_and_its_running_job(client: ojs.Client, q: str) -> None:
    """§11.3: the running step gets CANCEL; the workflow pushes nothing more; inspection
    says cancelled."""
    rec = Recorder(client, q, concurrency=1)
    started = anyio.Event()

    async def blocks(ctx: ojs.JobContext) -> None:
        started.set()
        await anyio.Event().wait()

    rec.worker.register("blocks", blocks)
    rec.handle("next")
    rec.handle("marker")
    async with running(rec.worker, client):
        handle = await client.chain(ojs.step("blocks", queue=q), ojs.step("next", queue=q))
        with anyio.fail_after(15):
            await started.wait()
        sent = await client.cancel_workflow(handle.id)
        await rec.outcomes.wait_for(lambda o: o.type == "blocks" and o.outcome == "cancelled")
        await client.push("marker", queue=q)  # one at a time: a successor would come first
        await rec.wait_completed("marker")
        state = await client.workflow(handle.id)
    assert rec.ran("next") == []
    assert len(sent) == 2
    assert state.state == "cancelled"
    assert state.jobs == {"r.0": "cancelled", "r.1": "cancelled"}


async def test_a_job_finishing_after_cancel_pushes_no_successor(client: ojs.Client, q: str) -> None:
    """A handler that cannot be interrupted (a plain def, in a thread) finishes after the
    cancel: its successor is not pushed (the middleware checks the workflow's cancel mark)."""
    rec = Recorder(client, q, concurrency=1)
    release = threading.Event()
    started = threading.Event()

    def uninterruptible(ctx: ojs.JobContext) -> int:
        started.set()
        release.wait(15)
        return 1

    rec.worker.register("sync", uninterruptible)
    rec.handle("next")
    rec.handle("marker")
    async with running(rec.worker, client):
        handle = await client.chain(ojs.step("sync", queue=q), ojs.step("next", queue=q))
        assert await anyio.to_thread.run_sync(started.wait, 15)
        await client.cancel_workflow(handle.id)
        release.set()
        await rec.outcomes.wait_for(lambda o: o.type == "sync" and o.outcome in ("completed", "cancelled"))
        await client.push("marker", queue=q)
        await rec.wait_completed("marker")
    assert rec.ran("next") == []


async def test_a_cancelled_job_fails_its_group(client: ojs.Client, q: str) -> None:
    """A CANCEL of one running job of a batch (not of the workflow): the job ends
    cancelled, its batch counts it as failed and fires on_failure; inspection says cancelled."""
    rec = Recorder(client, q)
    rec.handle("ok", lambda: 1)
    rec.handle("alert")
    started = anyio.Event()

    async def blocks(ctx: ojs.JobContext) -> None:
        started.set()
        await anyio.Event().wait()

    rec.worker.register("blocks", blocks)
    async with running(rec.worker, client):
        handle = await client.batch(
            [ojs.step("ok", queue=q), ojs.step("blocks", queue=q)], on_failure=ojs.step("alert", queue=q)
        )
        with anyio.fail_after(15):
            await started.wait()
        await client.cancel(handle.job_ids[1], queue=q)
        await rec.wait_completed("alert")
        state = await client.workflow(handle.id)
    assert rec.ran("alert")[0][2] == {"0": 1, "1": None}
    assert state.jobs["r.1"] == "cancelled" and state.state == "completed"


async def test_a_job_cancelled_before_it_starts_settles_its_batch(client: ojs.Client, q: str) -> None:
    """A CANCEL of one job of a batch that reaches the worker before the job does: the worker
    skips it, and the batch still settles, counting it as cancelled (a failure): on_failure
    and on_complete fire once, with None as its result; inspection says cancelled."""
    rec = Recorder(client, q, concurrency=1)
    rec.handle("skipped")
    rec.handle("alert")
    rec.handle("report")
    cancel_seen = anyio.Event()

    async def hold(ctx: ojs.JobContext) -> int:
        await cancel_seen.wait()
        return 1

    rec.worker.register("hold", hold)
    async with running(rec.worker, client):
        handle = await client.batch(
            [ojs.step("hold", queue=q), ojs.step("skipped", queue=q)],
            on_failure=ojs.step("alert", queue=q),
            on_complete=ojs.step("report", queue=q),
        )
        await client.cancel(handle.job_ids[1], queue=q)
        await wait_until(lambda: rec.worker.control.was_cancelled(handle.job_ids[1]), 15)
        cancel_seen.set()
        await rec.wait_completed("alert")
        await rec.wait_completed("report")
        await rec.outcomes.wait_for(lambda o: o.type == "skipped" and o.outcome == "cancelled")
        state = await client.workflow(handle.id)
    assert rec.ran("skipped") == []
    assert rec.ran("alert")[0][2] == {"0": 1, "1": None}
    assert len(rec.ran("alert")) == len(rec.ran("report")) == 1
    assert state.jobs["r.1"] == "cancelled"
    assert state.state == "completed"  # a batch whose callbacks ran is done (§8.3)


async def test_a_job_cancelled_before_it_starts_fails_its_group_and_chain(client: ojs.Client, q: str) -> None:
    """The same in a group that is a chain's first step: the group fails, the chain stops
    (its next step is never pushed) and the workflow settles as failed."""
    rec = Recorder(client, q, concurrency=1)
    rec.handle("skipped")
    rec.handle("next")
    rec.handle("marker")
    cancel_seen = anyio.Event()

    async def hold(ctx: ojs.JobContext) -> int:
        await cancel_seen.wait()
        return 1

    rec.worker.register("hold", hold)
    async with running(rec.worker, client):
        handle = await client.chain(
            ojs.group(ojs.step("hold", queue=q), ojs.step("skipped", queue=q)), ojs.step("next", queue=q)
        )
        await client.cancel(handle.job_ids[1], queue=q)
        await wait_until(lambda: rec.worker.control.was_cancelled(handle.job_ids[1]), 15)
        cancel_seen.set()
        await rec.outcomes.wait_for(lambda o: o.type == "skipped" and o.outcome == "cancelled")
        await rec.wait_completed("hold")
        # Both outcomes are reported after their acks, and each job moved the workflow on
        # before its ack (the skipped one in on_skipped): the group has settled.
        state = await client.workflow(handle.id)
        await client.push("marker", queue=q)  # one at a time: a successor would come first
        await rec.wait_completed("marker")
    assert rec.ran("next") == []
    assert state.state == "failed"
    assert state.jobs == {"r.0.0": "completed", "r.0.1": "cancelled", "r.1": "cancelled"}


async def test_workflow_queues_are_quorum_queues_when_the_job_queues_are(
    broker_url: str, q: str, cleanup: Cleanup
) -> None:
    """A client with QueueOptions.quorum(): the workflow's own queues (fan-in tokens, records
    and lock, chain permits, journal, cancel mark) are quorum queues, still with x-expires;
    the workflow runs to its end on them."""
    async with ojs.connect(broker_url, queue_options=ojs.QueueOptions.quorum()) as quorum_client:
        rec = Recorder(quorum_client, q)
        rec.handle("a", lambda: 1)
        rec.handle("b", lambda: 2)
        rec.handle("c")
        async with running(rec.worker, quorum_client):
            handle = await quorum_client.chain(
                ojs.group(ojs.step("a", queue=q), ojs.step("b", queue=q)), ojs.step("c", queue=q)
            )
            for name in workflow_queues("", handle.envelope):
                cleanup.queue(name)
            await rec.wait_completed("c")
            state = await quorum_client.workflow(handle.id)
    assert rec.ran("c")[0][2] == {"0": {"0": 1, "1": 2}}
    assert state.state == "completed"
    base = f"ojs.workflow.{handle.id}"
    names = [f"{base}.r.0.tokens", f"{base}.r.0.results", f"{base}.r.0.lock", f"{base}.r.1.permit"]
    names += [f"{base}.journal", f"{base}.cancelled"]
    facts = await queue_facts(*names)
    assert sorted(facts) == sorted(names)
    for name in names:
        assert facts[name]["type"] == "quorum", name
        assert facts[name]["arguments"]["x-queue-type"] == "quorum"
        assert facts[name]["arguments"]["x-expires"] == 7 * 86_400_000
