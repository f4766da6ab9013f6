"""SyncClient: the blocking producer, from many threads at once, on both event loops."""

from __future__ import annotations

import threading
import uuid
from datetime import date

import anyio
import msgspec
import pytest
from anyio.from_thread import start_blocking_portal
from support.brokers import RABBITMQ_URL as URL
from support.cleanup import Cleanup

import ojs_anyio as ojs
from ojs_anyio import amqp

from .broker_support import WAIT

BACKENDS = [pytest.param("asyncio", id="asyncio"), pytest.param("trio", id="trio")]


async def _ready_count(name: str) -> int:
    async with amqp.connect(URL) as conn, conn.channel(confirms=False) as ch:
        return (await ch.queue_declare(name, passive=True)).message_count


async def _drain_ids(name: str, n: int) -> list[str]:
    ids: list[str] = []
    with anyio.fail_after(WAIT):
        async with (
            amqp.connect(URL) as conn,
            conn.channel(confirms=False) as ch,
            ch.consume(name, prefetch=256) as messages,
        ):
            async for msg in messages:
                ids.append(str(msg.properties.message_id))
                await msg.ack()
                if len(ids) == n:
                    break
    return ids


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.usefixtures("rabbitmq_url")
def test_sync_client_from_eight_threads(backend: str) -> None:
    q = f"t{uuid.uuid4().hex[:10]}"
    try:
        _eight_threads(q, backend)
    finally:
        anyio.run(_delete, ojs.Names().job_queue(q), ojs.Names().dlx_queue(q))


async def _delete(*names: str) -> None:
    async with amqp.connect(URL) as conn, conn.channel(confirms=False) as ch:
        for name in names:
            await ch.queue_delete(name)


def _eight_threads(q: str, backend: str) -> None:
    per_thread, threads = 25, 8
    pushed: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    with ojs.SyncClient(URL, backend=backend) as client:
        barrier = threading.Barrier(threads)

        def producer(n: int) -> None:
            try:
                barrier.wait(timeout=WAIT)
                for i in range(per_thread):
                    job = client.push("sync.test", [n, i], queue=q)
                    with lock:
                        pushed.append(job.id)
            except BaseException as exc:  # reported below: a thread cannot raise into the test
                errors.append(exc)

        workers = [threading.Thread(target=producer, args=(n,)) for n in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join(timeout=WAIT * 2)
        assert not any(t.is_alive() for t in workers)
        assert errors == []
        # every push returned after its confirm, so the queue already holds them all
        names = ojs.Names()
        assert anyio.run(_ready_count, names.job_queue(q)) == threads * per_thread
        batch = [client.build("sync.batch", [i], queue=q) for i in range(10)]
        assert all(r.ok for r in client.push_batch(batch))
    assert client.closed
    client.close()  # idempotent
    ids = anyio.run(_drain_ids, names.job_queue(q), threads * per_thread + 10)
    assert sorted(ids) == sorted(pushed + [j.id for j in batch])
    with pytest.raises(RuntimeError, match="closed"):
        client.push("sync.test", [], queue=q)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.usefixtures("rabbitmq_url")
def test_sync_client_raises_the_async_clients_errors_in_the_caller(backend: str) -> None:
    with ojs.SyncClient(URL, backend=backend, declare="lazy") as client:
        with pytest.raises(ojs.InvalidJobError):
            client.push("", [], queue="x")  # empty type: refused before anything is sent
        with pytest.raises(ojs.InvalidJobError, match="UUIDv7"):
            client.info("no-such-job", queue="x", timeout=0.2)  # not a job id: refused at once
        missing = f"t{uuid.uuid4().hex[:10]}"
        with pytest.raises(ojs.QueueNotFoundError, match=missing):
            client.info(client.build("sync.test", []).id, queue=missing, timeout=0.2)


def test_sync_client_bad_url_fails_in_the_constructor() -> None:
    with pytest.raises(amqp.AMQPError):
        ojs.SyncClient("amqp://guest:guest@127.0.0.1:1/", connection_timeout=2)


class Order(msgspec.Struct):
    sku: str
    qty: int


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.usefixtures("rabbitmq_url")
def test_sync_client_waits_for_results_and_pushes_typed_handles(backend: str) -> None:
    """A Django view's view of the job layer: push_for_result blocks for the reply, typed
    handles push through a SyncClient, and a result that is late raises TimeoutError."""
    q = f"t{uuid.uuid4().hex[:10]}"
    cleanup = Cleanup()
    cleanup.ojs(q, url=URL)
    worker = ojs.Worker(queues=[q])
    release = threading.Event()

    @worker.job("order.total")
    async def total(ctx: ojs.JobContext, order: Order, day: date) -> dict[str, object]:
        return {"sku": order.sku, "qty": order.qty, "day": day.isoformat()}

    @worker.job("order.slow")
    def slow(ctx: ojs.JobContext) -> str:  # a sync handler: runs in a worker thread
        release.wait(WAIT)
        return "late"

    try:
        with (
            start_blocking_portal(backend) as portal,
            portal.wrap_async_context_manager(ojs.connect(URL)) as worker_client,
        ):
            running = portal.start_task_soon(worker.run, worker_client)
            portal.call(worker.wait_ready)
            try:
                with ojs.SyncClient(URL, backend=backend) as client:
                    typed = total.push_for_result(client, Order("pen", 3), date(2026, 11, 25))
                    plain = client.push_for_result(
                        "order.total", [{"sku": "ink", "qty": 1}, "2026-01-01"], queue=q
                    )
                    job = total.push(client, Order("cap", 2), date(2026, 1, 2))
                    assert typed.result(timeout=WAIT) == {"sku": "pen", "qty": 3, "day": "2026-11-25"}
                    assert plain.result(timeout=WAIT) == {"sku": "ink", "qty": 1, "day": "2026-01-01"}
                    assert job.args == [{"sku": "cap", "qty": 2}, "2026-01-02"]
                    # by id, from any process (INFO), blocking, as the handler's return type
                    by_id = total.result(client, job.id, timeout=WAIT)
                    assert by_id == {"sku": "cap", "qty": 2, "day": "2026-01-02"}
                    late = slow.push_for_result(client)
                    with pytest.raises(TimeoutError):
                        late.result(timeout=0.2)
                    assert not late.done()
                    release.set()
                    assert late.result(timeout=WAIT) == "late" and late.done()
            finally:
                release.set()
                portal.call(worker.stop)
                running.result(timeout=WAIT)
    finally:
        anyio.run(cleanup.run)
