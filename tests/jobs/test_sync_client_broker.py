"""SyncClient: the blocking producer, from many threads at once, on both event loops."""

from __future__ import annotations

import threading
import uuid

import anyio
import pytest

import ojs_anyio as ojs
from ojs_anyio import amqp

from .broker_support import URL, WAIT

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

