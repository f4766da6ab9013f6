"""A push while the broker is away ends within the documented bounds, with the defaults of
``ojs_anyio.connect()`` and ``SyncClient`` (docs/failure-handling.md, "Bounds"):

* the broker stays away: :class:`PushNotSentError` after ``publish_timeout``, for every way
  to push (push, push_batch, push_for_result, a typed handle), and nothing is enqueued;
* a short outage: the push waits for the recovery and succeeds;
* the connection dies after the job was written: :class:`PushOutcomeUnknownError` at once;
* the broker goes silent after the job was written: ``PushOutcomeUnknownError`` after
  ``confirm_timeout``, and the job was in fact enqueued.

Outages are made with the fault proxy (cut, refuse, stall), never by stopping the broker.
Bounds are asserted as "before the bound plus generous slack" for a loaded machine.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from anyio.from_thread import start_blocking_portal
from harness import FaultProxy
from support.brokers import RABBITMQ_URL as URL
from support.waits import message_count, wait_message_count, wait_until

import ojs_anyio as ojs
from ojs_anyio import amqp

from .resilience_helpers import EventLog

BOUND = amqp.DEFAULT_PUBLISH_TIMEOUT
CONFIRM = amqp.DEFAULT_CONFIRM_TIMEOUT
#: What a loaded 2-core machine may add to a bound.
SLACK = 10.0


def _queue() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


async def _delete(queue: str) -> None:
    names = ojs.Names()
    with anyio.fail_after(30):
        async with amqp.connect(URL) as conn, conn.channel(confirms=False) as ch:
            for name in (names.job_queue(queue), names.dlx_queue(queue)):
                await ch.queue_delete(name)


@asynccontextmanager
async def _through_proxy() -> AsyncIterator[tuple[FaultProxy, ojs.Client, str]]:
    """A client with the defaults, connected through a fault proxy, and a fresh queue it
    declared by pushing one job while the broker was there (deleted afterwards)."""
    q = _queue()
    try:
        async with FaultProxy() as proxy, ojs.connect(proxy.url()) as client:
            await client.push("t.first", [0], queue=q)
            yield proxy, client, q
    finally:
        await _delete(q)


def _assert_not_sent(exc: BaseException | None, queue: str) -> None:
    assert isinstance(exc, ojs.PushNotSentError), repr(exc)
    assert not isinstance(exc, ojs.PushOutcomeUnknownError)
    assert isinstance(exc, ojs.PushError) and exc.code == "NOT_SENT"
    assert exc.queue == queue and exc.job_id
    assert "not enqueued" in str(exc)
    assert isinstance(exc.__cause__, amqp.OperationTimeoutError)


@pytest.mark.anyio
@pytest.mark.usefixtures("rabbitmq_url")
async def test_broker_away_longer_than_the_bound_every_push_is_not_sent() -> None:
    async with _through_proxy() as (proxy, client, q):
        worker = ojs.Worker(queues=[q])

        @worker.job("t.typed", queue=q)
        async def typed(ctx: ojs.JobContext, n: int) -> None: ...

        log = EventLog(client.conn)
        proxy.refuse_new()
        proxy.cut_all()
        await log.wait_for(amqp.ConnectionLost)
        ended: dict[str, tuple[Any, float]] = {}
        started = anyio.current_time()

        async def attempt(name: str, call: Callable[[], Awaitable[Any]]) -> None:
            try:
                outcome: Any = await call()
            except ojs.PushError as exc:
                outcome = exc
            ended[name] = (outcome, anyio.current_time() - started)

        batch = [client.build("t.x", [n], queue=q) for n in range(4, 7)]
        with anyio.fail_after(BOUND + SLACK):
            async with anyio.create_task_group() as tg:
                tg.start_soon(attempt, "push", lambda: client.push("t.x", [1], queue=q))
                tg.start_soon(attempt, "push_for_result", lambda: client.push_for_result("t.x", [2], queue=q))
                tg.start_soon(attempt, "typed", lambda: typed.push(client, 3))
                tg.start_soon(attempt, "push_batch", lambda: client.push_batch(batch))

        for name in ("push", "push_for_result", "typed"):
            error, elapsed = ended[name]
            _assert_not_sent(error, q)
            assert BOUND * 0.9 <= elapsed < BOUND + SLACK, (name, elapsed)
        results, elapsed = ended["push_batch"]
        # One bound for the whole batch, not one per job.
        assert BOUND * 0.9 <= elapsed < BOUND + SLACK, elapsed
        assert [r.job.id for r in results] == [j.id for j in batch]
        for r in results:
            assert not r.ok
            _assert_not_sent(r.error, q)

        proxy.refuse_new(False)
        await log.wait_recovered(timeout=60)
        # Not sent means not enqueued: only the first job is there, and pushing works again.
        assert await message_count(client.conn, ojs.Names().job_queue(q)) == 1
        await client.push("t.after", [], queue=q)
        assert await message_count(client.conn, ojs.Names().job_queue(q)) == 2


@pytest.mark.anyio
@pytest.mark.usefixtures("rabbitmq_url")
async def test_a_short_outage_inside_the_bound_the_push_succeeds_after_recovery() -> None:
    async with _through_proxy() as (proxy, client, q):
        log = EventLog(client.conn)
        proxy.refuse_new()
        proxy.cut_all()
        await log.wait_for(amqp.ConnectionLost)
        assert not client.conn.is_open
        pushed: list[tuple[ojs.Job, float]] = []
        started = anyio.current_time()

        async def push() -> None:
            job = await client.push("t.x", [1], queue=q)
            pushed.append((job, anyio.current_time()))

        with anyio.fail_after(BOUND + SLACK):
            async with anyio.create_task_group() as tg:
                tg.start_soon(push)
                # The outage ends before the first reconnect attempt (about 1 s after the
                # loss, the default policy): the push started while it lasted.
                proxy.refuse_new(False)
        job, done_at = pushed[0]
        recovered_at = log.times_of(amqp.ConnectionRecovered)
        assert recovered_at and recovered_at[0] <= done_at  # it waited for the recovery
        assert done_at - started < BOUND + SLACK
        assert await message_count(client.conn, ojs.Names().job_queue(q)) == 2
        assert job.queue == q


@pytest.mark.anyio
@pytest.mark.usefixtures("rabbitmq_url")
async def test_the_connection_dies_after_the_job_was_written_outcome_unknown() -> None:
    async with _through_proxy() as (proxy, client, q):
        ch = await client.channel()
        proxy.stall("upstream")  # the job reaches the proxy, never the broker
        ended: list[tuple[BaseException, float]] = []

        async def push() -> None:
            try:
                await client.push("t.x", [1], queue=q)
            except ojs.PushError as exc:
                ended.append((exc, anyio.current_time()))

        with anyio.fail_after(SLACK):
            async with anyio.create_task_group() as tg:
                tg.start_soon(push)
                await wait_until(lambda: ch.unconfirmed == 1, what="the job written")
                cut_at = anyio.current_time()
                proxy.cut_all()
                proxy.unstall()
        error, at = ended[0]
        assert isinstance(error, ojs.PushOutcomeUnknownError), repr(error)
        assert not isinstance(error, ojs.PushNotSentError)
        assert error.code == "OUTCOME_UNKNOWN" and error.queue == q
        assert at - cut_at < SLACK  # at the loss, not after a timeout


@pytest.mark.anyio
@pytest.mark.usefixtures("rabbitmq_url")
async def test_a_silent_broker_after_the_job_was_written_outcome_unknown_after_confirm_timeout() -> None:
    async with _through_proxy() as (proxy, client, q):
        proxy.stall()  # nothing gets through, and the heartbeat (60 s) notices nothing yet
        started = anyio.current_time()
        with anyio.fail_after(CONFIRM + SLACK), pytest.raises(ojs.PushOutcomeUnknownError) as info:
            await client.push("t.x", [1], queue=q)
        elapsed = anyio.current_time() - started
        assert CONFIRM * 0.9 <= elapsed < CONFIRM + SLACK, elapsed
        assert f"not confirmed within {CONFIRM:.3g}s" in str(info.value)
        proxy.unstall()
        # "Unknown" was the honest answer: the broker got the job after all.
        await wait_message_count(URL, ojs.Names().job_queue(q), 2, timeout=SLACK)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.usefixtures("rabbitmq_url")
def test_sync_client_push_while_the_broker_stays_away_is_not_sent_within_the_bound(backend: str) -> None:
    q = _queue()
    try:
        with (
            start_blocking_portal() as portal,
            portal.wrap_async_context_manager(FaultProxy()) as proxy,
            ojs.SyncClient(proxy.url(), backend=backend) as client,
        ):
            client.push("t.first", [0], queue=q)
            lost = threading.Event()

            def on_event(event: amqp.RecoveryEvent) -> None:
                if isinstance(event, amqp.ConnectionLost):
                    lost.set()

            client._portal.call(client._client.conn.add_listener, on_event)
            portal.call(proxy.refuse_new)
            portal.call(proxy.cut_all)
            assert lost.wait(SLACK)
            started = time.monotonic()
            with pytest.raises(ojs.PushNotSentError) as info:
                client.push("t.x", [1], queue=q)
            elapsed = time.monotonic() - started
            assert BOUND * 0.9 <= elapsed < BOUND + SLACK, elapsed
            _assert_not_sent(info.value, q)
            portal.call(proxy.refuse_new, False)
    finally:
        anyio.run(_delete, q)
