"""Per-subscription metrics of the event bus (OpenTelemetry).

=========================================  =========  ======================================
name                                       type       counts
=========================================  =========  ======================================
``ojs_events_handled_total``               counter    events handled (acked)
``ojs_events_failed_total``                counter    handler calls that failed (``error.type``)
``ojs_events_redelivered_total``           counter    events put back for another attempt
``ojs_events_dead_lettered_total``         counter    events dead-lettered (``ojs.event.reason``)
``messaging.process.duration``             histogram  handler duration, every finished call
=========================================  =========  ======================================

The duration histogram has OpenTelemetry's messaging name (unit ``s``), with
``messaging.operation.name`` ``process`` and, for a failed call, ``error.type``.

Attributes: ``messaging.system`` (``rabbitmq``) and ``messaging.destination.name`` (the
subscription's queue); one label set per subscription, plus the bounded reasons
(``invalid_payload``, ``rejected``, ``max_attempts``) and error types (the exception's
class name, folded into ``other`` past :data:`MAX_ERROR_TYPES`).
"""

from __future__ import annotations

from typing import Any, Final

from opentelemetry import metrics

from .._pipeline import duration_histogram

__all__ = ["SubscriptionMetrics"]

#: Distinct ``error.type`` values per subscription before the rest share ``"other"``.
MAX_ERROR_TYPES: Final = 50


class SubscriptionMetrics:
    """The instruments of one subscription (created when metrics are on)."""

    __slots__ = (
        "_attrs", "_dead", "_duration", "_error_types", "_failed", "_handled", "_process_attrs",
        "_redelivered",
    )  # fmt: skip

    def __init__(self, meter_provider: metrics.MeterProvider, queue: str) -> None:
        meter = meter_provider.get_meter("ojs_anyio.events", "0.1.0")
        counter = meter.create_counter
        self._handled = counter("ojs_events_handled_total", description="Events handled")
        self._failed = counter("ojs_events_failed_total", description="Handler calls that failed")
        self._redelivered = counter("ojs_events_redelivered_total", description="Events sent back")
        self._dead = counter("ojs_events_dead_lettered_total", description="Events dead-lettered")
        self._duration = duration_histogram(
            meter, "messaging.process.duration", "Event handler duration per call"
        )
        self._attrs: dict[str, Any] = {"messaging.system": "rabbitmq", "messaging.destination.name": queue}
        self._process_attrs: dict[str, Any] = {**self._attrs, "messaging.operation.name": "process"}
        self._error_types: set[str] = set()

    def finished(self, duration: float, error: BaseException | None) -> None:
        """A handler call ended after ``duration`` seconds (``error``: what it raised)."""
        if error is None:
            self._duration.record(duration, self._process_attrs)
            return
        kind = type(error).__name__
        if kind not in self._error_types:
            if len(self._error_types) >= MAX_ERROR_TYPES:
                kind = "other"
            else:
                self._error_types.add(kind)
        self._duration.record(duration, {**self._process_attrs, "error.type": kind})
        self._failed.add(1, {**self._attrs, "error.type": kind})

    def handled(self) -> None:
        self._handled.add(1, self._attrs)

    def redelivered(self) -> None:
        self._redelivered.add(1, self._attrs)

    def dead_lettered(self, reason: str) -> None:
        self._dead.add(1, {**self._attrs, "ojs.event.reason": reason})
