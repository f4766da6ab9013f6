"""The Django and FastAPI recipes of docs/job-api.md, run as they are against the broker:
202 with the job id, 503 with Retry-After while the broker is away (made with the fault
proxy), and the FastAPI app under uvicorn stops promptly on SIGTERM during an outage."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import anyio
import anyio.abc
import httpx
import pytest
from anyio.from_thread import start_blocking_portal
from harness import FaultProxy
from support.brokers import RABBITMQ_URL as URL
from support.waits import wait_until

import ojs_anyio as ojs
from ojs_anyio import amqp

from .broker_support import WAIT
from .broker_support import ProcessLog as _Log

ROOT = Path(__file__).resolve().parents[2]
#: How long a push may wait for a recovering connection (the recipes use the defaults).
BOUND = amqp.DEFAULT_PUBLISH_TIMEOUT
#: What a loaded 2-core machine may add to a bound.
SLACK = 10.0
EXAMPLES = ROOT / "docs" / "examples"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"ojs_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


async def _take(queue: str) -> list[ojs.Job]:
    jobs: list[ojs.Job] = []
    with anyio.fail_after(WAIT):
        async with amqp.connect(URL) as conn, conn.channel(confirms=False) as ch:
            while (msg := await ch.get(queue)) is not None:
                jobs.append(ojs.decode_job(msg.body))
                await msg.ack()
            await ch.queue_delete(queue)
            await ch.queue_delete(ojs.Names().dlx_queue(queue.removeprefix("ojs.queue.")))
    return jobs


@pytest.fixture
def example_queue(rabbitmq_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh queue for the recipes, which run on RabbitMQ (uvicorn runs one in a subprocess)."""
    q = f"t{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("OJS_EXAMPLE_QUEUE", q)
    monkeypatch.setenv("OJS_AMQP_URL", rabbitmq_url)
    yield q


def _django() -> ModuleType:
    """The Django recipe, loaded once per process: Django's settings and URL resolver
    keep the first module they saw, so every test uses that one (and its ``QUEUE``)."""
    return sys.modules.get("ojs_example_django_app") or _load("django_app")


@pytest.mark.anyio
@pytest.mark.usefixtures("rabbitmq_url")
async def test_fastapi_recipe_pushes_from_a_request(example_queue: str) -> None:
    module = _load("fastapi_app")
    app = module.app
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            response = await http.post("/signup", params={"email": "a@b.c"})
    assert response.status_code == 202
    jobs = await _take(ojs.Names().job_queue(example_queue))
    expected = [(response.json()["job_id"], "email.send", ["a@b.c", "welcome"])]
    assert [(j.id, j.type, j.args) for j in jobs] == expected


