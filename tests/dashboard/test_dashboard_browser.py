"""``ojs-anyio dashboard`` in a real browser: Debian's Chromium, driven by Playwright.

Against the real RabbitMQ, with a real ``ojs-anyio worker`` and ``ojs-anyio cron``, the
dashboard server runs as ``ojs-anyio dashboard --backend asyncio`` and ``--backend trio``
(Hypercorn on each), and the page is checked as an operator uses it:

* queue numbers change as jobs are pushed, without reloading the page;
* a running job appears (with its worker and BEAT) and can be cancelled;
* a dead job's reason is shown, and it can be requeued (and then completes);
* an action without the token is refused, and changes nothing;
* the cron page names the leader.

Screenshots of the main views are taken each run; with ``OJS_DASHBOARD_SCREENSHOTS=docs``
the asyncio run writes them there (the ones in docs/ come from such a run).

Broker work happens in a helper thread: Playwright's synchronous API keeps an event loop of
its own in this thread.  ``scripts/ensure-browser`` installs Chromium; without one (not
root, no apt-get) these tests are skipped, saying so.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest
from cli.cli_support import URL, cli_cmd, cli_env, delete_queues

import ojs_anyio as ojs
from ojs_anyio.jobs import RETRY_LADDER_MS

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("rabbitmq_url")]

CHROMIUM = os.environ.get("OJS_CHROMIUM", "/usr/bin/chromium")
#: The flags /work/.library/env/machines/python-svc.md gives for Chromium on a closed network.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TOKEN = "browser-test-token-0123456789"
#: Bound on each wait for the page to show something (it refreshes every 0.5 s here).
SHOWN = 30_000

T = TypeVar("T")

APP = """
import os
import anyio
import ojs_anyio as ojs

QUEUE = os.environ["APP_QUEUE"]
FIXED = os.environ["APP_FIXED"]
worker = ojs.Worker(queues=[QUEUE], concurrency=3, heartbeat_interval=0.5, grace_period=1)


@worker.handler("t.hold")
async def hold(ctx: ojs.JobContext, label: str) -> None:
    await anyio.sleep_forever()  # until cancelled


@worker.handler("t.invoice")
async def invoice(ctx: ojs.JobContext, number: int) -> dict:
    if not os.path.exists(FIXED):
        raise ValueError(f"invoice {number} not found")
    return {"invoice": number, "sent": True}


@worker.handler("t.broken")
async def broken(ctx: ojs.JobContext) -> None:
    raise ojs.Discard("this job can never work")


