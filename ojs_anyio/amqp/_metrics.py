"""OpenTelemetry instruments of the AMQP layer (OJS AMQP binding §12.1), through opentelemetry-api only.

With no SDK installed the API hands out no-op instruments, so a counter ``add`` costs one
method call.  The hot path updates plain integers and the observable instruments read
them, so publishes and acks don't even pay for that.

The instruments are created by :func:`register`, which the first
:class:`~ojs_anyio.amqp.Connection` calls (importing this module creates nothing).

**Labels are bounded.**  The attribute ``queue`` is a name only for queues this process
declared or consumed from, and for the exact (wildcard-free) binding keys it bound such a
queue with; at most :data:`MAX_QUEUE_LABELS` of them, and never a broker-generated
``amq.*`` name (server-named queues, direct reply-to).  Anything else, such as the routing key of a
delay level or of a reply, counts under ``"other"``.
So a million scheduled jobs with a million different delays add one label value, not a
million.

What each instrument counts (attribute ``queue`` where it says "by queue"; ``docs/jobs.md``,
"Metrics reference", has the table):

* ``ojs_amqp_connections_active``: transports that completed the AMQP handshake and are
  not closed yet (a recovering connection counts 0 between transports).
* ``ojs_amqp_messages_published_total``: publishes, by routing key when it names a known
  queue (the default and direct exchanges), else ``"other"``.
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

The same tables also feed OpenTelemetry's messaging conventions (``messaging.client.*``,
semantic conventions 1.26 and later), so a dashboard built on those works unchanged:

* ``messaging.client.sent.messages``: counter, ``{message}``, the publishes above, with
  ``messaging.operation.name`` ``publish``;
* ``messaging.client.consumed.messages``: counter, ``{message}``, the deliveries and
  Basic.Get-Ok replies above, with ``messaging.operation.name`` ``deliver``;
* ``messaging.client.operation.duration``: histogram, ``s``, the same confirm-latency
  samples as above (a publish's ``send`` operation lasts until its confirm), with
  ``messaging.operation.name`` ``publish``.

Their attributes are ``messaging.system`` (``rabbitmq``) and ``messaging.destination.name``
(the bounded queue label above; left out for ``"other"``, which names no destination).
The handler's own time is ``messaging.process.duration``, recorded by the job and event
layers' metrics (``JobMetrics``, a subscription's metrics).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any, Final

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

__all__ = [
    "MAX_QUEUE_LABELS",
    "OTHER",
    "consumers",
    "instruments",
    "label",
    "record_confirm_latency",
    "semconv_attributes",
    "register",
    "stats",
    "timing_enabled",
    "track_queue",
]

#: At most this many queue names are used as label values; later ones count as OTHER.
MAX_QUEUE_LABELS = 1000
#: The label value of everything that is not a known queue.
OTHER = "other"
#: Queue names usable as label values (see the module docstring).
queues: set[str] = set()


def track_queue(name: str) -> None:
    """Make ``name`` a label value: a queue declared or consumed, or an exact binding
    key of such a queue.

    Broker-generated names (``amq.gen-…``, ``amq.rabbitmq.reply-to``) are never tracked,
    nor more than :data:`MAX_QUEUE_LABELS` names."""
    if name and name not in queues and len(queues) < MAX_QUEUE_LABELS and not name.startswith("amq."):
        queues.add(name)


def label(name: str) -> str:
    """The label value for a queue name or routing key: itself if tracked, else OTHER."""
    return name if name in queues else OTHER


class _Stats:
    """Process-wide counters, keyed by queue label (see :func:`label`)."""

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
            for queue, n, _prefetch in source.metrics_unacked():
                table[queue] = table.get(queue, 0) + n  # 0 too: a live consumer's queue
        return table

    @property
    def utilization(self) -> dict[str, float]:
        """By queue: unsettled deliveries / prefetch over the open consumers with a prefetch."""
        held: dict[str, int] = {}
        window: dict[str, int] = {}
        for source in list(consumers):
            for queue, n, prefetch in source.metrics_unacked():
                if prefetch:
                    held[queue] = held.get(queue, 0) + n
                    window[queue] = window.get(queue, 0) + prefetch
        return {q: min(1.0, held[q] / window[q]) for q in window}


stats = _Stats()

#: Live consumers (and channels holding Basic.Get deliveries): anything with a
#: ``metrics_unacked()`` returning ``[(queue, unsettled, prefetch or 0), ...]``.  Read only
#: when a metric reader collects.
consumers: weakref.WeakSet[Any] = weakref.WeakSet()


def _gauge(value_of: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(getattr(stats, value_of))]

    return callback


def semconv_attributes(operation: str, queue: str) -> dict[str, str]:
    """The attributes of a ``messaging.client.*`` point for a queue label."""
    attrs = {"messaging.system": "rabbitmq", "messaging.operation.name": operation}
    if queue != OTHER:
        attrs["messaging.destination.name"] = queue
    return attrs


def _semconv(name: str, operation: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        table: dict[str, int] = getattr(stats, name)
        return [Observation(v, semconv_attributes(operation, q)) for q, v in list(table.items())]

    return callback


def _by_queue(name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        table: dict[str, int] | dict[str, float] = getattr(stats, name)
        return [Observation(v, {"queue": q}) for q, v in list(table.items())]

    return callback


_RECONNECTIONS: Final = "ojs_amqp_reconnections_total"
_CONFIRM_LATENCY: Final = "ojs_amqp_publish_confirm_latency_seconds"
_OPERATION_DURATION: Final = "messaging.client.operation.duration"


class _Instruments:
    """The synchronous instruments used on rare paths: no-ops until :func:`register`."""

    __slots__ = ("confirm_latency", "operation_duration", "reconnections", "registered", "timing")

    def __init__(self) -> None:
        self.registered = False
        #: Whether an SDK MeterProvider was found (see :func:`timing_enabled`).
        self.timing = False
        self.reconnections: metrics.Counter = metrics.NoOpCounter(_RECONNECTIONS)
        self.confirm_latency: metrics.Histogram = metrics.NoOpHistogram(_CONFIRM_LATENCY)
        self.operation_duration: metrics.Histogram = metrics.NoOpHistogram(_OPERATION_DURATION)


instruments: Final = _Instruments()


def register() -> None:
    """Create the instruments on the global MeterProvider's ``ojs_anyio.amqp`` meter.

    Idempotent; the first :class:`~ojs_anyio.amqp.Connection` calls it.  Until a
    MeterProvider is installed the API proxies the instruments, so installing one later
    still works.
    """
    if instruments.registered:
        return
    instruments.registered = True
    meter = metrics.get_meter("ojs_anyio.amqp", "0.1.0")
    for name, callback, unit, desc in (
        ("ojs_amqp_connections_active", _gauge("connections_active"), "", "Active AMQP connections"),
        ("ojs_amqp_channels_active", _gauge("channels_active"), "", "Active AMQP channels"),
        ("ojs_amqp_messages_unacked", _by_queue("unacked"), "", "Unacknowledged deliveries, by queue"),
        (
            "ojs_amqp_consumer_utilization",
            _by_queue("utilization"),
            "1",
            "Unsettled deliveries / prefetch window of the queue's consumers (0.0-1.0), by queue",
        ),
    ):
        meter.create_observable_gauge(name, [callback], unit=unit, description=desc)
    for name, attr, desc in (
        ("ojs_amqp_messages_published_total", "published", "Messages published, by queue"),
        ("ojs_amqp_messages_consumed_total", "consumed", "Messages consumed, by queue"),
        ("ojs_amqp_messages_acked_total", "acked", "Messages acknowledged, by queue"),
        ("ojs_amqp_messages_nacked_total", "nacked", "Messages negatively acknowledged, by queue"),
        ("ojs_amqp_messages_returned_total", "returned", "Messages returned by the broker (Basic.Return)"),
    ):
        meter.create_observable_counter(name, [_by_queue(attr)], description=desc)
    instruments.reconnections = meter.create_counter(_RECONNECTIONS, description="Reconnection attempts")
    instruments.confirm_latency = meter.create_histogram(
        _CONFIRM_LATENCY,
        unit="s",
        description="Publisher confirm latency (sampled: oldest publish of a Basic.Ack frame), by queue",
    )
    for name, table, operation, desc in (
        ("messaging.client.sent.messages", "published", "publish", "Messages published"),
        ("messaging.client.consumed.messages", "consumed", "deliver", "Messages delivered to the app"),
    ):
        callbacks = [_semconv(table, operation)]
        meter.create_observable_counter(name, callbacks, unit="{message}", description=desc)
    instruments.operation_duration = meter.create_histogram(
        _OPERATION_DURATION,
        unit="s",
        description="Duration of a publish until its confirm (sampled as the confirm latency is)",
    )


def record_confirm_latency(latency: float, routing_key: str) -> None:
    """One confirm-latency sample (see the module docstring), under both names."""
    queue = label(routing_key)
    instruments.confirm_latency.record(latency, {"queue": queue})
    instruments.operation_duration.record(latency, semconv_attributes("publish", queue))


def timing_enabled() -> bool:
    """Whether the OpenTelemetry SDK's MeterProvider is installed, so confirm latency is
    worth timing.

    The API's global provider is a proxy until ``metrics.set_meter_provider`` (which may
    happen once); a channel asks when it opens, and the answer is cached once true.
    """
    if not instruments.timing:
        try:
            from opentelemetry.sdk.metrics import MeterProvider as SDKMeterProvider
        except ImportError:  # no SDK: nothing would record the samples
            return False
        instruments.timing = isinstance(metrics.get_meter_provider(), SDKMeterProvider)
    return instruments.timing


def bump(table: dict[str, int], key: str, n: int = 1) -> None:
    table[key] = table.get(key, 0) + n
