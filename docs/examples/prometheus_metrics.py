"""Prometheus recipe: per-job-type metrics (ojs.JobMetrics) scraped from the OpenTelemetry
Prometheus exporter's /metrics endpoint.

Run:  python3 docs/examples/prometheus_metrics.py [asyncio|trio]
      (needs opentelemetry-sdk and opentelemetry-exporter-prometheus; the `dev` extra has both;
      tests/jobs/test_prometheus_example_broker.py runs it on both backends)

It serves /metrics on a free loopback port, runs a known workload (5 jobs that complete, of
two types, and 2 that fail and are dead-lettered), scrapes the endpoint once and prints the
``ojs_job*`` and ``messaging_process_duration*`` lines.  In a real service you would call
``start_http_server(9464)`` once at start-up and let Prometheus scrape it; everything else is
the same.
"""

from __future__ import annotations

import os
import sys
import uuid

import anyio
import httpx
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry, start_http_server

import ojs_anyio as ojs

URL = os.environ.get("OJS_AMQP_URL", "amqp://guest:guest@localhost:5672/")


async def run_and_scrape(queue: str) -> str:
    """Serve /metrics, run the workload on ``queue``, and return one scrape of /metrics."""
    # Its own registry and meter provider, so nothing global is touched (a service would
    # usually call metrics.set_meter_provider(provider) and use the default REGISTRY).
    registry = CollectorRegistry()
    reader = PrometheusMetricReader(scope_info_enabled=False, registry=registry)  # no otel_scope_* labels
    provider = MeterProvider(metric_readers=[reader])
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)  # port 0: a free one
    try:
        worker = ojs.Worker(queues=[queue], concurrency=4, middleware=[ojs.JobMetrics(provider)])
        finished = 0
        all_done = anyio.Event()

        def on_outcome(outcome: ojs.JobOutcome) -> None:
            nonlocal finished
            if outcome.outcome in ("completed", "dead_lettered"):
                finished += 1
                if finished == 7:
                    all_done.set()

        worker.add_listener(on_outcome)

        @worker.handler("email.send")
        async def send_email(ctx: ojs.JobContext, to: str) -> None:
            await anyio.sleep(0.01)  # stands for the real work

        @worker.handler("report.build")
        async def build_report(ctx: ojs.JobContext, day: str) -> None:
            await anyio.sleep(0.02)
            if day == "bad":
                raise ValueError(f"no data for {day!r}")

        once = ojs.RetryPolicy(max_attempts=1)  # a failure is dead-lettered at once
        async with ojs.connect(URL) as client, anyio.create_task_group() as tg:
            tg.start_soon(worker.run, client)
            for to in ("a@b.c", "b@b.c", "c@b.c"):
                await client.push("email.send", [to], queue=queue)
            for day in ("2026-11-01", "2026-11-02", "bad", "bad"):
                await client.push("report.build", [day], queue=queue, retry=once)
            with anyio.fail_after(30):
                await all_done.wait()
            worker.stop()
        async with httpx.AsyncClient() as http:
            response = await http.get(f"http://127.0.0.1:{server.server_port}/metrics")
        response.raise_for_status()
        return response.text
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(server.shutdown)  # waits for serve_forever to return
        server.server_close()
        thread.join()
        provider.shutdown()


async def main() -> None:
    queue = os.environ.get("OJS_EXAMPLE_QUEUE", f"prom-{uuid.uuid4().hex[:8]}")
    text = await run_and_scrape(queue)
    for line in text.splitlines():
        # The bucket lines (le="...") are long and left out.
        if line.startswith(("ojs_job", "messaging_process")) and 'le="' not in line:
            print(line)


if __name__ == "__main__":
    anyio.run(main, backend=sys.argv[1] if len(sys.argv) > 1 else "asyncio")
