"""Type-checked by tests/jobs/test_typed_broker.py: each marked line must be a mypy error."""

from __future__ import annotations

from datetime import date
from typing import Any

import ojs_anyio as ojs
from ojs_anyio import events

worker = ojs.Worker(queues=["email"])


@worker.job("email.send")
async def send_email(ctx: ojs.JobContext, to: str, template: str = "welcome") -> None:
    pass


async def main(client: ojs.Client) -> None:
    await send_email.push(client, 42)  # error: wrong type
    await send_email.push(client, "a@b.c", templat="x")  # error: unknown keyword
    await send_email.push(client)  # error: missing argument


def sync(client: ojs.SyncClient) -> None:
    send_email.push(client, date(2026, 11, 25))  # error: wrong type, blocking form
    job: ojs.Job = send_email.push(ojs.Client.__new__(ojs.Client), "a@b.c")  # error: a coroutine, not a Job
    print(job)


async def wrong_result(client: ojs.Client) -> None:
    n: int = await send_email.result(client, "id")  # error: the handler returns None
    print(n)


class BadStamp(events.Middleware):
    async def around_publish(self, event: events.OutgoingEvent, call_next: Any) -> str:  # error: not an event
        return "x"
