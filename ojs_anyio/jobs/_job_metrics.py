"""Per-job-type metrics (OpenTelemetry), as a :class:`Middleware`.

Instruments (names in the style of the OJS AMQP binding's metrics, §12.1; attributes from
OpenTelemetry's messaging conventions):

=====================================  =========  ==========================================
name                                   type       counts
=====================================  =========  ==========================================
``ojs_jobs_started_total``             counter    handler calls started
``ojs_jobs_completed_total``           counter    attempts that completed (acked)
``ojs_jobs_failed_total``              counter    attempts that failed (``error.type`` says how)
``ojs_jobs_retried_total``             counter    attempts scheduled for a retry
``ojs_jobs_dead_lettered_total``       counter    jobs dead-lettered (any reason)
``ojs_jobs_cancelled_total``           counter    jobs cancelled by a CANCEL
``messaging.process.duration``        histogram  handler duration, every finished attempt
=====================================  =========  ==========================================

The duration histogram has OpenTelemetry's messaging name (``messaging.process.duration``,
unit ``s``; a Prometheus exporter shows it as ``messaging_process_duration_seconds``), with
``messaging.operation.name`` ``process`` and, for a failed attempt, ``error.type``.

Attributes: ``messaging.system`` (``rabbitmq``), ``messaging.destination.name`` (the OJS
queue) and ``ojs.job.type``; the failure counters add ``error.type`` (the OJS error code).
Label sets are bounded: queues are the worker's own, job types the registered ones
(anything else is ``ojs.job.type="unregistered"``), and past ``max_label_sets`` distinct
(queue, type) pairs the rest share ``"other"``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opentelemetry import metrics

from .._pipeline import duration_histogram
from ._middleware import HandlerNext, Middleware

if TYPE_CHECKING:
    from ._context import JobContext, JobOutcome

__all__ = ["JobMetrics"]

_UNREGISTERED = "unregistered"
_OTHER = "other"


class JobMetrics(Middleware):
    """Counts and times jobs per queue and job type.  ``meter_provider`` defaults to the
    global one; instruments are created here, not at import."""

    def __init__(
        self, meter_provider: metrics.MeterProvider | None = None, *, max_label_sets: int = 1000
    ) -> None:
        provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
        meter = provider.get_meter("ojs_anyio.jobs", "0.1.0")
        self._started = meter.create_counter("ojs_jobs_started_total", description="Handler calls started")
        self._completed = meter.create_counter("ojs_jobs_completed_total", description="Attempts completed")
        self._failed = meter.create_counter("ojs_jobs_failed_total", description="Attempts that failed")
        self._retried = meter.create_counter("ojs_jobs_retried_total", description="Attempts retried")
        self._dead = meter.create_counter("ojs_jobs_dead_lettered_total", description="Jobs dead-lettered")
        self._cancelled = meter.create_counter("ojs_jobs_cancelled_total", description="Jobs cancelled")
        self._duration = _duration_histogram(meter)
        self.max_label_sets = max_label_sets
        self.registered: frozenset[str] | None = None  # set by the worker: its job types
        self._attrs: dict[tuple[str, str], dict[str, Any]] = {}
        #: The duration's attributes, by the counters' attribute dict (same label sets).
        self._process_attrs: dict[int, dict[str, Any]] = {}

    def _attributes(self, queue: str, job_type: str | None) -> dict[str, Any]:
        registered = self.registered
        if job_type is None or (registered is not None and job_type not in registered):
            job_type = _UNREGISTERED
        key = (queue, job_type)
        attrs = self._attrs.get(key)
        if attrs is None:
            if len(self._attrs) >= self.max_label_sets:
                key = (_OTHER, _OTHER)
                attrs = self._attrs.get(key)
            if attrs is None:
                attrs = {
                    "messaging.system": "rabbitmq",
                    "messaging.destination.name": key[0],
                    "ojs.job.type": key[1],
                }
                self._attrs[key] = attrs
        return attrs

    async def around_handler(self, ctx: JobContext, call_next: HandlerNext) -> Any:
        self._started.add(1, self._attributes(ctx.queue, ctx.job.type))
        return await call_next()

    def on_outcome(self, outcome: JobOutcome) -> None:
        attrs = self._attributes(outcome.queue, outcome.type)
        kind = outcome.outcome
        if kind == "completed":
            self._completed.add(1, attrs)
        elif kind in ("retried", "dead_lettered"):
            if outcome.error_code is not None:
                self._failed.add(1, {**attrs, "error.type": outcome.error_code})
            (self._retried if kind == "retried" else self._dead).add(1, attrs)
        elif kind == "cancelled":
            self._cancelled.add(1, attrs)
        if outcome.duration > 0.0:
            process = self._process_attrs.get(id(attrs))
            if process is None:
                process = self._process_attrs[id(attrs)] = {**attrs, "messaging.operation.name": "process"}
            if kind != "completed" and outcome.error_code is not None:
                process = {**process, "error.type": outcome.error_code}
            self._duration.record(outcome.duration, process)


def _duration_histogram(meter: metrics.Meter) -> metrics.Histogram:
    return duration_histogram(meter, "messaging.process.duration", "Job handler duration per attempt")
