"""The dashboard's HTTP side (:func:`ojs_anyio.dashboard.create_app`) on ``memory://``:
pages, the checks that guard every action, and what a page must never show.

Requests go through httpx's ASGI transport (no socket); the browser tests
(test_dashboard_browser.py) drive the same app served by Hypercorn in Chromium.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
from support.waits import wait_message_count
from support.workers import Outcomes, running

import ojs_anyio as ojs
from ojs_anyio import amqp
from ojs_anyio.dashboard import Observer, Settings, create_app, observe
from ojs_anyio.jobs import PRESENCE_KEY, WORKER_PRESENCE
from ojs_anyio.memory import get_broker

from .dashboard_support import WAIT, holding_worker, memory_client, qname, wait_for

pytestmark = pytest.mark.anyio

TOKEN = "correct-horse-battery-staple"
BASE = "http://127.0.0.1:8080"
GOOD = {"Origin": BASE, "Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}


@asynccontextmanager
async def dashboard(
    client: ojs.Client, queues: list[str], **settings: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, Observer]]:
    async with observe(client, queues=queues, refresh=3600) as obs:
        app = create_app(obs, Settings(broker=client.conn.url.redacted(), **settings))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as http:
            yield http, obs


async def dead_jobs(client: ojs.Client, q: str, n: int) -> list[ojs.Job]:
    """``n`` jobs of ``q`` dead-lettered by a worker (retried once first, so they carry
    their error and its backtrace)."""
    worker = ojs.Worker(queues=[q], retry=ojs.RetryPolicy(max_attempts=2, initial_interval=0.1))

    @worker.handler("t.fail")
    async def fail(ctx: ojs.JobContext, n: int) -> None:
        raise ValueError(f"no invoice {n}")

    outcomes = Outcomes(worker)
    async with running(worker, client):
        jobs = [await client.push("t.fail", [i], queue=q) for i in range(n)]
        await outcomes.wait_for(lambda o: o.outcome == "dead_lettered", count=n)
    await wait_message_count(client.conn, client.names.dlx_queue(q), n, WAIT)
    return jobs


async def test_pages_render_with_their_live_regions_and_security_headers() -> None:
    q = qname()
    async with memory_client() as client, dashboard(client, [q], token=TOKEN) as (http, obs):
        await client.declare_queue(q)
        await client.push("t.any", [], queue=q)
        await obs.poll()
        for path in ("/", "/workers", "/cron", f"/dead/{q}", "/jobs/01a21165-0000-7000-8000-000000000000"):
            r = await http.get(path)
            assert r.status_code == 200, (path, r.text)
            assert r.text.startswith("<!doctype html>") and '<html lang="en">' in r.text
            assert "script-src 'self'" in r.headers["content-security-policy"]
            assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
            assert r.headers["x-content-type-options"] == "nosniff"
            assert r.headers["cache-control"] == "no-store"
            assert "<script>" not in r.text and " style=" not in r.text  # nothing inline: CSP allows none
            live = await http.get(path, params={"fragment": "1"})
            assert live.status_code == 200 and "<html" not in live.text
        overview = (await http.get("/", params={"fragment": "1"})).text
        assert f'<tr data-queue="{q}">' in overview and '<td class="num" data-col="ready">1</td>' in overview
        for name in ("dashboard.js", "dashboard.css"):
            r = await http.get(f"/static/{name}")
            assert r.status_code == 200 and len(r.content) > 500
        assert (await http.get("/static/../_app.py")).status_code == 404


async def test_a_request_for_another_host_name_is_refused() -> None:
    """DNS rebinding: a page of evil.example whose name now points at 127.0.0.1."""
    async with memory_client() as client, dashboard(client, [], token=TOKEN) as (http, _):
        assert (await http.get("/", headers={"Host": "evil.example"})).status_code == 421
        assert (await http.get("/", headers={"Host": "evil.example:8080"})).status_code == 421
        assert (await http.post("/api/purge", headers={**GOOD, "Host": "evil.example"})).status_code == 421
        for host in ("localhost:8080", "[::1]:8080", "127.0.0.1"):
            assert (await http.get("/", headers={"Host": host})).status_code == 200, host


REFUSALS = [
    pytest.param({"read_only": True}, {}, 403, "read-only", id="read-only"),
    pytest.param({"token": None}, {}, 403, "--token", id="no-token-configured"),
    pytest.param({}, {"Origin": None}, 403, "cross-site", id="no-origin"),
    pytest.param({}, {"Origin": "http://evil.example"}, 403, "cross-site", id="other-origin"),
    pytest.param({}, {"Origin": "http://127.0.0.1:9999"}, 403, "cross-site", id="other-port"),
    pytest.param({}, {"Sec-Fetch-Site": "cross-site"}, 403, "Sec-Fetch-Site", id="sec-fetch-site"),
    pytest.param({}, {"Content-Type": "application/x-www-form-urlencoded"}, 415, "JSON", id="form-post"),
    pytest.param({}, {"Content-Type": "text/plain"}, 415, "JSON", id="text-post"),
    pytest.param({}, {"Authorization": None}, 401, "token", id="no-token-sent"),
    pytest.param({}, {"Authorization": "Bearer wrong-token-wrong"}, 401, "token", id="wrong-token"),
    pytest.param({}, {"Authorization": f"Basic {TOKEN}"}, 401, "token", id="not-bearer"),
]


@pytest.mark.parametrize(("settings", "headers", "status", "says"), REFUSALS)
async def test_a_state_changing_action_is_refused_unless_every_check_passes(
    settings: dict[str, Any], headers: dict[str, str | None], status: int, says: str
) -> None:
    q = qname()
    async with memory_client() as client:
        await dead_jobs(client, q, 1)
        async with dashboard(client, [q], **{"token": TOKEN, **settings}) as (http, obs):
            sent = {k: v for k, v in {**GOOD, **headers}.items() if v is not None}
            for name, body in (("purge", {"queue": q}), ("requeue", {"queue": q, "ids": None})):
                r = await http.post(f"/api/{name}", headers=sent, content=json.dumps(body))
                assert r.status_code == status, r.text
                assert r.json()["ok"] is False and says in r.json()["error"]
            await obs.poll()
            assert obs.overview().queues[0].dead == 1  # nothing changed
            # The same request with every check passing is done.
            if not settings:
                r = await http.post("/api/purge", headers=GOOD, content=json.dumps({"queue": q}))
                assert r.status_code == 200 and r.json() == {
                    "ok": True,
                    "message": f"purged 1 dead job(s) from ojs.queue.dlx.{q}",
                }
                assert obs.overview().queues[0].dead == 0


async def test_actions_requeue_and_cancel_and_their_errors() -> None:
    q = qname()
    async with memory_client() as client:
        jobs = await dead_jobs(client, q, 2)
        async with dashboard(client, [q], token=TOKEN) as (http, obs):

            async def post(name: str, body: object) -> httpx.Response:
                return await http.post(f"/api/{name}", headers=GOOD, content=json.dumps(body))

            r = await post("requeue", {"queue": q, "ids": [jobs[1].id], "reset_attempts": False})
            assert r.status_code == 200 and r.json()["message"] == f"requeued 1 dead job(s) to ojs.queue.{q}"
            row = obs.overview().queues[0]
            assert (row.dead, row.ready) == (1, 1)
            r = await post("requeue", {"queue": q, "ids": ["01a21165-0000-7000-8000-000000000000"]})
            assert r.json()["message"].endswith("(1 not found)")
            assert (await post("requeue", {"queue": "dlx.x"})).status_code == 400
            assert (await post("requeue", {"queue": q, "ids": "x"})).status_code == 400
            assert (await post("requeue", {"queue": q, "ids": ["x"] * 1001})).status_code == 400
            assert (await post("requeue", {"queue": q, "reset_attempts": "yes"})).status_code == 400
            assert (await post("cancel", {"queue": q, "job_id": "1234"})).status_code == 400  # not a UUIDv7
            assert (await post("cancel", {"queue": qname(), "job_id": jobs[0].id})).status_code == 404
            assert (await post("nothing", {})).status_code == 404
            r = await http.post("/api/purge", headers=GOOD, content=b"[1, 2]")
            assert r.status_code == 400
            r = await http.post("/api/purge", headers=GOOD, content=b"{" * 70_000)
            assert r.status_code == 413
            r = await post("cancel", {"queue": q, "job_id": jobs[0].id})
            assert r.status_code == 200 and r.json()["ok"] is True


async def test_the_password_never_appears_in_a_page() -> None:
    password = "s3cret-Pa55word"
    name = f"dash-{qname()}"
    broker = get_broker(name)
    broker.add_user("operator", password)
    q = qname()
    try:
        async with ojs.connect(f"memory://operator:{password}@{name}/") as client:
            await dead_jobs(client, q, 1)
            async with dashboard(client, [q], token=TOKEN, show_backtraces=True) as (http, obs):
                assert "operator:***@" in obs.client.conn.url.redacted()
                pages = ["/", "/workers", "/cron", f"/dead/{q}", "/jobs/1234", f"/dead/{qname()}"]
                for path in pages:
                    for params in ({}, {"fragment": "1"}):
                        r = await http.get(path, params=params)
                        assert password not in r.text, path
                        assert "operator:***@" in r.text or params, path
                r = await http.post(
                    "/api/cancel", headers=GOOD, content=json.dumps({"queue": q, "job_id": "x"})
                )
                assert password not in r.text
    finally:
        broker.close()


async def test_backtraces_are_shown_only_when_the_operator_asks() -> None:
    q = qname()
    async with memory_client() as client:
        await dead_jobs(client, q, 1)
        for show in (False, True):
            async with dashboard(client, [q], show_backtraces=show) as (http, _):
                page = (await http.get(f"/dead/{q}")).text
                assert "ValueError: no invoice 0" in page  # the reason is always there
                assert ("<summary>Backtrace</summary>" in page) is show
                assert ("raise ValueError" in page) is show


async def test_what_the_broker_says_is_escaped() -> None:
    """Host names, ids and queues in presence messages come from whoever can publish to
    the vhost: they are text in the page, never markup."""
    evil = "<script>alert(1)</script>"
    presence = {
        "worker_id": 'w"><img src=x onerror=alert(2)>',
        "host": evil,
        "pid": 1,
        "queues": [],
        "concurrency": 1,
        "backend": "asyncio",
        "state": "running",
        "interval": 60.0,
        "sent_at": "2026-01-01T00:00:00Z",
        "running": [{"job_id": evil, "type": evil, "queue": "q", "attempt": 1, "age": 1.0}],
        "running_total": 1,
        "counts": {},
    }
    async with memory_client() as client, dashboard(client, [], token=TOKEN) as (http, obs):
        ch = await client.channel()
        await ch.publish(
            json.dumps(presence).encode(),
            exchange=client.names.control_exchange,
            routing_key=PRESENCE_KEY,
            properties=amqp.BasicProperties(type=WORKER_PRESENCE),
        )
        await wait_for(obs, lambda: bool(obs.workers()), "the presence message")
        page = (await http.get("/workers")).text
        assert evil not in page and "<img" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
        assert "/jobs/%3Cscript%3Ealert%281%29%3C%2Fscript%3E?queue=q" in page


async def test_the_job_page_shows_info_and_a_cancel_button_while_it_runs() -> None:
    q = qname()
    worker, started = holding_worker(q, heartbeat_interval=0.05)
    outcomes = Outcomes(worker)
    async with (
        memory_client() as client,
        dashboard(client, [q], token=TOKEN) as (http, obs),
        running(worker, client),
    ):
        job = await client.push("t.hold", [], queue=q)
        with anyio.fail_after(WAIT):
            await started.wait()
        page = (await http.get(f"/jobs/{job.id}", params={"queue": q, "fragment": "1"})).text
        assert 'data-state="active"' in page and 'data-action="cancel"' in page
        await wait_for(obs, lambda: obs.running_job(job.id) is not None, "the running job")
        workers = (await http.get("/workers", params={"fragment": "1"})).text
        assert f'data-job-id="{job.id}"' in workers
        await client.cancel(job.id, queue=q)
        await outcomes.wait_final(job.id)
        async with dashboard(client, [q], read_only=True) as (http, _):
            page = (await http.get(f"/jobs/{job.id}", params={"queue": q})).text
            assert 'data-state="cancelled"' in page
            assert "data-action=" not in page and 'id="token"' not in page and "Read-only" in page
