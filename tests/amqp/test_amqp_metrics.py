"""The AMQP layer's metrics without a broker: nothing is registered on import, and the
label function keeps label values in a bounded set."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ojs_anyio.amqp import _metrics

#: Pure test module: runs under ``pytest -m "not broker"`` (see tests/conftest.py).

ROOT = Path(__file__).resolve().parents[2]


def test_importing_creates_no_instrument() -> None:
    """Importing the package registers nothing with OpenTelemetry (a fresh interpreter,
    with an SDK MeterProvider installed first so instruments would be visible)."""
    code = (
        "from opentelemetry import metrics\n"
        "from opentelemetry.sdk.metrics import MeterProvider\n"
        "from opentelemetry.sdk.metrics.export import InMemoryMetricReader\n"
        "reader = InMemoryMetricReader()\n"
        "metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))\n"
        "import ojs_anyio, ojs_anyio.amqp\n"
        "from ojs_anyio.amqp import _metrics\n"
        "assert not _metrics.instruments.registered\n"
        "data = reader.get_metrics_data()\n"
        "assert data is None or not data.resource_metrics, data\n"
        "_metrics.register()\n"
        "data = reader.get_metrics_data()\n"
        "names = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}\n"
        "assert 'ojs_amqp_connections_active' in names, names\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'codec'}"}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)


def test_labels_come_from_a_bounded_set(monkeypatch: pytest.MonkeyPatch) -> None:
    queues: set[str] = set()
    monkeypatch.setattr(_metrics, "queues", queues)
    _metrics.track_queue("jobs")
    _metrics.track_queue("amq.gen-AbC")  # server-named: never a label
    _metrics.track_queue("amq.rabbitmq.reply-to")
    assert _metrics.label("jobs") == "jobs"
    assert _metrics.label("amq.gen-AbC") == _metrics.OTHER
    assert _metrics.label("0.1.1.0.jobs") == _metrics.OTHER  # a delay-level routing key
    for i in range(2 * _metrics.MAX_QUEUE_LABELS):
        _metrics.track_queue(f"q{i}")
    assert len(queues) == _metrics.MAX_QUEUE_LABELS
    assert _metrics.label(f"q{2 * _metrics.MAX_QUEUE_LABELS - 1}") == _metrics.OTHER
