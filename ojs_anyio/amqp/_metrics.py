"""OpenTelemetry instruments of the AMQP layer (001 §12.1), through opentelemetry-api only.

With no SDK installed the API hands out no-op instruments, so a counter ``add`` costs one
method call.  The hot path updates plain integers and the observable instruments read
them, so publishes and acks don't even pay for that.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

__all__ = ["meter", "reconnections", "stats"]

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
        self.unacked: dict[str, int] = {}


stats = _Stats()


def _gauge(value_of: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(getattr(stats, value_of))]

    return callback


def _by_queue(name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        table: dict[str, int] = getattr(stats, name)
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
reconnections = meter.create_counter("ojs_amqp_reconnections_total", description="Reconnection attempts")
confirm_latency = meter.create_histogram(
    "ojs_amqp_publish_confirm_latency_seconds", unit="s", description="Publisher confirm latency"
)


def bump(table: dict[str, int], key: str, n: int = 1) -> None:
    table[key] = table.get(key, 0) + n
