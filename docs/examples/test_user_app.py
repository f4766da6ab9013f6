"""An example of testing an app's jobs with ``ojs_anyio.testing`` (docs/testing.md walks
through it; CI runs it).  No RabbitMQ: a private memory:// broker with a virtual clock.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import anyio
import pytest

import ojs_anyio as ojs
from ojs_anyio import testing
from ojs_anyio.testing import JobTester, job_tester

# The fixtures job_tester / ojs_client / memory_broker (put this line in your conftest.py).
pytest_plugins = ["ojs_anyio.testing.pytest_plugin"]
pytestmark = pytest.mark.anyio

# ---------------------------------------------------------------- the "app" under test

sent: list[str] = []
attempts: dict[str, int] = {}


async def send_email(ctx: ojs.JobContext, to: str) -> None:
    attempts[to] = attempts.get(to, 0) + 1
    if to.startswith("flaky") and attempts[to] < 4:
        raise ConnectionError("SMTP server busy")  # retried with backoff
    sent.append(to)


def build_worker() -> ojs.Worker:
    """The app's worker (a module-level Worker works too: it runs on any event loop)."""
    worker = ojs.Worker(queues=["email"], concurrency=4)
    worker.register("email.send", send_email)
    return worker


async def sign_up(client: ojs.Client, address: str) -> None:
    await client.push("email.send", [address], queue="email", retry=ojs.RetryPolicy(max_attempts=5))


async def remind_tomorrow(client: ojs.Client, address: str) -> None:
    await client.push("email.send", [address], queue="email", delay=timedelta(days=1))


# ---------------------------------------------------------------- the tests


@pytest.fixture(autouse=True)
def _reset() -> None:
    sent.clear()
    attempts.clear()


@pytest.fixture
def worker() -> ojs.Worker:
    return build_worker()


@pytest.fixture
def ojs_worker(worker: ojs.Worker) -> ojs.Worker:
    """The worker the plugin's job_tester fixture drains."""
    return worker


async def test_sign_up_enqueues_then_sends_the_welcome_email(worker: ojs.Worker) -> None:
    async with job_tester(worker=worker) as jobs:  # or the job_tester fixture
        await sign_up(jobs.client, "ada@example.com")
        jobs.assert_enqueued(queue="email", type="email.send", args=["ada@example.com"])
        outcomes = await jobs.drain()
        assert [o.outcome for o in outcomes] == ["completed"]
        jobs.assert_performed(type="email.send", count=1)
        jobs.refute_enqueued(queue="email")
        assert sent == ["ada@example.com"]


async def test_a_flaky_job_is_retried_until_it_succeeds_in_virtual_time(worker: ojs.Worker) -> None:
    async with job_tester(worker=worker) as jobs:
        await sign_up(jobs.client, "flaky@example.com")
        start = jobs.broker.clock.now()
        outcomes = await jobs.drain()
        assert [o.outcome for o in outcomes] == ["retried", "retried", "retried", "completed"]
        assert sent == ["flaky@example.com"]
        # The backoff waits happened on the broker's virtual clock, not in real time.
        assert jobs.broker.clock.now() - start >= sum((o.delay_ms or 0) for o in outcomes) / 1000 * 0.5


async def test_a_reminder_a_day_ahead_runs_only_when_the_day_has_passed(worker: ojs.Worker) -> None:
    async with job_tester(worker=worker) as jobs:
        await remind_tomorrow(jobs.client, "bob@example.com")
        jobs.refute_enqueued(queue="email")  # waiting in the delay levels, not ready
        assert [j.args for j in jobs.scheduled(queue="email")] == [["bob@example.com"]]
        await jobs.advance(timedelta(hours=23).total_seconds())
        jobs.refute_enqueued(queue="email")
        await jobs.advance(timedelta(hours=1, seconds=1).total_seconds())
        jobs.assert_enqueued(queue="email", type="email.send", args=["bob@example.com"])
        await jobs.drain()
        assert sent == ["bob@example.com"]


async def test_with_the_fixtures_and_the_module_level_helpers(ojs_client: ojs.Client) -> None:
    await sign_up(ojs_client, "kim@example.com")
    testing.assert_enqueued(queue="email", type="email.send", args=["kim@example.com"], count=1)
    outcomes = await testing.drain()
    assert [(o.type, o.outcome) for o in outcomes] == [("email.send", "completed")]
    testing.assert_performed(type="email.send", count=1)
    await testing.advance(3600)  # nothing was waiting: time just moves
    assert sent == ["kim@example.com"]


async def test_a_cron_schedule_fires_on_the_virtual_clock(worker: ojs.Worker) -> None:
    async with job_tester(worker=worker) as jobs, anyio.create_task_group() as tg:
        digest = ojs.Scheduler("digest", clock=jobs.scheduler_clock)
        digest.add("email.send", "*/10 * * * *", args=["digest@example.com"], queue="email", name="digest")
        tg.start_soon(digest.run, jobs.client)
        await jobs.advance(3600)  # one virtual hour: six ten-minute ticks
        jobs.assert_enqueued(queue="email", type="email.send", args=["digest@example.com"], count=6)
        tg.cancel_scope.cancel()


async def test_inline_mode_runs_the_handler_at_push(job_tester_inline: JobTester) -> None:
    outcome = await job_tester_inline.push("email.send", ["eve@example.com"], queue="email")
    assert isinstance(outcome, ojs.JobOutcome) and outcome.outcome == "completed"
    assert sent == ["eve@example.com"]


@pytest.fixture
async def job_tester_inline(worker: ojs.Worker) -> AsyncIterator[JobTester]:
    async with job_tester(worker=worker, inline=True) as jobs:
        yield jobs
