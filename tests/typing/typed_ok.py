"""Type-checked by tests/jobs/test_typed_broker.py: every call here must pass mypy --strict
(typed job handles, and the event bus's middleware hooks)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import date
from decimal import Decimal
from typing import Any
from uuid import UUID, uuid4

import msgspec

import ojs_anyio as ojs
from ojs_anyio import events

worker = ojs.Worker(queues=["email"])


@worker.job("email.send")
async def send_email(ctx: ojs.JobContext, to: str, template: str = "welcome", retries: int = 0) -> bool:
    return True


@worker.job("report.build", queue="email")
def build_report(ctx: ojs.JobContext, day: str) -> None:  # a sync handler
    pass


async def main(client: ojs.Client) -> None:
    job: ojs.Job = await send_email.push(client, "a@b.c", template="hello")
    await send_email.options(delay=30, priority=5).push(client, "a@b.c", "hello", 2)
    await build_report.push(client, "2026-11-23")
    print(job.id)


@worker.job("report.day")
async def report_day(ctx: ojs.JobContext, day: date, ref: UUID, amount: Decimal) -> date:
    return day


async def typed_values(client: ojs.Client) -> None:
    await report_day.push(client, date(2026, 11, 25), uuid4(), Decimal("2.50"))
    pending: ojs.PendingResult[date] = await report_day.push_for_result(
        client, date.today(), uuid4(), Decimal(1)
    )
    day: date = await pending.result(timeout=30)
    print(day)


def blocking(client: ojs.SyncClient) -> None:
    job: ojs.Job = send_email.push(client, "a@b.c", template="hello")
    pending: ojs.SyncPendingResult[date] = report_day.push_for_result(
        client, date.today(), uuid4(), Decimal(1)
    )
    day: date = pending.result(timeout=30)
    untyped: ojs.SyncPendingResult[object] = client.push_for_result(
        "report.day", ["2026-11-25"], queue="email"
    )
    print(job.id, day, untyped.id)


async def results_by_id(client: ojs.Client, sync_client: ojs.SyncClient, job_id: str) -> None:
    day: date = await report_day.result(client, job_id, timeout=10)  # any process, typed
    again: date = report_day.result(sync_client, job_id)  # blocking
    print(day, again)


class TenantStamp(events.Middleware):  # event-bus middleware: hooks typed as the base class's
    async def around_publish(
        self,
        event: events.OutgoingEvent,
        call_next: Callable[[events.OutgoingEvent], Awaitable[events.OutgoingEvent]],
    ) -> events.OutgoingEvent:
        return await call_next(msgspec.structs.replace(event, headers={"x-tenant": "acme"}))

    async def around_handler(self, ctx: events.EventContext, call_next: Callable[[], Awaitable[Any]]) -> Any:
        print(ctx.payload, ctx.attempt)
        return await call_next()


async def with_bus(url: str) -> None:
    async def on_read(payload: dict[str, int]) -> int:  # a result: around_handler gets it
        return len(payload)

    async with (
        events.connect(url, middleware=[TenantStamp()]) as bus,
        bus.subscribe("rec.read", on_read, middleware=[TenantStamp()]),
    ):
        await bus.publish("rec.read", {"n": 1})
