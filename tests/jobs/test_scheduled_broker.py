"""Scheduled jobs on the real broker (001 §9, DECISIONS 5): the binary delay levels'
accuracy and order, ``delay=``, past and out-of-range times, the headers, and the
delayed-message-exchange plugin option (detected, not assumed; our broker lacks it).
"""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime, timedelta

import anyio
import pytest

import ojs_anyio as ojs
from ojs_anyio import amqp
from ojs_anyio.amqp import _metrics
from ojs_anyio.jobs._client import Client
from ojs_anyio.jobs._envelope import format_timestamp, parse_timestamp
from ojs_anyio.jobs._route import route
from ojs_anyio.jobs._topology import MAX_DELAY_MS
from ojs_anyio.jobs._wire import job_message

from .broker_support import WAIT, Outcomes, current_url, running

pytestmark = pytest.mark.anyio


async def consume_one(conn: amqp.Connection, queue: str) -> amqp.IncomingMessage:
    with anyio.fail_after(WAIT):
        async with conn.channel(confirms=False) as ch, ch.consume(queue, prefetch=1) as messages:
            msg = await messages.__anext__()
            await msg.ack()
    return msg


def ms(delta: timedelta) -> float:
    return delta.total_seconds() * 1000


# ---------------------------------------------------------------- accuracy and order


async def test_random_delays_none_early_and_late_within_bounds(client: ojs.Client, q: str) -> None:
    """30 jobs with random delays of 0-3 s, through many combinations of levels: none runs
    before its scheduled_at (the hard guarantee), the median is late by less than 100 ms and
    none by a second.  Arrival order follows from these bounds: jobs scheduled further apart
    than the worst lateness arrive in scheduled order.

    (Typical lateness here is 8-20 ms; on a loaded machine single deliveries have reached
    the consumer up to ~500 ms late, which is why the bound on the worst is loose.)"""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    worker = ojs.Worker(queues=[q], concurrency=30)
    outcomes = Outcomes(worker)
    arrivals: dict[str, datetime] = {}

    @worker.handler("timed.job")
    async def handler(ctx: ojs.JobContext) -> None:
        arrivals[ctx.id] = datetime.now(UTC)

    with anyio.fail_after(WAIT):
        await client.declare_delay_levels()  # so that every job's wait is spent in the levels
    async with running(worker, client):
        jobs = []
        with anyio.fail_after(WAIT):
            for _ in range(30):
                delay = timedelta(milliseconds=rng.randrange(0, 3000))
                jobs.append(await client.push("timed.job", [], queue=q, delay=delay))
        await outcomes.wait_for(lambda o: o.outcome == "completed", count=30, timeout=WAIT)

    scheduled = {j.id: parse_timestamp(j.scheduled_at) for j in jobs if isinstance(j.scheduled_at, str)}
    assert len(scheduled) == 30
    lateness = sorted(ms(arrivals[i] - scheduled[i]) for i in scheduled)
    assert lateness[0] >= 0, f"a job ran {-lateness[0]:.1f} ms early (seed {seed})"
    assert lateness[15] < 100, f"median lateness {lateness[15]:.1f} ms (seed {seed}): {lateness}"
    assert lateness[-1] < 1000, f"worst lateness {lateness[-1]:.1f} ms (seed {seed}): {lateness}"


async def test_delay_timedelta_and_header(client: ojs.Client, raw: amqp.Connection, q: str) -> None:
    """``delay=timedelta(...)``: the job arrives in ojs.queue.{q} (routing key q, through
    the levels: x-death names them) no earlier than scheduled_at, which is in the
    x-ojs-scheduled-at header."""
    with anyio.fail_after(WAIT):
        await client.declare_delay_levels()
    t0 = datetime.now(UTC)
    with anyio.fail_after(WAIT):
        job = await client.push("later.job", [1], queue=q, delay=timedelta(milliseconds=700))
    msg = await consume_one(raw, client.names.job_queue(q))
    arrived = datetime.now(UTC)
    assert isinstance(job.scheduled_at, str)
    due = parse_timestamp(job.scheduled_at)
    assert 695 <= ms(due - t0) <= 800
    assert arrived >= due
    assert ms(arrived - due) < 250
    h = msg.properties.headers or {}
    assert h["x-ojs-scheduled-at"] == job.scheduled_at
    assert msg.routing_key == q and msg.exchange == client.names.direct_exchange
    queues = {d["queue"] for d in h["x-death"]}
    # 700 = 0b1010111100: levels 9, 7, 5, 4, 3, 2 (the bits of the delay, give or take the
    # milliseconds spent before publishing), and the landing queue.
    assert client.names.delay_landing_queue(q) in queues
    assert any(name.startswith("ojs.queue.delay.0") for name in queues)
    assert ojs.decode_job(msg.body).id == job.id


async def test_delay_as_seconds_float(client: ojs.Client, raw: amqp.Connection, q: str) -> None:
    """``delay=0.3`` (seconds) works like a timedelta."""
    with anyio.fail_after(WAIT):
        job = await client.push("later.job", [], queue=q, delay=0.3)
    msg = await consume_one(raw, client.names.job_queue(q))
    assert isinstance(job.scheduled_at, str)
    assert datetime.now(UTC) >= parse_timestamp(job.scheduled_at)
    assert ojs.decode_job(msg.body).id == job.id


