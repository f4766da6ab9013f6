"""Metric labels stay bounded (every buffer has a bound, the metric exporter's included).

Scheduled jobs are published to the delay levels with a routing key that encodes the
delay, so before labels were bounded each distinct delay added a label value to
``ojs_amqp_messages_published_total`` forever.  Here 10,000 jobs with 10,000 distinct
delays go through the OpenTelemetry SDK's ``InMemoryMetricReader``: after the first 100
the label sets of every ``ojs_amqp_*`` instrument stop growing.
"""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import ojs_anyio as ojs
from ojs_anyio.amqp import _metrics

from .test_observability_broker import Snapshot, metric_reader  # noqa: F401 (the session's SDK reader)

pytestmark = pytest.mark.anyio

N = 10_000
FIRST = 100


def label_sets(reader: InMemoryMetricReader) -> dict[str, set[frozenset[tuple[str, object]]]]:
    """Attribute sets of each ``ojs_anyio.amqp`` instrument, as the SDK exports them."""
    points = Snapshot(reader).points
    return {name: {frozenset(p.attributes.items()) for p in found} for name, found in points.items()}


def published(reader: InMemoryMetricReader, label: str) -> float:
    return Snapshot(reader).value("ojs_amqp_messages_published_total", label)


async def test_ten_thousand_distinct_delays_add_no_label_values(
    broker_url: str,
    q: str,
    metric_reader: InMemoryMetricReader,  # noqa: F811 (the fixture imported above)
) -> None:
    # 10,000 persistent messages as fast as the client goes: on a loaded 2-core machine the
    # broker took more than the 5 s default confirm_timeout (a bound meant for a web
    # request's push) to confirm a batch of 500 (seen once in CI, trio-rabbitmq, with other
    # suites running beside it).  What is measured here is labels, not confirm latency.
    async with ojs.connect(broker_url, confirm_timeout=60) as client:
        await _push_ten_thousand(client, q, metric_reader)


async def _push_ten_thousand(client: ojs.Client, q: str, metric_reader: InMemoryMetricReader) -> None:  # noqa: F811
    def batch(start: int, stop: int) -> list[ojs.Job]:
        # 30 s + i ms: every job has its own delay, so its own delay-level routing key (and
        # none is due before it is pushed, even on a slow machine).  The messages expire
        # into the test queue's landing queue, deleted after the test.
        return [
            client.build("bounded.job", [i], queue=q, delay=timedelta(milliseconds=30_000 + i))
            for i in range(start, stop)
        ]

    with anyio.fail_after(300):
        await client.declare_queue(q)
        results = await client.push_batch(batch(0, FIRST))
        assert all(r.ok for r in results)
        before = label_sets(metric_reader)
        other_before = published(metric_reader, _metrics.OTHER)
        for start in range(FIRST, N, 500):  # built just before pushing: none is due yet
            results = await client.push_batch(batch(start, min(start + 500, N)))
            assert all(r.ok for r in results)
    after = label_sets(metric_reader)

    # The 9,900 later delays went through the SDK (counted under "other")...
    assert published(metric_reader, _metrics.OTHER) - other_before >= N - FIRST
    # ...and added no attribute set to any instrument.
    grown = {name: after[name] - before.get(name, set()) for name in after}
    assert all(not extra for extra in grown.values()), grown
    # No routing key of a delay level became a label value, and the tables stay small.
    values = {v for sets in after.values() for attrs in sets for _, v in attrs}
    assert not [v for v in values if isinstance(v, str) and v.endswith("." + q)]
    assert len(_metrics.stats.published) <= _metrics.MAX_QUEUE_LABELS + 1
