"""What the client checks before it addresses a queue's workers, and what INFO says of a
sync handler asked to cancel (issue 24, points 4 and 5), on RabbitMQ and memory://.

* ``cancel``, ``info``, ``heartbeat`` and ``declare_control_queue`` look for the job queue
  first (a passive declare): for a name with no job queue they raise
  :class:`ojs.QueueNotFoundError` and leave no ``ojs.queue.control.{q}`` behind.
* An id that cannot be a job id (not a lowercase UUIDv7) is refused at once.
* A running plain ``def`` handler cannot be interrupted: after a CANCEL, INFO says so
  (``cancel_requested``, ``interruptible=False``, the detail), and the job completes.
* ``DeadLetters``: a death time that cannot be right is unknown (or the ``x-death`` time),
  so peek shows it as such and prune never drops the job for its age; a negative
  ``max_jobs`` is refused before anything is touched.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import anyio
import pytest

import ojs_anyio as ojs
from ojs_anyio import amqp
from ojs_anyio.jobs._client import SYNC_CANCEL_DETAIL
from ojs_anyio.jobs._envelope import _uuid7

from .broker_support import WAIT, Outcomes, running, wait_message_count

pytestmark = pytest.mark.anyio


async def exists(raw: amqp.Connection, name: str) -> bool:
    try:
        async with raw.channel(confirms=False) as ch:
            await ch.queue_declare(name, passive=True)
    except amqp.NotFound:
        return False
    return True


async def test_a_queue_without_a_job_queue_is_refused_and_gets_no_control_queue(
    client: ojs.Client, raw: amqp.Connection, new_queue: Callable[..., str]
) -> None:
    typo = new_queue()  # registered for cleanup, never declared
    job_id = _uuid7()
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "cancel": lambda: client.cancel(job_id, queue=typo),
        "info": lambda: client.info(job_id, queue=typo, timeout=30),
        "heartbeat": lambda: client.heartbeat(job_id, "w1", queue=typo),
        "declare_control_queue": lambda: client.declare_control_queue(typo),
    }
    for name, call in calls.items():
        with anyio.fail_after(WAIT), pytest.raises(ojs.QueueNotFoundError) as info:
            await call()
        assert info.value.queue == typo, name
        assert str(info.value) == f"queue {typo!r} does not exist (ojs.queue.{typo})", name
    assert not await exists(raw, client.names.control_queue(typo)), "no control queue for a typo"
    assert not await exists(raw, client.names.job_queue(typo))
    # Once the job queue exists, the same calls work (and the control queue appears).
    await client.declare_queue(typo)
    with anyio.fail_after(WAIT):
        await client.cancel(job_id, queue=typo)
    assert await exists(raw, client.names.control_queue(typo))


async def test_a_job_queue_declared_by_someone_else_is_found(
    client: ojs.Client, raw: amqp.Connection, broker_url: str, q: str
) -> None:
    async with ojs.connect(broker_url) as other:
        await other.declare_queue(q)
    with anyio.fail_after(WAIT):
        await client.cancel(_uuid7(), queue=q)  # this client never declared it: a passive declare found it
    assert await exists(raw, client.names.control_queue(q))


@pytest.mark.parametrize(
    "bad", ["not-a-uuid", str(uuid.uuid4()), _uuid7().upper(), _uuid7() + "\n", ""], ids=repr
)
async def test_an_id_that_cannot_be_a_job_id_is_refused_before_anything_is_sent(
    client: ojs.Client, raw: amqp.Connection, q: str, bad: str
) -> None:
    await client.declare_queue(q)
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: client.cancel(bad, queue=q),
        lambda: client.info(bad, queue=q, timeout=60),
    ]
    for call in calls:
        with anyio.fail_after(WAIT), pytest.raises(ojs.InvalidJobError) as info:
            await call()
        assert info.value.field == "job_id" and "UUIDv7" in str(info.value)
    assert not await exists(raw, client.names.control_queue(q)), "nothing was sent"


async def test_cancel_of_a_running_sync_handler_says_it_runs_to_completion(
    client: ojs.Client, q: str
) -> None:
    started = threading.Event()
    release = threading.Event()
    async_started = anyio.Event()
    worker = ojs.Worker(queues=[q], concurrency=2)
    outcomes = Outcomes(worker)

    @worker.handler("sync.job")
    def blocking(ctx: ojs.JobContext) -> str:
        started.set()
        release.wait(WAIT * 4)  # bounded: a failing test does not hang the thread for good
        return "done"

    @worker.handler("async.job")
    async def sleeping(ctx: ojs.JobContext) -> None:
        async_started.set()
        await anyio.sleep_forever()

    try:
        async with running(worker, client):
            job = await client.push("sync.job", [], queue=q)
            assert await anyio.to_thread.run_sync(started.wait, WAIT)
            with anyio.fail_after(WAIT):
                before = await client.info(job.id, queue=q, timeout=WAIT)
            assert (before.state, before.cancel_requested, before.interruptible) == ("active", False, False)
            assert before.detail is None
            await client.cancel(job.id, queue=q)
            with anyio.fail_after(WAIT):
                while not (after := await client.info(job.id, queue=q, timeout=WAIT)).cancel_requested:
                    pass  # the CANCEL and the INFO may be relayed by different workers' relays
            assert after.state == "active" and after.interruptible is False
            assert after.detail == SYNC_CANCEL_DETAIL
            release.set()
            final = await outcomes.wait_final(job.id)
            assert final.outcome == "completed" and final.result == "done", "it ran to completion"

            other = await client.push("async.job", [], queue=q)
            with anyio.fail_after(WAIT):
                await async_started.wait()
                active = await client.info(other.id, queue=q, timeout=WAIT)
            assert active.interruptible is True and active.cancel_requested is False
            await client.cancel(other.id, queue=q)
            assert (await outcomes.wait_final(other.id)).outcome == "cancelled"
    finally:
        release.set()


def dead(
    q: str,
    marker: object,
    *,
    x_death_age: timedelta | None = None,
    created_age: timedelta = timedelta(days=400),
) -> tuple[str, amqp.BasicProperties]:
    now = datetime.now(UTC)
    headers: dict[str, object] = {"x-ojs-dead-lettered-at": marker, "x-ojs-error-code": "HANDLER_ERROR"}
    if x_death_age is not None:
        headers["x-death"] = [
            {"queue": f"ojs.queue.{q}", "reason": "expired", "count": 1, "time": now - x_death_age}
        ]
    job_id = _uuid7()
    props = amqp.BasicProperties(
        message_id=job_id, type="t.work", delivery_mode=2, timestamp=now - created_age, headers=headers
    )
    return job_id, props


async def test_dead_letters_with_an_unusable_death_time(
    client: ojs.Client, raw: amqp.Connection, q: str
) -> None:
    await client.declare_queue(q)
    dlq = client.names.dlx_queue(q)
    fallback, fallback_props = dead(q, "9999-12-31T23:59:60Z", x_death_age=timedelta(days=200))
    unknown, unknown_props = dead(q, "9999-12-31T23:59:60Z")
    future, future_props = dead(q, "9999-12-31T23:59:59Z")
    garbage, garbage_props = dead(q, "yesterday")
    async with raw.channel() as ch:
        for props in (fallback_props, unknown_props, future_props, garbage_props):
            await ch.publish(b"{}", routing_key=dlq, properties=props)
    await wait_message_count(raw, dlq, 4)
    dead_letters = client.dead_letters(q)

    peeked = {d.id: d.died_at for d in await dead_letters.peek()}
    assert peeked[unknown] is None and peeked[future] is None and peeked[garbage] is None
    when = peeked[fallback]
    assert when is not None and timedelta(days=199) < datetime.now(UTC) - when < timedelta(days=201)

    with pytest.raises(ojs.amqp.UsageError, match="max_jobs must be zero or more"):
        await dead_letters.prune(None, max_jobs=-5)
    with pytest.raises(ojs.amqp.UsageError, match="limit must be zero or more"):
        await dead_letters.prune(limit=-1)
    assert await dead_letters.count() == 4, "nothing touched"

    # By age: the x-death fallback is 200 days old, so it goes; the next one's death time
    # is unknown, so it stays and the age rule stops there (the queue is oldest first).
    assert await dead_letters.prune(timedelta(days=180), max_jobs=None) == 1
    assert [d.id for d in await dead_letters.peek()] == [unknown, future, garbage]
    # An age so large that the cutoff is before year 1: nothing is that old.
    assert await dead_letters.prune(timedelta(days=999_999_999), max_jobs=None) == 0
    # By count, the death time does not matter.
    assert await dead_letters.prune(None, max_jobs=1) == 2
    assert [d.id for d in await dead_letters.peek()] == [garbage]


async def test_cancel_and_info_use_the_workers_quorum_control_queue_as_it_is(
    broker_url: str, q: str
) -> None:
    """The workers declared the control queue as a quorum queue; a client that knows
    nothing of their QueueOptions (the CLI, the dashboard) sends INFO and CANCEL to it as it
    is, instead of declaring it again the classic way (a 406 for a quorum queue)."""
    worker = ojs.Worker(queues=[q])
    outcomes = Outcomes(worker)
    started = anyio.Event()

    @worker.handler("c.long")
    async def long(ctx: ojs.JobContext) -> None:
        started.set()
        await anyio.sleep_forever()

    async with (
        ojs.connect(broker_url, queue_options=ojs.QueueOptions.quorum()) as workers_client,
        running(worker, workers_client),
    ):
        job = await workers_client.push("c.long", [], queue=q)
        with anyio.fail_after(WAIT):
            await started.wait()
        async with ojs.connect(broker_url) as plain:
            assert (await plain.info(job.id, queue=q)).state == "active"
            await plain.cancel(job.id, queue=q)
        final = await outcomes.wait_final(job.id)
    assert final.outcome == "cancelled"
