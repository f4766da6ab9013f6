"""The dashboard's data layer (:mod:`ojs_anyio.dashboard._state`) on ``memory://``.

Real workers and schedulers of the library run against a private in-process broker; the
observer sees them only through the broker: passive declares, the presence messages and
BEATs on ``ojs.exchange.control``, dead letters, CANCEL and INFO.  Every wait is bounded
and waits for an event (an outcome, a message heard), never for time to pass.
"""

from __future__ import annotations

import os
import socket

import anyio
import pytest
from support.waits import wait_message_count
from support.workers import Outcomes, running

import ojs_anyio as ojs
from ojs_anyio import amqp
from ojs_anyio.dashboard import Observer, observe
from ojs_anyio.dashboard import _state as state
from ojs_anyio.jobs import PRESENCE_KEY, WORKER_PRESENCE

from .dashboard_support import WAIT, holding_worker, memory_client, qname, wait_for

pytestmark = pytest.mark.anyio

#: The tests poll by hand (Observer.poll): the background loop must not race them.
MANUAL = 3600.0


async def test_queue_depths_follow_pushes() -> None:
    q, absent = qname(), qname()
    async with memory_client() as client, observe(client, queues=[q, absent], refresh=MANUAL) as obs:
        await client.declare_queue(q)
        await obs.poll()
        assert _row(obs, q).ready == 0 and _row(obs, q).dead == 0 and _row(obs, q).retrying == 0
        assert not _row(obs, absent).exists and _row(obs, absent).ready is None
        for n in range(3):
            await client.push("t.any", [n], queue=q)
        await obs.poll()
        row = _row(obs, q)
        assert (row.exists, row.ready, row.consumers, row.running) == (True, 3, 0, 0)
        assert row.history[-2:] == (0, 3)  # the sparkline's samples, oldest first


async def test_a_running_job_its_worker_and_beat_then_cancel() -> None:
    q = qname()
    worker, started = holding_worker(q, concurrency=3, heartbeat_interval=0.05, worker_id=f"w-{q}")
    outcomes = Outcomes(worker)
    async with memory_client() as client, observe(client, queues=[q], refresh=MANUAL) as obs:
        async with running(worker, client):
            job = await client.push("t.hold", [], queue=q)
            with anyio.fail_after(WAIT):
                await started.wait()
            await wait_for(obs, lambda: _running(obs, job.id) is not None, "the running job")
            await wait_for(obs, lambda: _running(obs, job.id).beat_ago is not None, "a BEAT")  # type: ignore[union-attr]
            (w,) = [w for w in obs.workers() if w.presence.worker_id == worker.worker_id]
            p = w.presence
            assert (w.status, p.host, p.pid, p.queues, p.concurrency) == (
                "live", socket.gethostname(), os.getpid(), [q], 3
            )  # fmt: skip
            assert p.backend == anyio_backend_name()
            r = _running(obs, job.id)
            assert r is not None and (r.type, r.queue, r.attempt, r.worker_id) == (
                "t.hold",
                q,
                1,
                w.presence.worker_id,
            )
            await obs.poll()
            assert _row(obs, q).running == 1 and _row(obs, q).consumers == 1

            await obs.cancel(job.id, q)
            (final,) = await outcomes.wait_for(lambda o: o.id == job.id)
            assert final.outcome == "cancelled"
            await wait_for(obs, lambda: _running(obs, job.id) is None, "the job gone from the running ones")
            where, info = await obs.info(job.id, None)
            assert (where, info.state) == (q, "cancelled")
        # The worker stopped gracefully: its last message says so at once.
        await wait_for(obs, lambda: _worker(obs, worker.worker_id).status == "stopped", "the worker stopped")


