"""The CLI's pure pieces: durations, redaction, JSON logs, dead-letter helpers (no broker)."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime, timedelta

import pytest

from ojs_anyio import amqp
from ojs_anyio._cli._common import EXIT_USAGE, CLIError, JSONFormatter, parse_duration, redact
from ojs_anyio.jobs import death_reason, died_at, requeue_properties
from ojs_codec import Int32


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30", 30), ("2.5", 2.5), ("500ms", 0.5), ("30s", 30), ("5m", 300), ("2h", 7200), ("7d", 604800),
     ("PT30S", 30), ("P180D", 180 * 86400), ("pt1m", 60)],
)  # fmt: skip
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, "--x") == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["soon", "-5s", "5 minutes", "P1Y", "PT"])
def test_bad_durations_are_usage_errors(text: str) -> None:
    with pytest.raises(CLIError) as info:
        parse_duration(text, "--delay")
    assert info.value.code == EXIT_USAGE and "--delay" in str(info.value)


def test_redact_hides_the_password() -> None:
    url = "amqp://app:hunter22@broker:5672/prod"
    text = redact(f"failed at {url}; password hunter22", url)
    assert "hunter22" not in text and "app:***@" in text
    bad = "amqp://app:hunter22@broker:notaport/"
    assert "hunter22" not in redact(f"bad URL {bad}", bad)


def test_json_log_lines_carry_extras_and_tracebacks() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.getLogger("t").makeRecord(
            "t", logging.ERROR, "f.py", 1, "job %s failed", ("j1",), sys.exc_info(), extra={"job_id": "j1"}
        )
    line = json.loads(JSONFormatter().format(record))
    assert line["message"] == "job j1 failed" and line["level"] == "ERROR" and line["job_id"] == "j1"
    assert "ValueError: boom" in line["traceback"]


def _dead(headers: dict[str, object], **props: object) -> amqp.BasicProperties:
    return amqp.BasicProperties(message_id="j1", type="t", headers=headers, **props)  # type: ignore[arg-type]


def test_requeue_properties_strip_the_death_and_keep_or_reset_the_attempt() -> None:
    died = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    props = _dead(
        {
            "x-ojs-attempt": 3, "x-ojs-max-attempts": 3, "x-ojs-error-code": "HANDLER_ERROR",
            "x-death": [{"reason": "rejected", "time": died}], "x-first-death-reason": "rejected",
            "keep": "me",
        },
        priority=9,
    )  # fmt: skip
    kept = requeue_properties(props, reset_attempts=False)
    headers = kept.headers or {}
    assert headers["x-ojs-attempt"] == Int32(3), "int32 on the wire, as every message we write"
    assert isinstance(headers["x-ojs-max-attempts"], Int32)
    assert (
        "x-death" not in headers
        and "x-first-death-reason" not in headers
        and "x-ojs-error-code" not in headers
    )
    assert headers["keep"] == "me" and kept.message_id == "j1" and kept.priority == 9
    assert (requeue_properties(props).headers or {})["x-ojs-attempt"] == Int32(1)
    assert died_at(props) == died
    assert death_reason(props) == "HANDLER_ERROR"


def test_death_time_and_reason_fallbacks() -> None:
    stamp = datetime(2026, 1, 1, tzinfo=UTC)
    props = _dead({"x-death": [{"reason": "expired"}]}, timestamp=stamp)
    assert died_at(props) == stamp and death_reason(props) == "expired"
    marked = _dead({"x-ojs-dead-lettered-at": "2026-02-01T00:00:00.000Z"})
    assert died_at(marked) == datetime(2026, 2, 1, tzinfo=UTC)
    assert died_at(_dead({})) is None and death_reason(_dead({})) == "-"
    # An annotated copy is published by the worker; the x-death it carries is an earlier
    # hop's (here a retry queue's expiry), so the worker's stamp is when it died.
    retried = _dead(
        {
            "x-ojs-dead-lettered-at": "2026-02-01T00:00:00.000Z",
            "x-death": [{"reason": "expired", "time": datetime(2026, 1, 31, tzinfo=UTC)}],
        }
    )
    assert died_at(retried) == datetime(2026, 2, 1, tzinfo=UTC)


def test_an_unusable_death_time_is_unknown_or_the_brokers() -> None:
    """A death stamp that does not parse, that a datetime cannot hold (the leap second takes
    9999-12-31T23:59:60Z into year 10000) or that is in the future is not a death time: the
    x-death time is used instead, and without one the time is unknown, never the (older)
    creation time, so prune cannot drop the job for an age it does not have."""
    now = datetime(2026, 3, 1, tzinfo=UTC)
    created = datetime(2020, 1, 1, tzinfo=UTC)
    broker = datetime(2026, 2, 1, tzinfo=UTC)
    for stamp in ("9999-12-31T23:59:60Z", "9999-12-31T23:59:59Z", "0001-01-01T00:00:00+14:00", "soon", 42):
        alone = _dead({"x-ojs-dead-lettered-at": stamp}, timestamp=created)
        assert died_at(alone, now=now) is None, stamp
        with_broker = _dead(
            {"x-ojs-dead-lettered-at": stamp, "x-death": [{"reason": "expired", "time": broker}]},
            timestamp=created,
        )
        assert died_at(with_broker, now=now) == broker, stamp
    # A few minutes ahead is clock skew between hosts, not an error; an offset becomes UTC.
    skewed = _dead({"x-ojs-dead-lettered-at": "2026-03-01T00:04:00Z"})
    assert died_at(skewed, now=now) == datetime(2026, 3, 1, 0, 4, tzinfo=UTC)
    offset = died_at(_dead({"x-ojs-dead-lettered-at": "2026-02-01T02:00:00+02:00"}), now=now)
    assert offset == datetime(2026, 2, 1, tzinfo=UTC) and offset.tzinfo is UTC
    # Without our stamp: a future x-death time is skipped for the creation time.
    future_broker = _dead(
        {"x-death": [{"reason": "expired", "time": datetime(2027, 1, 1)}]}, timestamp=created
    )
    assert died_at(future_broker, now=now) == created
