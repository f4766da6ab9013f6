"""The Django and FastAPI recipes of docs/jobs.md, run as they are against the broker."""

from __future__ import annotations

import importlib.util
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import anyio
import httpx
import pytest

import ojs_anyio as ojs
from ojs_anyio import amqp

from .broker_support import URL, WAIT

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


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
def example_queue(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    q = f"t{uuid.uuid4().hex[:10]}"
    monkeypatch.setenv("OJS_EXAMPLE_QUEUE", q)
    monkeypatch.setenv("OJS_AMQP_URL", URL)
    yield q


@pytest.mark.anyio
async def test_fastapi_recipe_pushes_from_a_request(example_queue: str) -> None:
    module = _load("fastapi_app")
    app = module.app
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            response = await http.post("/signup", params={"email": "a@b.c"})
    assert response.status_code == 200
    jobs = await _take(ojs.Names().job_queue(example_queue))
    expected = [(response.json()["job_id"], "email.send", ["a@b.c", "welcome"])]
    assert [(j.id, j.type, j.args) for j in jobs] == expected


def test_django_recipe_pushes_from_request_threads(example_queue: str) -> None:
    module = _load("django_app")
    from django.test import Client as DjangoClient

    try:
        http = DjangoClient()
        ids = [http.post("/signup", {"email": f"u{i}@b.c"}).json()["job_id"] for i in range(3)]
    finally:
        module.close_client()
    jobs = anyio.run(_take, ojs.Names().job_queue(example_queue))
    assert sorted(j.id for j in jobs) == sorted(ids)
    assert {tuple(j.args) for j in jobs} == {(f"u{i}@b.c", "welcome") for i in range(3)}
