"""The library's one id generator (``ojs_anyio._common.new_id``), against ``uuid6``.

Job ids and event message ids come from it.  It is not ``uuid6.uuid7()`` itself (that costs
about 9x more on the push path, see ``_common``), so it is held to uuid6's format and
ordering here: same version, variant and millisecond time field, and ids from both sort in
creation order across milliseconds.  Also the single-error unwrapping both layers use, and
the one whole-second datetime both layers stamp their messages with.
"""

from __future__ import annotations

import re
import time
import uuid
from datetime import UTC, datetime

import anyio
import msgspec
import pytest
import uuid6

from ojs_anyio import amqp, events
from ojs_anyio._common import new_id, single_error, utc_second
from ojs_anyio.jobs import Job, format_timestamp, new_job
from ojs_anyio.jobs._route import Route
from ojs_anyio.jobs._wire import job_message

UUID7_TEXT = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def test_ids_are_uuid7_text_as_uuid6_writes_it() -> None:
    ours, theirs = new_id(), str(uuid6.uuid7())
    assert UUID7_TEXT.match(ours) and UUID7_TEXT.match(theirs)
    parsed, reference = uuid.UUID(ours), uuid.UUID(theirs)
    assert (parsed.version, parsed.variant) == (reference.version, reference.variant) == (7, uuid.RFC_4122)
    assert str(parsed) == ours
    assert abs((parsed.int >> 80) - (reference.int >> 80)) < 1000  # the same millisecond clock


def test_ids_sort_in_creation_order_with_uuid6s_across_milliseconds() -> None:
    created: list[str] = []
    for _ in range(5):
        created += [new_id() for _ in range(200)]
        time.sleep(0.002)  # ordering across milliseconds is the property under test
        created.append(str(uuid6.uuid7()))
        time.sleep(0.002)
    assert created == sorted(created)
    assert len(set(created)) == len(created)


def test_job_and_event_ids_come_from_the_one_generator() -> None:
    assert events.new_message_id is new_id
    before, job, after = new_id(), new_job("t", []), new_id()
    assert before < job.id < after


def test_one_datetime_per_second_for_jobs_and_events() -> None:
    second = int(time.time())
    assert utc_second(second) == datetime.fromtimestamp(second, UTC)
    assert utc_second(second) is utc_second(second)  # one object for the second
    assert utc_second(second - 3) == datetime.fromtimestamp(second - 3, UTC)
    stamp = events._wire.now_timestamp()
    assert stamp.tzinfo is UTC and stamp.microsecond == 0


def test_a_jobs_amqp_timestamp_is_its_created_at_second() -> None:
    """The ``timestamp`` is the second of ``created_at``, in any offset, not the push's
    (001 §6.1); jobs created in the same second share one datetime."""
    now = datetime(2026, 11, 28, 15, 30, 59, 999_000, UTC)
    made = [
        msgspec.structs.replace(new_job("t", []), created_at=f"2026-11-28T15:30:58.{ms:03d}Z")
        for ms in (1, 998)
    ]
    stamp = format_timestamp(now)

    def properties(job: Job) -> amqp.BasicProperties:
        due_now = Route("ojs.exchange.direct", job.queue, {}, ())
        message = job_message(
            job, due_now, enqueued_at=stamp, idempotency_key=None, reply_to=None, trace_headers=None
        )
        return message[0]

    stamps = [properties(job).timestamp for job in made]
    assert stamps[0] == datetime(2026, 11, 28, 15, 30, 58, tzinfo=UTC)
    assert stamps[0] is stamps[1]
    given = msgspec.structs.replace(new_job("t", []), created_at="2020-01-02T03:04:05.678+02:00")
    props = properties(given)
    assert props.timestamp == datetime(2020, 1, 2, 1, 4, 5, tzinfo=UTC)
    assert (props.headers or {})["x-ojs-created-at"] == "2020-01-02T03:04:05.678+02:00"


@pytest.mark.anyio
async def test_single_error_unwraps_groups_and_skips_cancellations() -> None:
    boom = KeyError("boom")
    caught: list[BaseException] = []
    with anyio.CancelScope() as scope:  # a real cancellation exception (Trio's has no constructor)
        scope.cancel()
        try:
            await anyio.sleep(1)
        except anyio.get_cancelled_exc_class() as exc:
            caught.append(exc)
            raise
    [cancelled] = caught
    group = BaseExceptionGroup("g", [cancelled, BaseExceptionGroup("inner", [boom])])
    assert single_error(group) is boom
    assert single_error(BaseExceptionGroup("g", [boom, ValueError("other")])) is None
    assert single_error(BaseExceptionGroup("g", [cancelled])) is None