async def test_throughput_comes_from_the_workers_counters() -> None:
    q = qname()
    worker = ojs.Worker(queues=[q], concurrency=5, heartbeat_interval=0.05)

    @worker.handler("t.noop")
    async def noop(ctx: ojs.JobContext, n: int) -> int:
        return n

    outcomes = Outcomes(worker)
    async with (
        memory_client() as client,
        observe(client, queues=[q], refresh=MANUAL) as obs,
        running(worker, client),
    ):
        await wait_for(obs, lambda: _has_worker(obs, worker.worker_id), "the worker's first message")
        await obs.poll()  # its counters so far are the baseline, not a spike
        for n in range(5):
            await client.push("t.noop", [n], queue=q)
        await outcomes.wait_for(lambda o: o.outcome == "completed", count=5)
        await wait_for(
            obs,
            lambda: _worker(obs, worker.worker_id).presence.counts.get("completed") == 5,
            "a message with the new counts",
        )
        await obs.poll()
        rates = obs.overview().throughput
        assert rates["completed"][-1] > 0
        assert rates["retried"][-1] == 0 and rates["dead_lettered"][-1] == 0
        assert all(v == 0 for v in rates["completed"][:-1])


async def test_dead_letters_with_reasons_requeue_one_then_purge() -> None:
    q = qname()
    worker = ojs.Worker(
        queues=[q], concurrency=3, retry=ojs.RetryPolicy(max_attempts=2, initial_interval=0.1)
    )

    @worker.handler("t.fail")
    async def fail(ctx: ojs.JobContext, why: str) -> None:
        raise ValueError(why)

    outcomes = Outcomes(worker)
    async with memory_client() as client, observe(client, queues=[q], refresh=MANUAL) as obs:
        async with running(worker, client):
            jobs = [await client.push("t.fail", [f"no invoice {n}"], queue=q) for n in range(3)]
            await outcomes.wait_for(lambda o: o.outcome == "dead_lettered", count=3)
        await _wait_dead(obs, q, 3)
        total, rows = await obs.dead_jobs(q)
        assert total == 3
        by_id = {r.job_id: r for r in rows}
        before = [r.job_id for r in rows]  # the order they died in (they fail concurrently)
        assert set(by_id) == {j.id for j in jobs}
        for n, job in enumerate(jobs):
            row = by_id[job.id]
            assert (row.type, row.attempt, row.malformed) == ("t.fail", 2, None)
            # The final attempt's reason, from the worker's death note (default mode: Nack).
            final = "(attempt 2 of 2, retries exhausted)"
            assert row.reason == f"HANDLER_ERROR: ValueError: no invoice {n} {final}"
            assert row.error is not None and row.error["backtrace"]  # shown only when the operator asks
            assert row.died_at is not None

        moved = await obs.requeue(q, [jobs[1].id], reset_attempts=True)
        assert moved == 1
        assert _row(obs, q).dead == 2 and _row(obs, q).ready == 1  # polled after the action
        _, rows = await obs.dead_jobs(q)
        assert [r.job_id for r in rows] == [
            i for i in before if i != jobs[1].id
        ]  # the others kept their order
        async with client.conn.channel(confirms=False) as ch:
            msg = await ch.get(client.names.job_queue(q))
            assert msg is not None and msg.properties.message_id == jobs[1].id
            assert (msg.properties.headers or {})["x-ojs-attempt"] == 1
            await msg.ack()

        assert await obs.purge(q) == 2
        assert _row(obs, q).dead == 0
        assert await obs.dead_jobs(q) == (0, [])


async def test_requeue_of_an_unknown_id_moves_nothing() -> None:
    q = qname()
    async with memory_client() as client, observe(client, queues=[q], refresh=MANUAL) as obs:
        await client.declare_queue(q)
        ch = await client.channel()
        await ch.publish(
            b"{}", routing_key=client.names.dlx_queue(q), properties=amqp.BasicProperties(message_id="x")
        )
        assert await obs.requeue(q, ["01a21165-0000-7000-8000-000000000000"], reset_attempts=False) == 0
        assert _row(obs, q).dead == 1 and _row(obs, q).ready == 0
        total, _ = await obs.dead_jobs("nosuchqueue")
        assert total is None


