"""OpenTelemetry instruments of the AMQP layer (001 §12.1), through opentelemetry-api only.

With no SDK installed the API hands out no-op instruments, so a counter ``add`` costs one
method call.  The hot path updates plain integers and the observable instruments read
them, so publishes and acks don't even pay for that.

What each instrument counts (attribute ``queue`` where it says "by queue"; ``docs/jobs.md``,
"Metrics reference", has the table):

* ``ojs_amqp_connections_active``: transports that completed the AMQP handshake and are
  not closed yet (a recovering connection counts 0 between transports).
* ``ojs_amqp_messages_published_total``: publishes, by routing key (the queue, for the
  default and direct exchanges).
* ``ojs_amqp_messages_consumed_total``: deliveries handed to a consumer (its queue) and
  Basic.Get-Ok replies (the queue given to ``get``).
* ``ojs_amqp_messages_acked_total`` / ``_nacked_total``: Basic.Ack / Basic.Nack +
  Basic.Reject sent for those deliveries, by the same queue (``multiple=True`` counts 1);
  deliveries a cancelled consumer buffered but never handed out are rejected back to the
  queue and count as nacked.
* ``ojs_amqp_messages_unacked``: deliveries currently held unsettled, by queue (read at
  collection time from the live consumers and channels: nothing on the hot path).
* ``ojs_amqp_consumer_utilization``: by queue, unsettled deliveries / prefetch window,
  summed over the queue's open consumers that have a prefetch (0.0-1.0).  1.0 means every
  prefetch slot is taken (a worker with ``prefetch == concurrency`` has all its handlers
  busy); a consumer that sits below 1.0 could take more work.  An instantaneous value at
  each collection.
* ``ojs_amqp_publish_confirm_latency_seconds``: sampled.  On a Basic.Ack frame, the
  latency of the oldest publish it confirms, from being queued for the socket to the ack;
  at most one sample per channel per millisecond.  At low rates that is every publish;
  under load a frame confirms many publishes and the sample is the slowest of them.  An
  SDK histogram record costs microseconds, too much to pay per publish.  Timed only on
  channels opened while an SDK MeterProvider is installed (:func:`timing_enabled`);
  without the SDK a publish pays one attribute test.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

__all__ = ["confirm_latency", "consumers", "meter", "reconnections", "stats", "timing_enabled"]

meter = metrics.get_meter("ojs_anyio.amqp", "0.1.0")


class _Stats:
    """Process-wide counters, keyed by queue (or exchange/routing key for publishes)."""

    def __init__(self) -> None:
        self.connections_active = 0
        self.channels_active = 0
        self.published: dict[str, int] = {}
        self.consumed: dict[str, int] = {}
        self.acked: dict[str, int] = {}
        self.nacked: dict[str, int] = {}
        self.returned: dict[str, int] = {}

    @property
    def unacked(self) -> dict[str, int]:
        """Deliveries held unsettled right now, by queue (consumers and Basic.Get)."""
        table: dict[str, int] = {}
        for source in list(consumers):
            for queue, n, _prefetch in source._metrics_unacked():
                table[queue] = table.get(queue, 0) + n  # 0 too: a live consumer's queue
        return table

    @property
    def utilization(self) -> dict[str, float]:
        """By queue: unsettled deliveries / prefetch over the open consumers with a prefetch."""
        held: dict[str, int] = {}
        window: dict[str, int] = {}
        for source in list(consumers):
            for queue, n, prefetch in source._metrics_unacked():
                if prefetch:
                    held[queue] = held.get(queue, 0) + n
                    window[queue] = window.get(queue, 0) + prefetch
        return {q: min(1.0, held[q] / window[q]) for q in window}


stats = _Stats()

#: Live consumers (and channels holding Basic.Get deliveries): anything with a
#: ``_metrics_unacked()`` returning ``[(queue, unsettled, prefetch or 0), ...]``.  Read only
#: when a metric reader collects.
consumers: weakref.WeakSet[Any] = weakref.WeakSet()


def _gauge(value_of: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(getattr(stats, value_of))]

    return callback


def _by_queue(name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        table: dict[str, int] | dict[str, float] = getattr(stats, name)
        return [Observation(v, {"queue": q}) for q, v in list(table.items())]

    return callback


meter.create_observable_gauge(
    "ojs_amqp_connections_active",
    [_gauge("connections_active")],
    description="Active AMQP connections",
)
meter.create_observable_gauge(
    "ojs_amqp_channels_active",
    [_gauge("channels_active")],
    description="Active AMQP channels",
)
for _name, _attr, _desc in (
    ("ojs_amqp_messages_published_total", "published", "Messages published, by queue"),
    ("ojs_amqp_messages_consumed_total", "consumed", "Messages consumed, by queue"),
    ("ojs_amqp_messages_acked_total", "acked", "Messages acknowledged, by queue"),
    ("ojs_amqp_messages_nacked_total", "nacked", "Messages negatively acknowledged, by queue"),
    ("ojs_amqp_messages_returned_total", "returned", "Messages returned by the broker (Basic.Return)"),
):
    meter.create_observable_counter(_name, [_by_queue(_attr)], description=_desc)
meter.create_observable_gauge(
    "ojs_amqp_messages_unacked",
    [_by_queue("unacked")],
    description="Unacknowledged deliveries, by queue",
)
meter.create_observable_gauge(
    "ojs_amqp_consumer_utilization",
    [_by_queue("utilization")],
    unit="1",
    description="Unsettled deliveries / prefetch window of the queue's consumers (0.0-1.0), by queue",
)
reconnections = meter.create_counter("ojs_amqp_reconnections_total", description="Reconnection attempts")
confirm_latency = meter.create_histogram(
    "ojs_amqp_publish_confirm_latency_seconds",
    unit="s",
    description="Publisher confirm latency (sampled: oldest publish of a Basic.Ack frame), by queue",
)

_timing = False


def timing_enabled() -> bool:
    """Whether an SDK MeterProvider is installed, so confirm latency is worth timing.

    The API's global provider is a proxy until ``metrics.set_meter_provider`` (which may
    happen once); a channel asks when it opens, and the answer is cached once true.
    """
    global _timing
    if not _timing:
        provider = metrics.get_meter_provider()
        _timing = not isinstance(provider, metrics.NoOpMeterProvider) and type(provider).__name__ not in (
            "_ProxyMeterProvider",
            "NoOpMeterProvider",
        )
    return _timing


def bump(table: dict[str, int], key: str, n: int = 1) -> None:
    table[key] = table.get(key, 0) + n
