"""Trace propagation without an SDK: no spans are made, but a valid incoming context still
travels in the x-ojs-* headers (pure, no broker)."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

import ojs_anyio as ojs
from ojs_anyio.jobs import _tracing

#: Pure test module: runs under ``pytest -m "not broker"`` (see tests/conftest.py).

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
SPAN_ID = 0x00F067AA0BA902B7


def test_without_sdk_no_span_is_made_and_no_header_without_context() -> None:
    assert not _tracing._recording()
    job = ojs.new_job("a.b", [])
    with _tracing.producer_span(job, "ojs.exchange.direct") as span:
        assert span is trace.INVALID_SPAN
        assert _tracing.inject_headers() == {}


def test_without_sdk_a_valid_remote_parent_still_propagates() -> None:
    remote = SpanContext(TRACE_ID, SPAN_ID, is_remote=True, trace_flags=TraceFlags(1))
    with trace.use_span(NonRecordingSpan(remote)):
        headers = _tracing.inject_headers()
    expected = f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01"
    assert headers["x-ojs-trace-id"] == expected
    assert headers["x-ojs-traceparent"] == expected
    ctx = _tracing.extract_context(headers)
    assert trace.get_current_span(ctx).get_span_context().trace_id == TRACE_ID