sched = ojs.Scheduler(name=os.environ["APP_GROUP"])
sched.add("t.invoice", "0 3 * * *", args=[1], name="nightly-invoices", queue=QUEUE)
"""


def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a thread of its own (it may run an event loop there)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args).result(timeout=60)


def push(queue: str, job_type: str, args: list[Any], **options: Any) -> str:
    async def go() -> str:
        async with ojs.connect(URL) as client:
            return (await client.push(job_type, args, queue=queue, **options)).id

    return off_loop(anyio.run, go)


def declare(queue: str) -> None:
    async def go() -> None:
        async with ojs.connect(URL) as client:
            await client.declare_queue(queue)
            await client.declare_control_queue(queue)

    off_loop(anyio.run, go)


class Process:
    """An ``ojs-anyio`` child process, stopped (SIGTERM, then killed) at the end."""

    def __init__(self, args: list[str], cwd: Path, log: Path, env: dict[str, str]) -> None:
        self.log = log
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                cli_cmd(*args),
                cwd=cwd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=out,
                stdin=subprocess.DEVNULL,
                text=True,
            )

    def first_line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"exited with {self.proc.wait()}: {self.log.read_text()}"
        return line

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def browser_context(tmp_path: Path) -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright for Python is not installed (it comes with the dev extra)")
    if not os.path.exists(CHROMIUM):
        pytest.skip(
            f"no Chromium at {CHROMIUM}: scripts/ensure-browser installs Debian's (needs root and apt-get)"
        )
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1200, "height": 800},
        )
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def app(tmp_path: Path) -> Iterator[dict[str, Any]]:
    q = f"tdash{uuid.uuid4().hex[:10]}"
    group = f"g{q}"
    (tmp_path / "app.py").write_text(APP)
    env = cli_env(APP_QUEUE=q, APP_FIXED=str(tmp_path / "fixed"), APP_GROUP=group)
    processes: list[Process] = []

    def start(*args: str) -> Process:
        proc = Process(list(args), tmp_path, tmp_path / f"{args[0]}-{len(processes)}.log", env)
        processes.append(proc)
        return proc

    try:
        yield {"queue": q, "dir": tmp_path, "start": start}
    finally:
        for proc in reversed(processes):
            proc.stop()
        names = ojs.Names()
        delete_queues(
            [
                names.job_queue(q),
                names.dlx_queue(q),
                names.control_queue(q),
                names.redelivered_queue(q),
                names.delay_landing_queue(q),
                f"ojs.queue.scheduler.{group}.leader",
                *(names.retry_queue(q, ms) for ms in RETRY_LADDER_MS),
            ]
        )


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_an_operator_watches_and_acts_in_chromium(
    backend: str, app: dict[str, Any], browser_context: Any, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    q: str = app["queue"]
    start: Callable[..., Process] = app["start"]
    shots = Shots(tmp_path, backend)
    declare(q)
    dashboard = start(
        "dashboard", "--queues", q, "--bind", "127.0.0.1:0", "--token", TOKEN,
        "--backend", backend, "--refresh", "0.5",
    )  # fmt: skip
    ready = dashboard.first_line()
    match = re.search(r"dashboard at (http://127\.0\.0\.1:\d+)/", ready)
    assert match, ready
    base = match.group(1)
    start("cron", "app:sched")

    page = browser_context.new_page()
    page.goto(base + "/")
    row = page.locator(f'tr[data-queue="{q}"]')
    cell = lambda col: row.locator(f'td[data-col="{col}"]')  # noqa: E731
    expect(cell("ready")).to_have_text("0", timeout=SHOWN)
    expect(cell("consumers")).to_have_text("0")

    # Queue numbers change as jobs are pushed (no worker yet), without a reload.
    held = [push(q, "t.hold", [f"hold {n}"]) for n in range(2)]
    expect(cell("ready")).to_have_text("2", timeout=SHOWN)

    # A worker starts: the jobs run, and the page says so.
    start("worker", "app:worker")
    expect(cell("running")).to_have_text("2", timeout=SHOWN)
    expect(cell("ready")).to_have_text("0", timeout=SHOWN)
    expect(cell("consumers")).to_have_text("1", timeout=SHOWN)

    # The running jobs, with their worker and BEAT.
    page.get_by_role("link", name="Workers").click()
    job_row = page.locator(f'tr[data-job="{held[0]}"]')
    expect(job_row).to_be_visible(timeout=SHOWN)
    expect(page.locator("table.jobs tbody tr")).to_have_count(2)
    expect(job_row.locator("td").nth(4)).to_contain_text("worker-")
    expect(job_row.locator("td").nth(5)).to_contain_text(" ago", timeout=SHOWN)  # a BEAT was seen
    expect(page.locator("span.badge.live")).to_have_count(1)
    shots.take(page, "workers")

    # Cancel without the token: refused, and the job runs on.
    cancel = job_row.get_by_role("button", name=f"Cancel job {held[0]}")
    cancel.click()
    expect(page.locator("#status")).to_contain_text("Refused (401)", timeout=SHOWN)
    expect(page.locator("#status")).to_contain_text("token missing or wrong")
    page.wait_for_function(
        "() => !document.querySelector('button[data-action]').disabled", timeout=SHOWN
    )  # the page took the answer in
    expect(job_row).to_be_visible()

    # With the token: cancelled, gone from the running jobs, and INFO says so.
    page.get_by_label("Action token").fill(TOKEN)
    page.get_by_role("button", name="Use").click()
    expect(page.locator("#token-state")).to_have_text("token set for this tab")
    job_row.get_by_role("button", name=f"Cancel job {held[0]}").click()
    expect(page.locator("#status")).to_contain_text(f"cancel sent to the workers of {q}", timeout=SHOWN)
    expect(job_row).to_have_count(0, timeout=SHOWN)
    expect(page.locator(f'tr[data-job="{held[1]}"]')).to_be_visible()
    page.goto(f"{base}/jobs/{held[0]}?queue={q}")
    expect(page.locator('dd[data-field="state"]')).to_have_text("cancelled", timeout=SHOWN)

    # A job that fails twice is dead: its reason is on the dead-letter page.
    dead = push(q, "t.invoice", [7], retry=ojs.RetryPolicy(max_attempts=2, initial_interval=0.1))
    page.goto(base + "/")
    expect(cell("dead")).to_have_text("1", timeout=SHOWN)
    # The throughput sparklines: the worker's counters, carried by its presence messages.
    for series in ("retried", "dead_lettered"):
        expect(page.locator(f"figure.{series} .muted")).not_to_have_text("peak 0.0/s", timeout=SHOWN)
    shots.take(page, "overview")
    cell("dead").get_by_role("link").click()
    dead_row = page.locator(f'tr[data-job="{dead}"]')
    expect(dead_row.locator("td.reason")).to_have_text(
        "HANDLER_ERROR: ValueError: invoice 7 not found (attempt 2 of 2, retries exhausted)"
    )
    expect(dead_row.locator("td").nth(1)).to_have_text("2")  # attempt
    expect(page.locator("details")).to_have_count(0)  # no backtrace unless --show-backtraces
    shots.take(page, "dead-letters")

    # Requeue from a tab without the token: refused, the job stays dead.
    other = browser_context.new_page()
    other.goto(page.url)
    other.locator(f'tr[data-job="{dead}"]').get_by_role("button", name=f"Requeue job {dead}").click()
    expect(other.locator("#status")).to_contain_text("Refused (401)", timeout=SHOWN)
    expect(other.locator('strong[data-col="dead-total"]')).to_have_text("1")
    other.close()

    # The bug is fixed; requeue with the token: the job leaves the DLQ and completes.
    (app["dir"] / "fixed").write_text("")
    dead_row.get_by_role("button", name=f"Requeue job {dead}").click()
    expect(page.locator("#status")).to_contain_text(f"requeued 1 dead job(s) to ojs.queue.{q}", timeout=SHOWN)
    expect(page.locator('strong[data-col="dead-total"]')).to_have_text("0", timeout=SHOWN)
    page.get_by_label("Job id").fill(dead)
    page.get_by_role("button", name="Show").click()
    expect(page).to_have_url(f"{base}/jobs/{dead}")
    expect(page.locator('dd[data-field="state"]')).to_have_text("completed", timeout=SHOWN)
    expect(page.locator('pre[data-field="result"]')).to_contain_text('"sent": true')
    shots.take(page, "job")

    # Requeue all, then purge (each asks first): jobs that can never work die again, and go.
    for _ in range(2):
        push(q, "t.broken", [])
    page.goto(f"{base}/dead/{q}")
    total = page.locator('strong[data-col="dead-total"]')
    expect(total).to_have_text("2", timeout=SHOWN)
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name=f"Requeue every dead job of {q}").click()
    expect(page.locator("#status")).to_contain_text("requeued 2 dead job(s)", timeout=SHOWN)
    expect(total).to_have_text("2", timeout=SHOWN)  # the worker discarded them again
    dismissed: list[str] = []
    page.once("dialog", lambda dialog: (dismissed.append(dialog.message), dialog.dismiss()))
    page.get_by_role("button", name=f"Delete every dead job of {q}").click()
    expect(total).to_have_text("2")
    assert dismissed == [f"Delete every dead job of {q}? This cannot be undone."]
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name=f"Delete every dead job of {q}").click()
    expect(page.locator("#status")).to_contain_text(
        f"purged 2 dead job(s) from ojs.queue.dlx.{q}", timeout=SHOWN
    )
    expect(total).to_have_text("0", timeout=SHOWN)

    # Cron: the scheduler's leader and its schedule.
    page.get_by_role("link", name="Cron").click()
    expect(page.locator("p.leader")).to_contain_text("Leader: instance", timeout=SHOWN)
    expect(page.get_by_role("rowheader", name="nightly-invoices")).to_be_visible()
    shots.take(page, "cron")

    # A narrow window (a phone, a split screen): still readable, tables scroll inside.
    page.set_viewport_size({"width": 420, "height": 900})
    page.goto(base + "/")
    expect(cell("ready")).to_be_visible(timeout=SHOWN)
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 420, f"the page is {width}px wide in a 420px window"
    shots.take(page, "narrow")


class Shots:
    """Screenshots of the views: into the test's directory, and (asyncio run) into
    ``$OJS_DASHBOARD_SCREENSHOTS`` as ``dashboard-<view>.png`` when it is set."""

    def __init__(self, tmp_path: Path, backend: str) -> None:
        self.dir = tmp_path
        target = os.environ.get("OJS_DASHBOARD_SCREENSHOTS")
        self.publish = Path(target) if target and backend == "asyncio" else None

    def take(self, page: Any, view: str) -> None:
        path = self.dir / f"dashboard-{view}.png"
        page.screenshot(path=str(path), full_page=True)
        data = path.read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 5000, view
        if self.publish is not None:
            self.publish.mkdir(parents=True, exist_ok=True)
            (self.publish / path.name).write_bytes(data)
