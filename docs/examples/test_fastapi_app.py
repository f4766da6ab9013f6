"""Tests of the FastAPI recipe (fastapi_app.py) on memory://, written for any test runner.

No marker and no runner-specific import: the same module runs under anyio's pytest plugin
(``anyio_mode = auto``, or ``@pytest.mark.anyio``) and under pytest-asyncio
(``asyncio_mode = auto``, or ``@pytest.mark.asyncio``).  ``tests/memory/test_pytest_runners.py``
runs it each way.  docs/testing.md, "pytest", explains the choice.
"""

from __future__ import annotations

import httpx
import pytest

import ojs_anyio as ojs
from docs.examples import fastapi_app
from ojs_anyio.testing import JobTester

# In a real project this line goes in conftest.py.
pytest_plugins = ["ojs_anyio.testing.pytest_plugin"]

sent: list[str] = []


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Under anyio's plugin, every test runs on asyncio and on Trio (pytest-asyncio ignores this)."""
    return str(request.param)


async def send_email(ctx: ojs.JobContext, to: str, template: str) -> None:
    sent.append(f"{template}:{to}")


@pytest.fixture
def ojs_worker() -> ojs.Worker:
    """The app's worker: the fixtures drain it."""
    worker = ojs.Worker(queues=[fastapi_app.QUEUE])
    worker.register("email.send", send_email)
    return worker


@pytest.fixture
async def http(ojs_client: ojs.Client) -> httpx.AsyncClient:
    """The app, with the test's client in place of the one its lifespan opens."""
    fastapi_app.app.state.ojs = ojs_client
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=fastapi_app.app), base_url="http://app")


async def test_signup_queues_the_welcome_email(http: httpx.AsyncClient, job_tester: JobTester) -> None:
    sent.clear()
    async with http:
        response = await http.post("/signup", params={"email": "ada@example.com"})
    assert response.status_code == 202
    [job] = job_tester.assert_enqueued(queue=fastapi_app.QUEUE, type="email.send")
    assert job.id == response.json()["job_id"]
    assert job.args == ["ada@example.com", "welcome"]
    assert [o.outcome for o in await job_tester.drain()] == ["completed"]
    assert sent == ["welcome:ada@example.com"]


async def test_nothing_is_queued_before_a_signup(job_tester: JobTester) -> None:
    job_tester.refute_enqueued(queue=fastapi_app.QUEUE)