async def test_past_scheduled_at_goes_straight_to_the_queue(
    client: ojs.Client, raw: amqp.Connection, q: str
) -> None:
    """A scheduled_at in the past: published to ojs.exchange.direct (no delay level, no
    x-death), available at once; the header still says when it was due."""
    past = datetime.now(UTC) - timedelta(hours=1)
    with anyio.fail_after(WAIT):
        job = await client.push("overdue.job", [], queue=q, scheduled_at=past)
        t0 = time.monotonic()
        async with raw.channel(confirms=False) as ch:
            msg = await ch.get(client.names.job_queue(q))
            assert msg is not None
            await msg.ack()
    assert time.monotonic() - t0 < 1.0
    h = msg.properties.headers or {}
    assert msg.exchange == client.names.direct_exchange and msg.routing_key == q
    assert "x-death" not in h
    assert h["x-ojs-scheduled-at"] == job.scheduled_at


async def test_beyond_range_raises_and_publishes_nothing(
    client: ojs.Client, raw: amqp.Connection, q: str
) -> None:
    """A scheduled_at more than 2**32-1 ms ahead raises ojs.DelayOutOfRangeError (a
    ValueError) saying what the limit is; nothing is published."""
    await client.declare_queue(q)
    published = sum(_metrics.stats.published.values())
    too_far = datetime.now(UTC) + timedelta(milliseconds=MAX_DELAY_MS) + timedelta(minutes=1)
    with pytest.raises(ojs.DelayOutOfRangeError) as info:
        await client.push("far.job", [], queue=q, scheduled_at=too_far)
    assert isinstance(info.value, ValueError)
    text = str(info.value)
    assert str(MAX_DELAY_MS) in text and "49.7 days" in text and "nothing was published" in text
    with pytest.raises(ojs.DelayOutOfRangeError):
        await client.push("far.job", [], queue=q, delay=timedelta(days=50))
    assert sum(_metrics.stats.published.values()) == published
    with anyio.fail_after(WAIT):
        async with raw.channel(confirms=False) as ch:
            info_q = await ch.queue_declare(client.names.job_queue(q), passive=True)
    assert info_q.message_count == 0


# -------------------------------------------------------- delayed-message plugin


async def test_detect_delayed_plugin_false_and_connection_survives(
    client: ojs.Client, raw: amqp.Connection, q: str
) -> None:
    """Our broker has no delayed-message plugin: detection says False.  The probe's
    COMMAND_INVALID (a connection-level error) hits a separate connection, so the client's
    own connection, channel and pushes carry on."""
    await client.declare_queue(q)
    ch_before = await client.channel()
    with anyio.fail_after(WAIT):
        assert await client.detect_delayed_plugin() is False
    assert client.conn.is_open
    assert await client.channel() is ch_before and ch_before.is_open
    with anyio.fail_after(WAIT):
        job = await client.push("after.probe", [], queue=q)
    msg = await consume_one(raw, client.names.job_queue(q))
    assert ojs.decode_job(msg.body).id == job.id


async def test_scheduler_plugin_without_plugin_raises(broker_url: str) -> None:
    """``connect(scheduler="plugin")`` on a broker without the plugin fails at connect with
    SchedulerUnavailableError saying what to do."""
    with pytest.raises(ojs.SchedulerUnavailableError) as info, anyio.fail_after(WAIT):
        async with ojs.connect(current_url(), scheduler="plugin"):
            pytest.fail("connect() should have raised")
    text = str(info.value)
    assert "rabbitmq_delayed_message_exchange" in text and "levels" in text


async def test_scheduler_auto_falls_back_to_levels(raw: amqp.Connection, q: str) -> None:
    """``scheduler="auto"`` without the plugin uses the delay levels, and scheduled jobs
    arrive through them."""
    with anyio.fail_after(WAIT):
        async with ojs.connect(current_url(), scheduler="auto") as client:
            assert client.scheduler == "levels"
            await client.declare_delay_levels()
            job = await client.push("later.job", [], queue=q, delay=timedelta(milliseconds=200))
            msg = await consume_one(raw, client.names.job_queue(q))
    h = msg.properties.headers or {}
    assert "x-delay" not in h
    assert any(d["queue"] == client.names.delay_landing_queue(q) for d in h["x-death"])
    assert ojs.decode_job(msg.body).id == job.id


def test_bad_scheduler_name_is_refused() -> None:
    with pytest.raises(ValueError, match="scheduler must be one of"):
        Client(None, names=ojs.Names(), scheduler="cron")  # type: ignore[arg-type]


def test_plugin_message_shape_without_a_broker() -> None:
    """With the plugin in use, a scheduled job goes to ojs.exchange.delayed with routing key
    = its queue and ``x-delay`` = the delay in ms (001 §9.1.2), not mandatory (the plugin
    routes only after the delay, so it would return every mandatory message); a job due
    now still goes to ojs.exchange.direct.  (Pure: ``route()`` and the message it implies;
    no broker here has the plugin.)"""
    names = ojs.Names("tenant1.")
    client = Client(None, names=names, scheduler="plugin")  # type: ignore[arg-type]
    job = client.build("email.send", [], queue="email", delay=timedelta(seconds=90))
    now = datetime.now(UTC)
    stamp = format_timestamp(now)
    found = route(job, now, "plugin", names)
    props, _body = job_message(
        job, found, enqueued_at=stamp, idempotency_key=None, reply_to=None, trace_headers=None
    )
    assert found.exchange == "tenant1.ojs.exchange.delayed"
    assert found.routing_key == "email"
    headers = props.headers or {}
    assert 89_000 < headers["x-delay"] <= 90_000
    assert headers["x-ojs-scheduled-at"] == job.scheduled_at
    assert found.mandatory is False
    now_job = client.build("email.send", [], queue="email")
    found = route(now_job, now, "plugin", names)
    props, _body = job_message(
        now_job, found, enqueued_at=stamp, idempotency_key=None, reply_to=None, trace_headers=None
    )
    assert (found.exchange, found.routing_key) == ("tenant1.ojs.exchange.direct", "email")
    assert "x-delay" not in (props.headers or {})
    assert found.mandatory is True
