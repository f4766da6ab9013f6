"""The event bus on the handler pipeline it shares with the job layer (issue 25).

* a plain ``def`` handler runs in a worker thread, once per attempt;
* a handler annotated with a dataclass, a TypedDict or a pydantic model receives that type,
  and an event that does not fit is dead-lettered with a reason naming the field;
* failed attempts are logged at WARNING and dead letters at ERROR, both with the traceback
  and the event's extras (the job layer's levels);
* each subscription counts its events (OpenTelemetry, per subscription queue);
* what cannot be a handler is refused at ``subscribe()``.

RabbitMQ and memory://, asyncio and Trio.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterator
from typing import Any, TypedDict

import anyio
import anyio.from_thread
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from support.waits import Seen

from ojs_anyio import amqp, events

from .bus_support import WAIT, Names, dead_letter

try:
    import pydantic
except ImportError:  # the optional extra is absent: its test is skipped, the others run
    pydantic = None  # type: ignore[assignment]

pytestmark = pytest.mark.anyio

FAST = events.RedeliveryPolicy(initial_interval=0.05, multiplier=2.0, max_interval=0.2, max_attempts=2)


@dataclasses.dataclass
class OrderDC:
    id: int
    sku: str


class OrderTD(TypedDict):
    id: int
    sku: str


if pydantic is not None:

    class OrderPM(pydantic.BaseModel):
        id: int
        sku: str


@pytest.fixture
def caplog_events(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.INFO, logger="ojs_anyio.events"):
        yield caplog



async def test_a_sync_handler_runs_in_a_thread_once_per_attempt(names: Names) -> None:
    loop_thread = threading.get_ident()
    calls: list[tuple[int, int]] = []  # (attempt, thread)
    done = anyio.Event()

    def flaky(payload: dict[str, Any], ctx: events.EventContext) -> None:
        calls.append((ctx.attempt, threading.get_ident()))
        if ctx.attempt < 3:
            raise RuntimeError(f"attempt {ctx.attempt} fails")
        anyio.from_thread.run_sync(done.set)

    outcomes = Seen()
    async with (
        events.connect(names.url, **names.bus_options()) as bus,
        bus.subscribe(names.sub("sync"), flaky, redelivery=FAST) as sub,
    ):
        sub.add_listener(lambda outcome, _msg: outcomes.add(outcome))
        await bus.publish("sync", {"n": 1})
        with anyio.fail_after(WAIT):
            await done.wait()
        await outcomes.wait(3)
    assert [attempt for attempt, _ in calls] == [1, 2, 3]  # once per attempt, never more
    assert all(thread != loop_thread for _, thread in calls)
    assert outcomes.items == ["redelivered", "redelivered", "handled"]
    assert (sub.handled, sub.redelivered, sub.dead_lettered) == (1, 2, 0)


async def test_a_sync_handler_that_always_fails_is_dead_lettered_after_its_attempts(names: Names) -> None:
    calls: list[int] = []

    def broken(payload: dict[str, Any], ctx: events.EventContext) -> None:
        calls.append(ctx.attempt)
        raise RuntimeError("no")

    outcomes = Seen()
    async with (
        events.connect(names.url, **names.bus_options()) as bus,
        bus.subscribe(names.sub("broken"), broken, redelivery=FAST) as sub,
    ):
        sub.add_listener(lambda outcome, _msg: outcomes.add(outcome))
        await bus.publish("broken", {"n": 1})
        await outcomes.wait(3)
        dead = await dead_letter(names, sub)
    assert calls == [1, 2, 3]  # the first attempt and max_attempts=2 redeliveries
    assert outcomes.items == ["redelivered", "redelivered", "dead_lettered"]
    headers = dead.properties.headers or {}
    assert headers[events.H_REASON] == "max_attempts"
    assert "RuntimeError: no" in headers[events.H_ERROR]


@pytest.mark.parametrize("kind", ["dataclass", "TypedDict", "pydantic"])
async def test_typed_payloads_are_converted_or_dead_lettered_naming_the_field(
    names: Names, kind: str
) -> None:
    if kind == "pydantic":
        pytest.importorskip("pydantic")
    seen = Seen()

    async def on_dc(order: OrderDC) -> None:
        seen.add(order)

    async def on_td(order: OrderTD) -> None:
        seen.add(order)

    async def on_pm(order: OrderPM) -> None:
        seen.add(order)

    handler: events.Handler = {"dataclass": on_dc, "TypedDict": on_td, "pydantic": on_pm}[kind]
    outcomes = Seen()
    async with (
        events.connect(names.url, **names.bus_options()) as bus,
        bus.subscribe(names.sub("orders"), handler) as sub,
    ):
        sub.add_listener(lambda outcome, _msg: outcomes.add(outcome))
        await bus.publish("orders", {"id": "not a number", "sku": "A-1"})
        await bus.publish("orders", {"id": 7, "sku": "A-1"})
        await outcomes.wait(2)
        dead = await dead_letter(names, sub)
    [order] = seen.items
    if kind == "dataclass":
        assert order == OrderDC(id=7, sku="A-1")
    elif kind == "TypedDict":
        assert order == {"id": 7, "sku": "A-1"}
    else:
        assert isinstance(order, OrderPM) and (order.id, order.sku) == (7, "A-1")
    assert sorted(outcomes.items) == ["dead_lettered", "handled"]
    headers = dead.properties.headers or {}
    assert headers[events.H_REASON] == "invalid_payload"
    assert "id" in headers[events.H_ERROR], headers[events.H_ERROR]  # the field is named
    assert (sub.handled, sub.dead_lettered) == (1, 1)


async def test_failures_are_logged_with_tracebacks_at_the_job_layers_levels(
    names: Names, caplog_events: pytest.LogCaptureFixture
) -> None:
    async def broken(payload: dict[str, Any]) -> None:
        raise LookupError("no such record")

    outcomes = Seen()
    policy = events.RedeliveryPolicy(initial_interval=0.05, max_interval=0.05, max_attempts=1)
    async with (
        events.connect(names.url, **names.bus_options()) as bus,
        bus.subscribe(names.sub("logged"), broken, redelivery=policy) as sub,
    ):
        sub.add_listener(lambda outcome, _msg: outcomes.add(outcome))
        event_id = await bus.publish("logged", {"n": 1})
        await outcomes.wait(2)
    records = [r for r in caplog_events.records if getattr(r, "event_id", None) == event_id]
    [failed] = [r for r in records if r.levelno == logging.WARNING]
    [dead] = [r for r in records if r.levelno == logging.ERROR]
    for record, attempt in ((failed, 1), (dead, 2)):
        assert record.exc_info is not None and isinstance(record.exc_info[1], LookupError)
        assert "no such record" in caplog_events.text
        assert (record.queue, record.routing_key, record.attempt) == (sub.queue, "logged", attempt)  # type: ignore[attr-defined]
    assert dead.reason == "max_attempts"  # type: ignore[attr-defined]
    assert "Traceback" in caplog_events.text


async def test_each_subscription_counts_its_events(names: Names) -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])

    async def picky(payload: dict[str, Any]) -> None:
        if payload["n"] == 2:
            raise events.DeadLetter("two is not allowed")

    outcomes = Seen()
    async with (
        events.connect(names.url, meter_provider=provider, **names.bus_options()) as bus,
        bus.subscribe(names.sub("counted"), picky) as sub,
    ):
        sub.add_listener(lambda outcome, _msg: outcomes.add(outcome))
        for n in (1, 2, 3):
            await bus.publish("counted", {"n": n})
        await outcomes.wait(3)
    points: dict[tuple[str, tuple[tuple[str, Any], ...]], Any] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for p in metric.data.data_points:
                    attrs = tuple(sorted((p.attributes or {}).items()))
                    points[(metric.name, attrs)] = getattr(p, "value", None) or getattr(p, "count", 0)
    base = (("messaging.destination.name", sub.queue), ("messaging.system", "rabbitmq"))
    assert points[("ojs_events_handled_total", base)] == 2
    failed = tuple(sorted((*base, ("error.type", "DeadLetter"))))
    assert points[("ojs_events_failed_total", failed)] == 1
    dead = tuple(sorted((*base, ("ojs.event.reason", "rejected"))))
    assert points[("ojs_events_dead_lettered_total", dead)] == 1
    process = tuple(sorted((*base, ("messaging.operation.name", "process"))))
    assert points[("messaging.process.duration", process)] == 2
    process_failed = tuple(sorted((*process, ("error.type", "DeadLetter"))))
    assert points[("messaging.process.duration", process_failed)] == 1


class _NotAHandler:
    pass


def _generator(payload: Any) -> Iterator[None]:
    yield None


@pytest.mark.parametrize("handler", [_NotAHandler, _generator, 42])
async def test_what_cannot_be_a_handler_is_refused_at_subscribe(names: Names, handler: Any) -> None:
    async with events.connect(names.url, **names.bus_options()) as bus:
        with pytest.raises(TypeError) as refused:  # ArgumentTypeError: a UsageError and a TypeError
            async with bus.subscribe(names.sub("refused"), handler):
                pass
    assert isinstance(refused.value, amqp.UsageError)