async def test_scheduler_leadership_and_schedules() -> None:
    q = qname()
    sched = ojs.Scheduler(name=f"g-{q}")
    sched.add("t.tick", "0 3 * * *", queue=q, name="nightly")
    async with memory_client() as client, observe(client, refresh=MANUAL) as obs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(sched.run, client)
            await wait_for(
                obs,
                lambda: _group(obs, sched.name) is not None and _group(obs, sched.name).leader is not None,
                "a leader",
            )  # type: ignore[union-attr]
            group = _group(obs, sched.name)
            assert group is not None and group.leader is not None
            assert group.leader.presence.instance_id == sched.instance_id
            assert group.leader.presence.leader_since is not None
            (s,) = group.schedules
            assert (s.name, s.cron, s.job_type, s.queue, s.timezone) == (
                "nightly",
                "0 3 * * *",
                "t.tick",
                q,
                "UTC",
            )
            assert s.next_tick is not None and s.next_tick.endswith("T03:00:00.000Z")
            sched.stop()
        await wait_for(obs, lambda: _group(obs, sched.name).leader is None, "the leader gone")  # type: ignore[union-attr]
        assert _group(obs, sched.name).instances[0].status == "stopped"  # type: ignore[union-attr]


async def test_info_finds_a_finished_job_and_its_result() -> None:
    q = qname()
    worker = ojs.Worker(queues=[q], concurrency=2)

    @worker.handler("t.sum")
    async def add(ctx: ojs.JobContext, a: int, b: int) -> dict[str, int]:
        return {"sum": a + b}

    outcomes = Outcomes(worker)
    async with (
        memory_client() as client,
        observe(client, queues=[q], refresh=MANUAL) as obs,
        running(worker, client),
    ):
        job = await client.push("t.sum", [2, 3], queue=q)
        await outcomes.wait_final(job.id)
        await obs.poll()
        where, info = await obs.info(job.id, None)
        assert (where, info.state, info.attempt, info.result) == (q, "completed", 1, {"sum": 5})
        _, unknown = await obs.info("01a21165-0000-7000-8000-000000000000", q, timeout=0.2)
        assert unknown.state == "unknown"


