"""Type-checked by tests/jobs/test_typed_broker.py: every call here must pass mypy --strict."""

from __future__ import annotations

import ojs_anyio as ojs

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
