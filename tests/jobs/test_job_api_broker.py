"""Results, middleware and per-job-type metrics through a real worker (RabbitMQ and memory://,
asyncio and Trio)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import anyio
import msgspec
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import ojs_anyio as ojs
from ojs_anyio.jobs._results import JobFailedError

from .broker_support import WAIT, Outcomes, current_url, running

pytestmark = pytest.mark.anyio


class Report(msgspec.Struct):
    day: str
    rows: int
    made_at: datetime


async def test_results_success_failure_and_timeout(client: ojs.Client, q: str) -> None:
    worker = ojs.Worker(queues=[q], concurrency=4, retry=ojs.RetryPolicy(max_attempts=1))
    release = anyio.Event()

    @worker.job("report.build")
    async def build(ctx: ojs.JobContext, day: str) -> Report:
        return Report(day=day, rows=42, made_at=datetime(2026, 11, 23, tzinfo=UTC))

    @worker.job("report.fail")
    async def fail(ctx: ojs.JobContext) -> None:
        raise ValueError("no data for that day")

    @worker.job("report.slow")
    async def slow(ctx: ojs.JobContext) -> int:
        await release.wait()
        return 7

    async with running(worker, client):
        with anyio.fail_after(WAIT):
            ok = await build.push_for_result(client, "2026-11-22")
            report = await ok.result(timeout=WAIT)
            # typed by the handler's annotation: a Struct with a datetime, not a dict
            assert report == Report(day="2026-11-22", rows=42, made_at=datetime(2026, 11, 23, tzinfo=UTC))
            bad = await fail.push_for_result(client)
            with pytest.raises(JobFailedError) as info:
                await bad.result(timeout=WAIT)
            assert info.value.code == "HANDLER_ERROR" and "no data for that day" in str(info.value)
            pending = await slow.push_for_result(client)
            with pytest.raises(TimeoutError):
                await pending.result(timeout=0.05)
            assert not pending.done()
            release.set()
            assert await pending.result(timeout=WAIT) == 7  # awaited again after a timeout
            untyped = await client.push_for_result("report.build", ["2026-11-21"], queue=q)
            assert (await untyped.result(timeout=WAIT))["rows"] == 42  # plain JSON without a handle
            info_answer = await client.info(ok.id, queue=q, timeout=WAIT)
            assert info_answer.state == "completed"


async def test_a_vanished_pusher_blocks_nothing(client: ojs.Client, q: str) -> None:
    """The pusher closes its connection (its result queue goes with it) before the job runs:
    the worker's reply is dropped by the broker and the worker carries on."""
    worker = ojs.Worker(queues=[q], concurrency=1)
    outcomes = Outcomes(worker)

    @worker.job("echo")
    async def echo(ctx: ojs.JobContext, n: int) -> int:
        return n

    async with ojs.connect(current_url()) as gone:
        orphan = await echo.push_for_result(gone, 1)
    async with running(worker, client):
        with anyio.fail_after(WAIT):
            await outcomes.wait_final(orphan.id)
            after = await echo.push_for_result(client, 2)
            assert await after.result(timeout=WAIT) == 2
    assert [o.outcome for o in outcomes.of(orphan.id)] == ["completed"]


class Trace(ojs.Middleware):
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    async def around_push(self, job: ojs.Job, call_next: Any) -> ojs.Job:
        self.log.append(f"{self.name}>push")
        meta = {**(job.meta or {}), "via": [*((job.meta or {}).get("via", [])), self.name]}
        return await call_next(msgspec.structs.replace(job, meta=meta))

    async def around_handler(self, ctx: ojs.JobContext, call_next: Any) -> Any:
        self.log.append(f"{self.name}>{ctx.job.type}")
        try:
            return await call_next()
        finally:
            self.log.append(f"{self.name}<{ctx.job.type}")

    def on_outcome(self, outcome: ojs.JobOutcome) -> None:
        self.log.append(f"{self.name}:{outcome.outcome}")


class RefuseSpam(ojs.Middleware):
    async def around_handler(self, ctx: ojs.JobContext, call_next: Any) -> Any:
        if ctx.args and ctx.args[0] == "spam":
            raise ojs.Discard("refused by middleware")
        return await call_next()


class Broken(ojs.Middleware):
    def on_outcome(self, outcome: ojs.JobOutcome) -> None:
        raise RuntimeError("a buggy hook")