@pytest.mark.anyio
@pytest.mark.usefixtures("rabbitmq_url")
async def test_fastapi_recipe_answers_503_while_the_broker_is_away(
    example_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with FaultProxy() as proxy:
        monkeypatch.setenv("OJS_AMQP_URL", proxy.url())
        module = _load("fastapi_app")
        app = module.app
        with anyio.fail_after(BOUND + 3 * SLACK):
            async with app.router.lifespan_context(app):
                client: ojs.Client = app.state.ojs
                lost, recovered = anyio.Event(), anyio.Event()

                def on_event(event: amqp.RecoveryEvent) -> None:
                    if isinstance(event, amqp.ConnectionLost):
                        lost.set()
                    elif isinstance(event, amqp.ConnectionRecovered):
                        recovered.set()

                client.conn.add_listener(on_event)
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
                    before = await http.post("/signup", params={"email": "before@b.c"})
                    proxy.refuse_new()
                    proxy.cut_all()
                    await lost.wait()
                    started = anyio.current_time()
                    away = await http.post("/signup", params={"email": "away@b.c"})
                    elapsed = anyio.current_time() - started
                    proxy.refuse_new(False)
                    await recovered.wait()
                    after = await http.post("/signup", params={"email": "after@b.c"})
    assert before.status_code == 202 and after.status_code == 202
    assert away.status_code == 503
    assert away.headers["Retry-After"] == module.RETRY_AFTER
    assert away.json()["queued"] is False
    assert elapsed < BOUND + SLACK
    jobs = await _take(ojs.Names().job_queue(example_queue))
    assert [j.id for j in jobs] == [before.json()["job_id"], after.json()["job_id"]]


@pytest.mark.usefixtures("rabbitmq_url")
def test_django_recipe_pushes_from_request_threads(example_queue: str) -> None:
    module = _django()
    from django.test import Client as DjangoClient

    module.close_client()  # the next request connects to the test's URL
    try:
        http = DjangoClient()
        responses = [http.post("/signup", {"email": f"u{i}@b.c"}) for i in range(3)]
    finally:
        module.close_client()
    assert [r.status_code for r in responses] == [202] * 3
    ids = [r.json()["job_id"] for r in responses]
    jobs = anyio.run(_take, ojs.Names().job_queue(module.QUEUE))
    assert sorted(j.id for j in jobs) == sorted(ids)
    assert {tuple(j.args) for j in jobs} == {(f"u{i}@b.c", "welcome") for i in range(3)}


@pytest.mark.usefixtures("rabbitmq_url")
def test_django_recipe_answers_503_while_the_broker_is_away(
    example_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = _django()
    from django.test import Client as DjangoClient

    with start_blocking_portal() as portal, portal.wrap_async_context_manager(FaultProxy()) as proxy:
        monkeypatch.setenv("OJS_AMQP_URL", proxy.url())
        module.close_client()  # the next request connects through the proxy
        http = DjangoClient()
        try:
            before = http.post("/signup", {"email": "before@b.c"})
            lost = threading.Event()

            def on_event(event: amqp.RecoveryEvent) -> None:
                if isinstance(event, amqp.ConnectionLost):
                    lost.set()

            sync_client = module.get_client()
            sync_client._portal.call(sync_client._client.conn.add_listener, on_event)
            portal.call(proxy.refuse_new)
            portal.call(proxy.cut_all)
            assert lost.wait(SLACK)
            started = time.monotonic()
            away = http.post("/signup", {"email": "away@b.c"})
            elapsed = time.monotonic() - started
            portal.call(proxy.refuse_new, False)
        finally:
            module.close_client()
        # No connection can be made at all: the same answer, from the constructor's error.
        portal.call(proxy.refuse_new)
        try:
            unreachable = http.post("/signup", {"email": "unreachable@b.c"})
        finally:
            module.close_client()
    assert before.status_code == 202
    for response in (away, unreachable):
        assert response.status_code == 503
        assert response["Retry-After"] == module.RETRY_AFTER
        assert response.json()["queued"] is False
    assert elapsed < BOUND + SLACK
    jobs = anyio.run(_take, ojs.Names().job_queue(module.QUEUE))
    assert [j.id for j in jobs] == [before.json()["job_id"]]


@pytest.mark.anyio
@pytest.mark.usefixtures("rabbitmq_url")
async def test_fastapi_recipe_under_uvicorn_stops_promptly_on_sigterm_while_the_broker_is_away(
    example_queue: str,
) -> None:
    """A request whose push waits for the broker ends (503) within the push's bound, so
    uvicorn's graceful shutdown does not hang on it."""
    async with FaultProxy() as proxy:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "codec")]),
            "OJS_AMQP_URL": proxy.url(),
        }
        command = [
            sys.executable, "-m", "uvicorn", "docs.examples.fastapi_app:app",
            "--host", "127.0.0.1", "--port", "0", "--log-level", "trace",
        ]  # fmt: skip
        process = await anyio.open_process(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
        log = _Log()
        try:
            async with anyio.create_task_group() as tg:
                assert process.stderr is not None
                tg.start_soon(log.read, process.stderr)
                with anyio.fail_after(WAIT + SLACK):
                    port = (await log.wait_for(r"Uvicorn running on http://127\.0\.0\.1:(\d+)")).group(1)
                    await log.wait_for("Application startup complete")
                responses: list[httpx.Response] = []
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
                    before = await http.post("/signup", params={"email": "before@b.c"})
                    assert before.status_code == 202
                    proxy.refuse_new()
                    proxy.cut_all()
                    # The app saw the loss: it tries to reconnect (about 1 s later) and is refused.
                    await wait_until(lambda: proxy.connections_refused >= 1, SLACK, what="a reconnect")

                    async def request() -> None:
                        responses.append(await http.post("/signup", params={"email": "away@b.c"}))

                    tg.start_soon(request)
                    # The app has the request (uvicorn's trace log shows the second HTTP call).
                    with anyio.fail_after(SLACK):
                        await log.wait_for(r"ASGI \[\d+\] Started scope=\{'type': 'http'", count=2)
                    process.send_signal(signal.SIGTERM)
                    with anyio.fail_after(BOUND + SLACK):
                        await process.wait()
                tg.cancel_scope.cancel()
        finally:
            if process.returncode is None:
                process.kill()
            with anyio.CancelScope(shield=True):
                await process.aclose()
    # A graceful exit: uvicorn re-raises the SIGTERM it handled once shut down (0.29 and later).
    assert process.returncode in (0, -signal.SIGTERM)
    assert any("Application shutdown complete" in line for line in log.lines)
    assert [r.status_code for r in responses] == [503]
    assert responses[0].json()["queued"] is False
    await _take(ojs.Names().job_queue(example_queue))
