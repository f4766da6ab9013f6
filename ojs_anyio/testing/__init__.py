"""Testing your job handlers without RabbitMQ: ``ojs_anyio.testing``.

Everything runs on the real client and worker, against a private ``memory://`` broker
(:mod:`ojs_anyio.memory`) whose clock is virtual by default: time moves only when the test
says so, so a job scheduled a day ahead or a five-step retry ladder runs in milliseconds.

::

    from ojs_anyio.testing import job_tester

    async def test_signup_sends_a_welcome_email() -> None:
        async with job_tester(worker=worker) as jobs:
            await signup(jobs.client, "ada@example.com")     # your code pushes a job
            jobs.assert_enqueued(queue="email", type="email.send", args=["ada@example.com"])
            outcomes = await jobs.drain()                     # run the worker until idle
            jobs.assert_performed(type="email.send", count=1)

The names follow the OJS testing spec (``assert_enqueued``, ``refute_enqueued``,
``assert_performed``, ``drain``); ``advance(seconds)`` moves the virtual clock, and
``inline=True`` makes :meth:`JobTester.push` run the job at once.  For pytest, the fixtures
of :mod:`ojs_anyio.testing.pytest_plugin` give a ``job_tester`` per test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio

from .. import Client, Job, JobOutcome, Names, Worker, connect, decode_job
from .._misuse import ArgumentTypeError, UsageError
from ..memory import MemoryBroker, VirtualClock
from ._bus import BusTester, PublishedEvent, bus_tester
from ._idle import QUIET, settle
from ._idle import advance as _advance

__all__ = [
    "BusTester",
    "JobTester",
    "PublishedEvent",
    "VirtualSchedulerClock",
    "advance",
    "assert_enqueued",
    "assert_performed",
    "bus_tester",
    "drain",
    "enqueued",
    "job_tester",
    "refute_enqueued",
]

_active: list[JobTester] = []
#: A valid OJS queue name that stands for "any queue" when cutting entity names apart.
_MARK = "q0placeholder0q"


class VirtualSchedulerClock:
    """A cron :class:`~ojs_anyio.Scheduler` clock on the broker's virtual clock: wall time is
    the tester's start plus virtual seconds, and the scheduler's waits end when
    :meth:`JobTester.advance` reaches them.  ``Scheduler(..., clock=jobs.scheduler_clock)``."""

    def __init__(self, clock: VirtualClock, start: datetime | None = None) -> None:
        self._clock = clock
        self._origin = (start or datetime.now(UTC)) - timedelta(seconds=clock.now())

    def now(self) -> datetime:
        return self._origin + timedelta(seconds=self._clock.now())

    async def wait(self, changed: anyio.Event, seconds: float) -> None:
        timer = anyio.Event()
        self._clock.wake_at(self._clock.now() + seconds, timer)

        async def either(event: anyio.Event, scope: anyio.CancelScope) -> None:
            await event.wait()
            scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(either, changed, tg.cancel_scope)
            await either(timer, tg.cancel_scope)


class JobTester:
    """A client, optionally a worker, and the memory broker under them; see :func:`job_tester`."""

    def __init__(self, broker: MemoryBroker, client: Client, worker: Worker | None, *, inline: bool) -> None:
        self.broker = broker
        self.client = client
        self.worker = worker
        self.inline = inline
        #: Every outcome the worker reported since the tester started.
        self.outcomes: list[JobOutcome] = []
        self._performed: list[tuple[JobOutcome, Job | None]] = []
        if worker is not None:
            worker.add_listener(self.outcomes.append)
        clock = broker.clock
        #: For ``ojs_anyio.Scheduler(clock=...)``: cron ticks on the virtual clock (None if real).
        self.scheduler_clock = VirtualSchedulerClock(clock) if isinstance(clock, VirtualClock) else None

    @property
    def names(self) -> Names:
        return self.client.names

    @property
    def virtual(self) -> bool:
        return self.broker.clock.virtual

    # ------------------------------------------------------------ what is waiting

    def enqueued(self, *, queue: str | None = None, type: str | None = None) -> list[Job]:
        """Jobs ready in job queues (``queue``: one OJS queue; default all), oldest first.
        Jobs waiting for a retry or their scheduled time are not ready: see :meth:`scheduled`."""
        jobs = []
        for name, q in self.broker.queues(self.client.conn.url.virtual_host).items():
            ojs_queue = self._job_queue_of(name)
            if ojs_queue is None or (queue is not None and ojs_queue != queue):
                continue
            for msg in q.messages():
                job = _decode(msg.body)
                if job is not None and (type is None or job.type == type):
                    jobs.append(job)
        return jobs

    def scheduled(self, *, queue: str | None = None, type: str | None = None) -> list[Job]:
        """Jobs waiting in retry queues or delay levels (due later), ``queue``/``type`` filtered."""
        jobs = []
        for name, q in self._waiting_queues():
            del name
            for msg in q.messages():
                job = _decode(msg.body)
                if job is None or (queue is not None and job.queue != queue):
                    continue
                if type is None or job.type == type:
                    jobs.append(job)
        return jobs

    def assert_enqueued(
        self,
        *,
        queue: str | None = None,
        type: str | None = None,
        args: Sequence[Any] | None = None,
        count: int | None = None,
    ) -> list[Job]:
        """Assert that matching jobs are ready (``count``: exactly that many; default ≥ 1)."""
        found = [
            j for j in self.enqueued(queue=queue, type=type) if args is None or list(j.args) == list(args)
        ]
        if (count is None and not found) or (count is not None and len(found) != count):
            have = [(j.queue, j.type, j.args) for j in self.enqueued()]
            want = "at least one" if count is None else f"exactly {count}"
            raise AssertionError(
                f"expected {want} job(s) with queue={queue!r} type={type!r} args={args!r}, "
                f"found {len(found)}; ready jobs: {have}"
            )
        return found

    def refute_enqueued(
        self, *, queue: str | None = None, type: str | None = None, args: Sequence[Any] | None = None
    ) -> None:
        """Assert that no matching job is ready."""
        self.assert_enqueued(queue=queue, type=type, args=args, count=0)

    def assert_performed(
        self,
        *,
        type: str | None = None,
        queue: str | None = None,
        outcome: str | None = "completed",
        count: int | None = None,
    ) -> list[JobOutcome]:
        """Assert the worker reported matching outcomes (default: ``completed``; ``count``:
        exactly that many, default ≥ 1)."""
        found = [
            o
            for o in self.outcomes
            if (type is None or o.type == type)
            and (queue is None or o.queue == queue)
            and (outcome is None or o.outcome == outcome)
        ]
        if (count is None and not found) or (count is not None and len(found) != count):
            have = [(o.type, o.queue, o.outcome) for o in self.outcomes]
            want = "at least one" if count is None else f"exactly {count}"
            raise AssertionError(
                f"expected {want} outcome(s) type={type!r} queue={queue!r} outcome={outcome!r}, "
                f"found {len(found)}; outcomes so far: {have}"
            )
        return found

    # ------------------------------------------------------------ running

    async def push(self, type: str, args: Sequence[Any] = (), **options: Any) -> Job | JobOutcome:
        """``client.push(...)``; in inline mode, also run the worker until that job is done and
        return its final outcome (the handler has run when this returns)."""
        job = await self.client.push(type, args, **options)
        if not self.inline:
            return job
        outcomes = await self.drain()
        final = [o for o in outcomes if o.id == job.id and o.outcome != "retried"]
        if not final:
            raise AssertionError(f"job {job.id} ({type}) did not finish while draining: {outcomes}")
        return final[-1]

    async def settle(self) -> None:
        """Wait until the client, the worker and the broker have nothing left to do now."""
        await settle(self.broker)

    async def advance(self, seconds: float) -> None:
        """Move the virtual clock ``seconds`` ahead, step by step through every expiry on the
        way (each step lets the worker and clients react before time moves on)."""
        if not self.virtual:
            raise ArgumentTypeError("advance() needs job_tester(virtual_time=True)")
        await _advance(self.broker, seconds)

    async def drain(self, worker: Worker | None = None, *, timeout: float = 30.0) -> list[JobOutcome]:
        """Run ``worker`` (default: the tester's) until its queues are empty and nothing is
        waiting for a retry or its scheduled time (virtual time jumps to each due message);
        return the outcomes reported meanwhile.  ``timeout`` bounds the real time spent."""
        worker = worker or self.worker
        if worker is None:
            raise UsageError("drain() needs a worker: job_tester(worker=...) or drain(worker)")
        outcomes: list[JobOutcome] = []
        remove = worker.add_listener(outcomes.append)
        remove_all = worker.add_listener(self.outcomes.append) if worker is not self.worker else None
        try:
            with anyio.fail_after(timeout):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(worker.run, self.client)
                    await worker.wait_ready()
                    while True:
                        await self.settle()
                        if not self._idle(worker):
                            await anyio.sleep(QUIET)  # a handler still runs (real time)
                            continue
                        due = self._next_waiting()
                        if due is None:
                            break
                        if self.virtual:
                            self.broker.advance_to(due)
                        else:
                            await anyio.sleep(max(0.0, due - self.broker.clock.now()))
                            self.broker.run_due()
                    worker.stop()
        finally:
            remove()
            if remove_all is not None:
                remove_all()
        return outcomes

    def _idle(self, worker: Worker) -> bool:
        if worker.active:
            return False
        vhost = self.client.conn.url.virtual_host
        queues = self.broker.queues(vhost)
        for queue in worker.queues:
            for name in (self.names.job_queue(queue), self.names.redelivered_queue(queue)):
                q = queues.get(name)
                if q is not None and (q.ready or self.broker.unacked_count(name, vhost)):
                    return False
        return True

    def _waiting_queues(self) -> list[tuple[str, Any]]:
        names = self.names
        vhost = self.client.conn.url.virtual_host
        queues = self.broker.queues(vhost)
        waiting = []
        for name, q in queues.items():
            if q.ready and self._is_waiting_queue(name, names):
                waiting.append((name, q))
        return waiting

    def _is_waiting_queue(self, name: str, names: Names) -> bool:
        """Retry queues, delay levels and delay landing queues: messages due later."""
        return name.startswith(_prefix(names.retry_queue(_MARK, 1))) or name.startswith(
            _prefix(names.delay_landing_queue(_MARK)).rsplit(".", 2)[0] + "."
        )

    def _next_waiting(self) -> float | None:
        due: float | None = None
        for _, q in self._waiting_queues():
            head = q.head()
            if head is not None and head.expires_at is not None:
                due = head.expires_at if due is None else min(due, head.expires_at)
        return due

    def _job_queue_of(self, amqp_queue: str) -> str | None:
        names = self.names
        base = _prefix(names.job_queue(_MARK))
        if not amqp_queue.startswith(base) or self._is_waiting_queue(amqp_queue, names):
            return None
        for special in (
            names.dlx_queue(_MARK),
            names.retry_queue(_MARK, 1),
            names.delay_landing_queue(_MARK),
            names.control_queue(_MARK),
            names.redelivered_queue(_MARK),
        ):
            if amqp_queue.startswith(_prefix(special).rsplit(".", 1)[0] + "."):
                return None
        return amqp_queue[len(base) :] or None


def _prefix(name: str) -> str:
    """The part of an entity name before the queue's placeholder."""
    return name.split(_MARK, 1)[0]


def _decode(body: bytes) -> Job | None:
    try:
        return decode_job(body)
    except Exception:  # not a job (a cron token, a control message)
        return None


@asynccontextmanager
async def job_tester(
    *,
    worker: Worker | None = None,
    virtual_time: bool = True,
    inline: bool = False,
    **connect_options: Any,
) -> AsyncIterator[JobTester]:
    """A private memory broker (virtual clock unless ``virtual_time=False``), a client on it
    (``ojs_anyio.connect`` options pass through) and the tester; gone when the block ends."""
    clock = VirtualClock() if virtual_time else None
    async with MemoryBroker(clock=clock) as broker, connect(broker.url, **connect_options) as client:
        tester = JobTester(broker, client, worker, inline=inline)
        _active.append(tester)
        try:
            yield tester
        finally:
            _active.remove(tester)


# ---------------------------------------------------------------- module-level shortcuts


def _current() -> JobTester:
    if not _active:
        raise RuntimeError(
            "no job tester is active: use `async with job_tester(...)` or the job_tester fixture"
        )
    return _active[-1]


def enqueued(*, queue: str | None = None, type: str | None = None) -> list[Job]:
    return _current().enqueued(queue=queue, type=type)


def assert_enqueued(
    *,
    queue: str | None = None,
    type: str | None = None,
    args: Sequence[Any] | None = None,
    count: int | None = None,
) -> list[Job]:
    """:meth:`JobTester.assert_enqueued` on the innermost active tester."""
    return _current().assert_enqueued(queue=queue, type=type, args=args, count=count)


def refute_enqueued(
    *, queue: str | None = None, type: str | None = None, args: Sequence[Any] | None = None
) -> None:
    _current().refute_enqueued(queue=queue, type=type, args=args)


def assert_performed(
    *,
    type: str | None = None,
    queue: str | None = None,
    outcome: str | None = "completed",
    count: int | None = None,
) -> list[JobOutcome]:
    return _current().assert_performed(type=type, queue=queue, outcome=outcome, count=count)


async def drain(worker: Worker | None = None, *, timeout: float = 30.0) -> list[JobOutcome]:
    """:meth:`JobTester.drain` on the innermost active tester."""
    return await _current().drain(worker, timeout=timeout)


async def advance(seconds: float) -> None:
    """:meth:`JobTester.advance` on the innermost active tester."""
    await _current().advance(seconds)