async def test_middleware_order_changes_and_exceptions(q: str) -> None:
    log: list[str] = []
    worker = ojs.Worker(
        queues=[q], concurrency=1, middleware=[Trace("w1", log), Trace("w2", log), RefuseSpam(), Broken()]
    )
    outcomes = Outcomes(worker)
    seen: list[list[str]] = []

    @worker.job("mail")
    async def mail(ctx: ojs.JobContext, what: str) -> None:
        seen.append(list((ctx.job.meta or {})["via"]))

    async with (
        ojs.connect(current_url(), middleware=[Trace("p1", log), Trace("p2", log)]) as client,
        running(worker, client),
    ):
        ok = await mail.push(client, "hello")
        spam = await mail.push(client, "spam")
        with anyio.fail_after(WAIT):
            assert (await outcomes.wait_final(ok.id)).outcome == "completed"
            final = await outcomes.wait_final(spam.id)
    assert (final.outcome, final.error_code) == ("dead_lettered", "DISCARDED")
    assert ok.meta == {"via": ["p1", "p2"]} and seen == [["p1", "p2"]]  # the job as changed
    handled = [e for e in log if not e.startswith("p")]
    assert handled[:6] == ["w1>mail", "w2>mail", "w2<mail", "w1<mail", "w1:completed", "w2:completed"]
    assert log[:2] == ["p1>push", "p2>push"]
    assert "w1:dead_lettered" in log  # outcome hooks ran despite Broken raising after them


class PerTypeLimit(ojs.Middleware):
    """The docs/job-api.md example: at most ``limits[type]`` concurrent handlers per type."""

    def __init__(self, limits: dict[str, int]) -> None:
        self._limiters = {t: anyio.CapacityLimiter(n) for t, n in limits.items()}

    async def around_handler(self, ctx: ojs.JobContext, call_next: Any) -> Any:
        limiter = self._limiters.get(ctx.job.type)
        if limiter is None:
            return await call_next()
        async with limiter:
            return await call_next()


async def test_per_type_concurrency_limit_middleware(client: ojs.Client, q: str) -> None:
    worker = ojs.Worker(queues=[q], concurrency=10, middleware=[PerTypeLimit({"report.build": 2})])
    outcomes = Outcomes(worker)
    running_now, peak = 0, 0

    @worker.job("report.build")
    async def build(ctx: ojs.JobContext, n: int) -> None:
        nonlocal running_now, peak
        running_now += 1
        peak = max(peak, running_now)
        await anyio.sleep(0.02)  # the work itself: long enough for others to pile up
        running_now -= 1

    async with running(worker, client):
        jobs = [await build.push(client, n) for n in range(10)]
        with anyio.fail_after(WAIT):
            for job in jobs:
                await outcomes.wait_final(job.id)
    assert peak == 2


async def test_job_metrics_after_a_known_workload(client: ojs.Client, q: str) -> None:
    reader = InMemoryMetricReader()
    metrics = ojs.JobMetrics(MeterProvider(metric_readers=[reader]))
    policy = ojs.RetryPolicy(max_attempts=2, initial_interval=0.05, jitter=False)
    worker = ojs.Worker(queues=[q], middleware=[metrics], retry=policy, unknown_type_grace=0)
    outcomes = Outcomes(worker)
    tries: dict[str, int] = {}

    @worker.job("m.ok")
    async def ok(ctx: ojs.JobContext) -> None:
        pass

    @worker.job("m.flaky")
    async def flaky(ctx: ojs.JobContext) -> None:
        tries[ctx.id] = tries.get(ctx.id, 0) + 1
        if tries[ctx.id] == 1:
            raise RuntimeError("first time fails")

    @worker.job("m.bad")
    async def bad(ctx: ojs.JobContext) -> None:
        raise ojs.Discard("never")

    async with running(worker, client):
        jobs = [await ok.push(client) for _ in range(3)] + [await flaky.push(client), await bad.push(client)]
        await client.push("m.unknown", [], queue=q)
        with anyio.fail_after(WAIT * 2):
            for job in jobs:
                await outcomes.wait_final(job.id)
            await outcomes.wait_for(lambda o: o.type == "m.unknown" and o.outcome == "dead_lettered")
    data = reader.get_metrics_data()
    assert data is not None
    points: dict[tuple[str, str, str | None], float] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for p in metric.data.data_points:
                    attrs = dict(p.attributes or {})
                    assert attrs["messaging.destination.name"] == q
                    key = (metric.name, str(attrs["ojs.job.type"]), attrs.get("error.type"))
                    points[key] = getattr(p, "value", None) or getattr(p, "count", 0)
    assert points[("ojs_jobs_started_total", "m.ok", None)] == 3
    assert points[("ojs_jobs_completed_total", "m.ok", None)] == 3
    assert points[("ojs_jobs_started_total", "m.flaky", None)] == 2
    assert points[("ojs_jobs_retried_total", "m.flaky", None)] == 1
    assert points[("ojs_jobs_completed_total", "m.flaky", None)] == 1
    assert points[("ojs_jobs_failed_total", "m.flaky", "HANDLER_ERROR")] == 1
    assert points[("ojs_jobs_dead_lettered_total", "m.bad", None)] == 1
    assert points[("ojs_jobs_failed_total", "m.bad", "DISCARDED")] == 1
    assert points[("ojs_jobs_dead_lettered_total", "unregistered", None)] == 1  # bounded label
    assert points[("messaging.process.duration", "m.ok", None)] == 3
    assert points[("messaging.process.duration", "m.flaky", "HANDLER_ERROR")] == 1
