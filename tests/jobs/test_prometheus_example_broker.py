"""docs/examples/prometheus_metrics.py (the Prometheus recipe of docs/job-api.md) against the
broker: the scraped /metrics text holds the per-job-type series with the workload's values."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.anyio

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "prometheus_metrics.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ojs_example_prometheus_metrics", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Prometheus text format → {(name, labels): value}."""
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for line in text.splitlines():
        m = re.fullmatch(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)", line)
        if m is None or line.startswith("#"):
            continue
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


async def test_prometheus_recipe_exports_per_type_series(
    q: str, broker_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = _load()
    monkeypatch.setattr(module, "URL", broker_url)
    text = await module.run_and_scrape(q)
    samples = _samples(text)
    base = {("messaging_system", "rabbitmq"), ("messaging_destination_name", q)}

    def value(name: str, job_type: str, **extra: str) -> float | None:
        return samples.get((name, frozenset({*base, ("ojs_job_type", job_type), *extra.items()})))

    assert value("ojs_jobs_started_total", "email.send") == 3
    assert value("ojs_jobs_started_total", "report.build") == 4
    assert value("ojs_jobs_completed_total", "email.send") == 3
    assert value("ojs_jobs_completed_total", "report.build") == 2
    assert value("ojs_jobs_failed_total", "report.build", error_type="HANDLER_ERROR") == 2
    assert value("ojs_jobs_dead_lettered_total", "report.build") == 2
    assert value("ojs_jobs_failed_total", "email.send", error_type="HANDLER_ERROR") is None
    assert value("ojs_jobs_dead_lettered_total", "email.send") is None
    # OpenTelemetry's messaging.process.duration (unit s), as the exporter names it; a failed
    # attempt's duration carries its error.type (the exporter writes "" for a label a series
    # lacks).
    duration = "messaging_process_duration_seconds"
    process = {"messaging_operation_name": "process", "error_type": ""}
    assert value(f"{duration}_count", "email.send", **process) == 3
    assert value(f"{duration}_count", "report.build", **process) == 2
    failed = {**process, "error_type": "HANDLER_ERROR"}
    assert value(f"{duration}_count", "report.build", **failed) == 2
    # The handlers sleep 10 and 20 ms: every attempt is past the 5 ms bucket's bound.
    assert value(f"{duration}_bucket", "report.build", **process, le="0.005") == 0
    assert value(f"{duration}_bucket", "report.build", **process, le="+Inf") == 2
    email_sum = value(f"{duration}_sum", "email.send", **process)
    assert email_sum is not None and 0.03 <= email_sum < 10