async def test_hostile_presence_messages_are_ignored_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Anyone who can publish to the vhost can publish to ojs.exchange.control: what is not
    a presence message is ignored, queue names no OJS queue can have are not shown, and
    the tables stay bounded."""
    monkeypatch.setattr(state, "MAX_WORKERS", 3)
    good = {
        "worker_id": "w",
        "host": "h",
        "pid": 1,
        "queues": ["dlx.evil", qname()],
        "concurrency": 1,
        "backend": "trio",
        "state": "running",
        "interval": 5.0,
        "sent_at": "2026-01-01T00:00:00Z",
        "running": [],
        "running_total": 0,
        "counts": {},
    }
    bad = [
        (WORKER_PRESENCE, b"not json"),
        (WORKER_PRESENCE, b'{"worker_id": 1}'),
        (WORKER_PRESENCE, b"[]"),
        (WORKER_PRESENCE, _json({**good, "pid": -1})),
        (WORKER_PRESENCE, _json({**good, "queues": ["q"] * 201})),
        (WORKER_PRESENCE, _json({**good, "host": "x" * 600})),
        (WORKER_PRESENCE, b" " * (300 * 1024)),
        ("something.else", _json(good)),
    ]
    async with memory_client() as client, observe(client, refresh=MANUAL) as obs:
        ch = await client.channel()
        for kind, body in bad:
            await ch.publish(
                body,
                exchange=client.names.control_exchange,
                routing_key=PRESENCE_KEY,
                properties=amqp.BasicProperties(type=kind),
            )
        for n in range(5):
            await ch.publish(
                _json({**good, "worker_id": f"w{n}"}),
                exchange=client.names.control_exchange,
                routing_key=PRESENCE_KEY,
                properties=amqp.BasicProperties(type=WORKER_PRESENCE),
            )
        await wait_for(obs, lambda: _has_worker(obs, "w4"), "the last good message")
        assert sorted(w.presence.worker_id for w in obs.workers()) == ["w2", "w3", "w4"]
        assert obs.queues() == [good["queues"][1]]  # "dlx.evil" cannot be an OJS queue


# ------------------------------------------------------------------ helpers


def anyio_backend_name() -> str:
    import sniffio

    return sniffio.current_async_library()


def _json(data: object) -> bytes:
    import json

    return json.dumps(data).encode()


def _row(obs: Observer, queue: str) -> state.QueueRow:
    (row,) = [r for r in obs.overview().queues if r.queue == queue]
    return row


def _running(obs: Observer, job_id: str) -> state.RunningRow | None:
    return obs.running_job(job_id)


def _has_worker(obs: Observer, worker_id: str) -> bool:
    return any(w.presence.worker_id == worker_id for w in obs.workers())


def _worker(obs: Observer, worker_id: str) -> state.WorkerRow:
    (w,) = [w for w in obs.workers() if w.presence.worker_id == worker_id]
    return w


def _group(obs: Observer, name: str) -> state.SchedulerGroup | None:
    found = [g for g in obs.scheduler_groups() if g.group == name]
    return found[0] if found else None


async def _wait_dead(obs: Observer, queue: str, count: int) -> None:
    """The broker moves a rejected job into the DLQ after the nack (no event says when)."""
    await wait_message_count(obs.client.conn, obs.client.names.dlx_queue(queue), count, WAIT)
    await obs.poll()


async def test_presence_never_reaches_a_worker() -> None:
    """Interop: presence messages go to ojs.exchange.control under a key no OJS queue can
    have, so the queue a worker binds there (key: its OJS queue) never gets one, and they
    never pass through the durable control queue that a foreign consumer may read."""
    q = qname()
    worker = ojs.Worker(queues=[q], heartbeat_interval=0.05)
    sched = ojs.Scheduler(name=f"g-{q}")
    async with memory_client() as client, observe(client, refresh=MANUAL) as obs:
        names = client.names
        ch = await client.channel()
        await ch.exchange_declare(names.control_exchange, "direct", durable=True)
        spy = await ch.queue_declare("", exclusive=True)
        await ch.queue_bind(spy.name, names.control_exchange, q)  # as a worker of q binds its own
        async with running(worker, client), anyio.create_task_group() as tg:
            tg.start_soon(sched.run, client)
            with anyio.fail_after(WAIT):
                for _ in range(6):
                    await obs.wait_heard()
            assert obs.workers() and obs.scheduler_groups()
            sched.stop()
        assert (await ch.queue_declare(spy.name, passive=True)).message_count == 0
        assert (await ch.queue_declare(names.control_queue(q), passive=True)).message_count == 0


async def test_requeue_into_a_queue_declared_with_other_options() -> None:
    """The dashboard knows no app's QueueOptions: it requeues into the job queue as it is,
    never re-declaring it with default arguments (which the broker would refuse)."""
    q = qname()
    async with memory_client() as client, observe(client, queues=[q], refresh=MANUAL) as obs:
        broker_url = client.conn.url
        async with ojs.connect(
            f"memory://{broker_url.host}/", queue_options=ojs.QueueOptions(max_length=100)
        ) as app:
            await app.declare_queue(q)
            job = app.build("t.any", [], queue=q)
            ch = await app.channel()
            await ch.publish(
                ojs.encode_job(job),
                routing_key=app.names.dlx_queue(q),
                properties=amqp.BasicProperties(message_id=job.id, type=job.type),
            )
        assert await obs.requeue(q, None, reset_attempts=True) == 1
        assert (_row(obs, q).ready, _row(obs, q).dead) == (1, 0)
        with pytest.raises(ojs.QueueNotFoundError):
            await obs.requeue(qname(), None, reset_attempts=True)
