"""Middleware chains and the per-job-type metrics, without a broker (the worker and client
wiring is covered in test_job_api_broker.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import ojs_anyio as ojs
from ojs_anyio.jobs._job_metrics import JobMetrics
from ojs_anyio.jobs._middleware import (
    Middleware,
    build_handler_chain,
    build_push_chain,
    check_middleware,
    outcome_hooks,
)


class Recorder(Middleware):
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    async def around_push(self, job: Any, call_next: Any) -> Any:
        self.log.append(f"{self.name}>push")
        out = await call_next(job)
        self.log.append(f"{self.name}<push")
        return out

    async def around_handler(self, ctx: Any, call_next: Any) -> Any:
        self.log.append(f"{self.name}>handler")
        try:
            return await call_next()
        finally:
            self.log.append(f"{self.name}<handler")


class Refuse(Middleware):
    async def around_handler(self, ctx: Any, call_next: Any) -> Any:
        raise ojs.Discard("refused by middleware")


def test_first_middleware_is_outermost_for_push_and_handler() -> None:
    log: list[str] = []
    chain = [Recorder("a", log), Recorder("b", log)]

    async def publish(job: Any) -> Any:
        log.append("publish")
        return job

    async def handler() -> Any:
        log.append("handler")
        return 42

    async def main() -> None:
        assert await build_push_chain(chain, publish)("job") == "job"
        run = build_handler_chain(chain)
        assert run is not None
        assert await run(SimpleNamespace(), handler) == 42

    anyio.run(main)
    assert log == [
        "a>push", "b>push", "publish", "b<push", "a<push",
        "a>handler", "b>handler", "handler", "b<handler", "a<handler",
    ]  # fmt: skip


def test_exceptions_cross_the_chain_and_unused_hooks_cost_nothing() -> None:
    log: list[str] = []

    async def handler() -> Any:
        raise ValueError("boom")

    async def main() -> None:
        run = build_handler_chain([Recorder("a", log)])
        assert run is not None
        with pytest.raises(ValueError, match="boom"):
            await run(SimpleNamespace(), handler)
        refuse = build_handler_chain([Recorder("a", log), Refuse()])
        assert refuse is not None
        with pytest.raises(ojs.Discard):
            await refuse(SimpleNamespace(), handler)

    anyio.run(main)
    assert log == ["a>handler", "a<handler", "a>handler", "a<handler"]
    # a middleware that overrides nothing adds no link at all
    assert build_handler_chain([Middleware()]) is None

    async def publish(job: Any) -> Any:
        return job

    assert build_push_chain([Middleware(), Refuse()], publish) is publish
    assert outcome_hooks([Middleware(), Refuse()]) == ()


def test_middleware_argument_is_checked() -> None:
    with pytest.raises(TypeError, match=r"a list of ojs_anyio\.Middleware"):
        check_middleware(Middleware())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="an instance, not the class"):
        check_middleware([Middleware])  # type: ignore[list-item]
    assert check_middleware(None) == ()


def _points(reader: InMemoryMetricReader) -> dict[tuple[str, tuple[tuple[str, Any], ...]], float]:
    data = reader.get_metrics_data()
    out: dict[tuple[str, tuple[tuple[str, Any], ...]], float] = {}
    assert data is not None
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for p in metric.data.data_points:
                    attrs = tuple(sorted((p.attributes or {}).items()))
                    out[(metric.name, attrs)] = getattr(p, "value", None) or getattr(p, "count", 0)
    return out


def _outcome(kind: str, job_type: str | None = "email.send", code: str | None = None) -> ojs.JobOutcome:
    return ojs.JobOutcome(
        id="j", type=job_type, queue="email", attempt=1, outcome=kind, error_code=code, duration=0.01
    )


def test_job_metrics_count_per_queue_and_type_with_bounded_labels() -> None:
    reader = InMemoryMetricReader()
    m = JobMetrics(MeterProvider(metric_readers=[reader]), max_label_sets=3)
    m.registered = frozenset({"email.send", "a", "b", "c"})
    for kind, code in [("completed", None), ("completed", None), ("retried", "HANDLER_ERROR"),
                       ("dead_lettered", "HANDLER_ERROR"), ("cancelled", None)]:  # fmt: skip
        m.on_outcome(_outcome(kind, code=code))
    m.on_outcome(_outcome("dead_lettered", job_type="nope", code="INVALID_JOB_TYPE"))
    for t in ("a", "b", "c"):  # past max_label_sets: folded into "other"
        m.on_outcome(_outcome("completed", job_type=t))
    points = _points(reader)
    base = (("messaging.destination.name", "email"), ("messaging.system", "rabbitmq"))
    email = (*base, ("ojs.job.type", "email.send"))
    assert points[("ojs_jobs_completed_total", email)] == 2
    assert points[("ojs_jobs_retried_total", email)] == 1
    assert points[("ojs_jobs_dead_lettered_total", email)] == 1
    assert points[("ojs_jobs_cancelled_total", email)] == 1
    failed = tuple(sorted((*email, ("error.type", "HANDLER_ERROR"))))
    assert points[("ojs_jobs_failed_total", failed)] == 2
    assert points[("ojs_jobs_dead_lettered_total", (*base, ("ojs.job.type", "unregistered")))] == 1
    # OpenTelemetry's messaging name; a failed attempt's duration carries its error.type.
    process = tuple(sorted((*email, ("messaging.operation.name", "process"))))
    assert points[("messaging.process.duration", process)] == 3  # histogram count
    process_failed = tuple(sorted((*process, ("error.type", "HANDLER_ERROR"))))
    assert points[("messaging.process.duration", process_failed)] == 2
    types = {dict(attrs).get("ojs.job.type") for (_name, attrs) in points}
    assert types == {"email.send", "unregistered", "a", "other"}
