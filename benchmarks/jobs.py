"""Job-system throughput: ojs-anyio against Celery, Dramatiq, taskiq-aio-pika and FastStream.

Every system runs on the same RabbitMQ broker with the same workload: N no-op jobs
(default 20,000; ``--n``) whose arguments are two short strings (``"a"``, ``"b"``).
Everything is reported in jobs per second.

Workloads
=========

**Enqueue** (time from the first to the last enqueue call returning; connecting and
declaring the queue happen before the clock starts):

* ours, ``push_batch``: ``client.build()`` N jobs and one ``client.push_batch()`` (publisher
  confirms, pipelined; building the jobs is inside the timed region);
* ours, ``push`` x100: 100 tasks in a task group, each awaiting ``client.push()`` N/100
  times in a row (each push waits for its broker confirm);
* peers, each with its idiomatic enqueue call:

  - Celery ``task.delay("a", "b")`` and Dramatiq ``actor.send("a", "b")``: synchronous
    APIs, so one loop of N calls on one thread.  At their defaults neither waits for a
    publisher confirm (ours always does);
  - taskiq ``task.kiq("a", "b")`` and FastStream ``broker.publish({"a": .., "b": ..})``:
    asyncio APIs, so the same shape as ours, 100 tasks each enqueueing N/100 in a row
    (both wait for publisher confirms at their defaults, through aio-pika).

  For the synchronous peers the first call (which opens the connection and declares the
  queue) is outside the clock and the rate is (N-1)/t.

**Worker** (concurrency 1, 10 and 100): the queue is pre-loaded with N jobs by the enqueue
run before it (and checked to hold N), then a worker is started on it.  The clock runs
from the *first* job's completion to the *N-th* job's completion, so start-up (imports,
forking a pool, declaring topology, registering consumers) is excluded for everyone, and
the rate is (N-1)/t.  Ours runs in this process (a ``Worker.add_listener`` callback
counts completed outcomes, which are reported after the ack); each peer runs in a
subprocess of this script (``--child``) and its task appends an 8-byte timestamp to a
shared file (``O_APPEND``, one ``write`` per job, a few microseconds) which this process
watches until it holds N stamps.  Concurrency maps to:

* ours: ``Worker(concurrency=c)`` (one process; ``Basic.Qos(prefetch=c)``; c tasks);
* ``celery/prefork``: ``celery worker -P prefork -c c`` (c child processes, Celery's
  default pool; it may use both cores) and ``celery/threads``: ``-P threads -c c`` (one
  process); ``--without-gossip --without-mingle --without-heartbeat``, remote control
  off, log level WARNING, otherwise defaults (prefetch multiplier 4, acks before the
  task runs);
* ``dramatiq``: one process, ``dramatiq.Worker(broker, worker_threads=c)`` (= ``dramatiq
  --processes 1 --threads c``; prefetch 2c), default middleware;
* ``taskiq-aio-pika``: one process, ``taskiq.api.run_receiver_task(max_async_tasks=c)``
  (= ``taskiq worker --workers 1 --max-async-tasks c``), broker ``qos=max(10, c)``;
* ``faststream``: one process, one subscriber on a channel with ``prefetch_count=c``
  (aio-pika runs one task per delivery, so prefetch is FastStream's concurrency bound),
  service logging off (``logger=None``; its default logs two lines per message).

Parity: every queue is a durable classic queue and every message persistent.  That is
each peer's default except taskiq-aio-pika (quorum queues by default: set to classic) and
FastStream (non-durable queue, transient messages by default: set to durable and
``persist=True``).  Every system runs under its defaults otherwise.  All handlers are
no-ops apart from the timestamp; ours (``async def noop(ctx, a, b)``) does nothing.

Rounds: round k runs, for every system in turn, one enqueue of N into a fresh queue and
then the worker at the k-th concurrency (1, 10, 100) draining it; ours alternates
``push_batch`` (rounds 1 and 3) and ``push`` x100 (round 2).  Interleaving the systems
makes drift in the machine's load hit them alike.  Each figure is the median of the
rounds that measured it (``--repeat R`` runs everything R times; 3 by default, 1 with
``--smoke``), and the JSON keeps every round's rate.  Each
run's queue (with the peer's side queues and exchanges) is deleted afterwards.  A round
that fails (e.g. the shared broker restarted mid-run: a peer publishing without confirms
then silently loses messages, which the queue-length check catches) is run again, once
by default (``--retries``), after waiting up to 2 minutes for the broker to answer; the
report notes it.  Ours runs on asyncio and on Trio (extra columns); the comparison takes
our best backend.

Known asymmetries, all in the peers' favour: they prefetch more than their concurrency
(Celery 4c, Dramatiq 2c, taskiq ≥ 10) where ours prefetches exactly c, which matters most
at c=1 (one broker round trip per job for us); Celery and Dramatiq enqueue without
publisher confirms and Celery acks before running the task; and our job queues are
priority queues (``x-max-priority`` 10, the OJS default), which cost the broker more per
message than the peers' plain queues.

**Parity** (``--parity``, on by default except with ``--smoke``; ``--no-parity`` skips it):
every peer whose defaults differ from our footing also runs as an ``@parity`` row with its
own documented options closing the gap, where it has them: Celery with
``worker_prefetch_multiplier=1``, ``task_acks_late=True`` and the ``confirm_publish``
transport option; Dramatiq with ``RabbitmqBroker(confirm_delivery=True)`` and its
``dramatiq_queue_prefetch`` set to c; taskiq-aio-pika with ``qos=c``.  FastStream's
defaults are at parity already (confirms through aio-pika, ``prefetch_count=c``).  The
report prints ours ÷ the best peer at the defaults and at parity side by side; the PASS
line asks for ours ahead at parity, and at the defaults too unless the best default peer
was also measured at parity (its lead is then one the parity row takes away).

**Ceiling** (``raw-socket`` column), measured in every round before the systems: our own
topology and exactly the message our push sends (properties, headers, JSON body), moved
by a blocking socket with hand-rolled framing and no client at all.  Enqueue: N copies
published in large batches with publisher confirms (AMQP-014 makes them a MUST), timed
until the last confirm; and, for context, without confirms, timed until the queue holds N
(the broker's ingest rate).  Worker c: Basic.Qos(prefetch=c), nothing decoded, one
Basic.Ack with ``multiple=True`` per read (as ours folds its acks), timed until N are
acked; and again with one Basic.Ack frame per delivery, printed as a second share.  The
report shows ours as a share of the ceiling, and whether 5x the best peer is below the
ceiling at all.

Targets (printed as PASS/MISS, never asserted): ours ≥ 5x the best peer, per scenario.
Enqueue scenarios compare each of our push styles with the best peer enqueue; worker
scenarios compare the same concurrency.

Peers
=====

``pip install -e '.[bench-peers]'`` (celery, dramatiq[rabbitmq], taskiq-aio-pika,
faststream[rabbit]).  All four install into our environment without downgrading anything
(taskiq-aio-pika and FastStream come through aio-pika 10 / aiormq 7, which use pamqp 4
like us).  A peer that isn't importable is reported "not installed".  ``--peer-python PATH``
runs the peer subprocesses with another interpreter (e.g. a separate venv, should a peer
ever need a conflicting pamqp).

Usage::

    python3 benchmarks/jobs.py [--n 20000] [--smoke] [--json] [--url amqp://...]
                               [--peers all|none|celery,dramatiq,taskiq,faststream]
                               [--backends asyncio,trio] [--concurrency 1,10,100]
                               [--repeat 1] [--retries 1] [--peer-python PATH] [--no-parity]
    python3 benchmarks/jobs.py --profile asyncio|trio [--n 20000] [--profile-concurrency 10]
                               [--profile-phases push_batch,push_concurrent,worker]

``--smoke``: N=200, ours only (unless ``--peers`` is given), a few seconds.  ``--profile``
runs cProfile over our ``push_batch``, our ``push`` x100 and our worker draining N, prints
Python calls per job (per push for the enqueues), the top functions
by own time and own time per file, and exits.  Exit status is 1 only when one of our own
scenarios failed to run (after its retries).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import platform
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

# This tree's library before an installed copy, but after PYTHONPATH's entries (which follow
# sys.path[0], the script's folder): compare_trees.py --script points PYTHONPATH at the tree
# under test, and that tree must win.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # fmt: skip

import anyio

import ojs_anyio as ojs
from ojs_anyio import amqp
from ojs_anyio.jobs._push import enqueued_message

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"
TARGET = 5.0
#: Issue 29: push x100 against the raw client held to PUSH_TASKS unconfirmed publishes
#: (asyncio); the shares of the ceiling itself are in _share_goal.
PUSH_WINDOW_TARGET = 0.85
ARGS = ("a", "b")
PUSH_TASKS = 100
CONCURRENCIES = (1, 10, 100)
#: ``Worker(concurrency=1, prefetch=...)`` in the c=1 rounds (ours only).
PREFETCH_C1 = 10
#: The raw worker's key suffix when it acks each delivery with a frame of its own.
PER_DELIVERY = "_per_delivery_ack"
#: The raw worker's drain on a bare asyncio protocol (``hotpath.RawConnection.consume_on_asyncio``).
ON_ASYNCIO = "_bare_asyncio"
STAMP_ENV = "OJS_BENCH_STAMPS"
_STAMP = struct.Struct("<d")

#: peer name -> (module to import, pip requirement)
PEER_MODULES = {
    "celery": ("celery", "celery"),
    "dramatiq": ("dramatiq", "dramatiq[rabbitmq]"),
    "taskiq": ("taskiq_aio_pika", "taskiq-aio-pika"),
    "faststream": ("faststream.rabbit", "faststream[rabbit]"),
}


@dataclass(frozen=True)
class PeerSpec:
    """How one peer child runs: its peer, worker pool (Celery), and whether at parity."""

    peer: str
    pool: str = ""
    parity: bool = False


#: report rows: (row name, how its child runs).  The ``@parity`` rows run the same peer
#: with its own options set to our footing (PARITY_OPTIONS); FastStream is there already.
PEER_ROWS: tuple[tuple[str, PeerSpec], ...] = (
    ("celery/prefork", PeerSpec("celery", "prefork")),
    ("celery/threads", PeerSpec("celery", "threads")),
    ("dramatiq", PeerSpec("dramatiq")),
    ("taskiq-aio-pika", PeerSpec("taskiq")),
    ("faststream", PeerSpec("faststream")),
    ("celery/prefork@parity", PeerSpec("celery", "prefork", parity=True)),
    ("celery/threads@parity", PeerSpec("celery", "threads", parity=True)),
    ("dramatiq@parity", PeerSpec("dramatiq", parity=True)),
    ("taskiq-aio-pika@parity", PeerSpec("taskiq", parity=True)),
)
#: What ``--parity`` changes per peer: only options the peer documents, each closing a gap
#: in the peer's favour (ours always waits for publisher confirms, AMQP-014, prefetches
#: exactly its concurrency and acks after the handler).
PARITY_OPTIONS = {
    "celery": "worker_prefetch_multiplier=1, task_acks_late=True, confirm_publish=True",
    "dramatiq": "RabbitmqBroker(confirm_delivery=True), dramatiq_queue_prefetch=c",
    "taskiq": "AioPikaBroker(qos=c)",
}
#: Peers whose defaults are already at parity (confirms on, prefetch = concurrency).
PARITY_BY_DEFAULT = frozenset({"faststream"})


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# =====================================================================================
# the timestamp file shared by a peer's worker processes


_stamp_fd: tuple[int, int] | None = None  # (pid, fd): re-opened after a fork
#: Set in a peer worker's environment by ``benchmarks/latency.py``: its task then records
#: (the push's wall-clock time, carried as its first argument; its own start) instead of
#: its completion.
LATENCY_ENV = "OJS_BENCH_LATENCY"
_LATENCY_REC = struct.Struct("<dd")
#: The first argument of the probe job a paced enqueue sends (and waits for) before its schedule.
PROBE = "probe"


def stamp_file(prefix: str) -> str:
    """A new, empty file for a child's stamps, in memory (``/dev/shm``) where there is one:
    a write to a file on disk can block for a hundred milliseconds or more while the
    broker's own writes are flushed, stalling the single-threaded worker that stamps (seen
    in ``latency.py``: p99 of 13-180 ms with the file under /tmp, 1.0-1.3 ms under /dev/shm)."""
    shm = "/dev/shm"
    fd, path = tempfile.mkstemp(prefix=prefix, dir=shm if os.path.isdir(shm) else None)
    os.close(fd)
    return path


def _append(record: bytes) -> None:
    """Append one record to the stamp file (one atomic O_APPEND write)."""
    global _stamp_fd
    pid = os.getpid()
    st = _stamp_fd
    if st is None or st[0] != pid:
        st = _stamp_fd = (pid, os.open(os.environ[STAMP_ENV], os.O_WRONLY | os.O_APPEND))
    os.write(st[1], record)


def stamp() -> None:
    """Append this job's completion time (8 bytes)."""
    _append(_STAMP.pack(time.time()))


def on_job(a: str) -> None:
    """What every peer's no-op task does: stamp its completion, or, under ``LATENCY_ENV``,
    (when it was pushed, when it started); the probe's push time is recorded as -1."""
    if os.environ.get(LATENCY_ENV):
        now = time.time()
        _append(_LATENCY_REC.pack(-1.0 if a == PROBE else float(a), now))
    else:
        stamp()


def read_stamps(path: str) -> list[float]:
    with open(path, "rb") as f:
        return _stamps_of(f.read())


def _stamps_of(data: bytes) -> list[float]:
    return [v for (v,) in _STAMP.iter_unpack(data[: len(data) // 8 * 8])]


# =====================================================================================
# broker housekeeping (our own AMQP client)


async def _delete(url: str, queues: list[str], exchanges: list[str]) -> None:
    async with amqp.connect(url) as conn:
        for name in queues:
            with contextlib.suppress(amqp.AMQPError):
                async with conn.channel(confirms=False) as ch:
                    await ch.queue_delete(name)
        for name in exchanges:
            with contextlib.suppress(amqp.AMQPError):
                async with conn.channel(confirms=False) as ch:
                    await ch.exchange_delete(name)


def delete_entities(url: str, queues: Sequence[str], exchanges: Sequence[str] = ()) -> None:
    try:
        anyio.run(_delete, url, list(queues), list(exchanges))
    except Exception as exc:
        log(f"  (cleanup of {queues} failed: {exc})")


async def _message_count(url: str, queue: str) -> int | None:
    async with amqp.connect(url) as conn, conn.channel(confirms=False) as ch:
        try:
            info = await ch.queue_declare(queue, passive=True)
        except amqp.AMQPError:
            return None
        return int(info.message_count)


def wait_for_count(url: str, queue: str, n: int, timeout: float = 30.0) -> int | None:
    """Poll until ``queue`` holds ``n`` messages (or the timeout); return the last count."""
    deadline = time.monotonic() + timeout
    count: int | None = None
    while True:
        count = anyio.run(_message_count, url, queue)
        if count == n or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


# =====================================================================================
# ours


@dataclass
class Rates:
    """Every round's rate per scenario; a scenario's figure is the median of its rounds."""

    samples: dict[str, list[float]] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    #: Client CPU per job in µs (``time.process_time``), per scenario, per round.
    cpu_samples: dict[str, list[float]] = field(default_factory=dict)

    def add(self, key: str, value: float | None) -> None:
        if value is not None:
            self.samples.setdefault(key, []).append(value)

    def add_cpu(self, key: str, us: float | None) -> None:
        if us is not None:
            self.cpu_samples.setdefault(key, []).append(us)

    @property
    def values(self) -> dict[str, float]:
        return {k: statistics.median(v) for k, v in self.samples.items()}

    @property
    def cpu(self) -> dict[str, float]:
        """Client CPU µs per job, the median of the rounds, per scenario."""
        return {k: statistics.median(v) for k, v in self.cpu_samples.items()}

    def dump(self) -> dict[str, object]:
        return {"rates": self.values, "rounds": self.samples, "notes": self.notes, "cpu_us": self.cpu}


async def _ours_round(url: str, n: int, c: int, style: str, out: Rates) -> None:
    """One round: enqueue N with ``style`` (push_batch | push_concurrent), drain with concurrency c."""
    async with ojs.connect(url) as client:
        ch = await client.channel()
        q = f"bench-{uuid.uuid4().hex[:10]}"
        names = client.names
        try:
            await client.declare_queue(q)
            cpu0 = time.process_time()
            if style == "push_batch":
                t0 = time.perf_counter()
                jobs = [client.build("bench.noop", ARGS, queue=q) for _ in range(n)]
                results = await client.push_batch(jobs)
                dt = time.perf_counter() - t0
                bad = sum(not r.ok for r in results)
                if bad:
                    raise RuntimeError(f"push_batch: {bad} of {n} jobs failed")
            else:

                async def pusher(count: int) -> None:
                    for _ in range(count):
                        await client.push("bench.noop", ARGS, queue=q)

                t0 = time.perf_counter()
                async with anyio.create_task_group() as tg:
                    for count in _split(n):
                        tg.start_soon(pusher, count)
                dt = time.perf_counter() - t0
            out.add(style, n / dt)
            out.add_cpu(style, 1e6 * (time.process_time() - cpu0) / n)
            info = await ch.queue_declare(names.job_queue(q), passive=True)
            if info.message_count != n:
                raise RuntimeError(f"queue holds {info.message_count} jobs, expected {n}")
            cpu: list[float] = []
            out.add(f"worker_c{c}", await _ours_worker(client, q, n, c, cpu=cpu))
            out.add_cpu(f"worker_c{c}", cpu[0] if cpu else None)
            if c == 1:
                # What Worker(prefetch=...) buys at c=1 (a departure from 001's FETCH mapping,
                # never the default): the same drain, with PREFETCH_C1 jobs prefetched.
                refill = [client.build("bench.noop", ARGS, queue=q) for _ in range(n)]
                if not all(r.ok for r in await client.push_batch(refill)):
                    raise RuntimeError("push_batch: some jobs failed")
                key = f"worker_c1_prefetch{PREFETCH_C1}"
                cpu = []
                out.add(key, await _ours_worker(client, q, n, 1, cpu=cpu, prefetch=PREFETCH_C1))
                out.add_cpu(key, cpu[0] if cpu else None)
        finally:
            for name in (names.job_queue(q), names.dlx_queue(q), names.control_queue(q),
                         names.redelivered_queue(q)):  # fmt: skip
                with contextlib.suppress(amqp.AMQPError):
                    await ch.queue_delete(name)


async def _ours_worker(
    client: ojs.Client, q: str, n: int, concurrency: int, *, cpu: list[float] | None = None, **options: Any
) -> float:
    """Drain ``q``'s N no-op jobs with a worker (``options`` go to ``ojs.Worker``); jobs/s.

    ``cpu``, if given, receives this process's CPU µs per job between the first and the
    N-th completion (``time.process_time``: start-up and stop excluded, as for the rate)."""
    worker = ojs.Worker(queues=[q], concurrency=concurrency, heartbeat_interval=3600.0, **options)

    @worker.handler("bench.noop")
    async def noop(ctx: ojs.JobContext, a: str, b: str) -> None:
        pass

    done = anyio.Event()
    seen = {"count": 0, "first": 0.0, "last": 0.0, "other": 0, "cpu_first": 0.0, "cpu_last": 0.0}

    def on_outcome(outcome: ojs.JobOutcome) -> None:
        now = time.perf_counter()
        if outcome.outcome != "completed":
            seen["other"] += 1
        seen["count"] += 1
        if seen["count"] == 1:
            seen["first"] = now
            seen["cpu_first"] = time.process_time()
        if seen["count"] == n:
            seen["last"] = now
            seen["cpu_last"] = time.process_time()
            done.set()

    worker.add_listener(on_outcome)
    timeout = max(60.0, n / 50)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run, client)
        with anyio.move_on_after(timeout):
            await done.wait()
        worker.stop()
    if not done.is_set():
        raise RuntimeError(f"worker c={concurrency}: {seen['count']} of {n} jobs done after {timeout:.0f}s")
    if seen["other"]:
        raise RuntimeError(f"worker c={concurrency}: {seen['other']} jobs did not complete")
    if cpu is not None and n > 1:
        cpu.append(1e6 * (seen["cpu_last"] - seen["cpu_first"]) / (n - 1))
    return (n - 1) / (seen["last"] - seen["first"]) if n > 1 else math.nan


async def _job_message(url: str, q: str) -> tuple[str, Any, bytes]:
    """Declare ``q``'s topology with our client and return (exchange, properties, body) of
    one job message exactly as our push would send it."""
    async with ojs.connect(url) as client:
        await client.declare_queue(q)
        job = client.build("bench.noop", ARGS, queue=q)
        now = datetime.now(UTC)
        found = await client.pusher.resolve_route(job, now)
        _pushed, props, body = enqueued_message(job, found, now, trace_headers=None)
        return found.exchange, props, body


def run_ceiling(url: str, n: int, c: int, out: Rates) -> None:
    """The raw-socket ceiling for this round's workloads, on our topology and messages.

    Enqueue: N copies of one real job message (our properties and body, mandatory, to the
    direct exchange and the priority job queue) written in large batches over a blocking
    socket, confirms counted without per-message objects.  Worker: Basic.Qos(prefetch=c),
    nothing decoded, and after each read one Basic.Ack of its last delivery with
    ``multiple=True`` (``hotpath.RawConnection``).  No client, in any language, moves these
    jobs through this broker faster than that.  The worker is measured again acking each
    delivery with a frame of its own (``worker_c{c}`` + ``PER_DELIVERY``), the ceiling issue
    29 was written against, before ours folded acks; and on a bare asyncio protocol
    (``ON_ASYNCIO``), which prices the event loop alone.
    """
    import hotpath  # beside this script

    q = f"bench-{uuid.uuid4().hex[:10]}"
    exchange, props, body = anyio.run(_job_message, url, q)
    job_queue = f"ojs.queue.{q}"
    conn = hotpath.RawConnection(url)

    def fill() -> float:
        """Enqueue N into the empty queue; seconds until the last was confirmed."""
        seconds: float = conn.publish(q, n, exchange=exchange, properties=props, body=body, mandatory=True)
        count = wait_for_count(url, job_queue, n)
        if count != n:
            raise RuntimeError(f"raw enqueue: the queue holds {count} jobs, expected {n}")
        return seconds

    try:
        out.add("enqueue", n / fill())
        out.add(f"worker_c{c}", n / conn.consume(job_queue, n, prefetch=c))
        # The same drain acking each delivery with a frame of its own (the ceiling issue 29
        # was written against; ours folds acks since, so the ceiling above folds them too).
        fill()
        out.add(f"worker_c{c}{PER_DELIVERY}", n / conn.consume(job_queue, n, prefetch=c, fold=False))
        # The same drain on an asyncio event loop with nothing else on it (acks folded, written
        # in data_received): what the loop's own wake-up, read and write cost per read.
        fill()
        floor = hotpath.RawConnection(url)
        out.add(f"worker_c{c}{ON_ASYNCIO}", n / floor.consume_on_asyncio(job_queue, n, prefetch=c))
        # Enqueue again into the now empty queue, never more than PUSH_TASKS unconfirmed:
        # the most that PUSH_TASKS callers each awaiting their own confirm (ours push x100)
        # can reach on this broker.
        window = PUSH_TASKS
        seconds = conn.publish(
            q, n, exchange=exchange, properties=props, body=body, mandatory=True, window=window
        )
        out.add("enqueue_window", n / seconds)
        count = conn.purge(job_queue)
        if count != n:
            raise RuntimeError(f"raw enqueue (window {window}): the queue held {count}, expected {n}")
    finally:
        conn.close()
    # Without confirms (as Celery and Dramatiq enqueue by default), for context: the rate
    # at which the broker takes these messages in when nobody waits for anything.
    loose = hotpath.RawConnection(url, confirms=False)
    try:
        seconds = loose.publish_unconfirmed(exchange, q, job_queue, n, properties=props, body=body)
        out.add("enqueue_unconfirmed", n / seconds)
    finally:
        loose.close()
        delete_entities(url, [job_queue, f"ojs.queue.dlx.{q}", f"ojs.queue.control.{q}"])


def run_ours(url: str, n: int, backend: str, c: int, style: str, out: Rates) -> None:
    anyio.run(_ours_round, url, n, c, style, out, backend=backend)


async def _profile_ours(url: str, n: int, c: int, prof: Any, phase: str) -> None:
    async with ojs.connect(url) as client:
        q = f"bench-{uuid.uuid4().hex[:10]}"
        names = client.names
        ch = await client.channel()
        try:
            await client.declare_queue(q)
            if phase == "push_concurrent":

                async def pusher(count: int) -> None:
                    for _ in range(count):
                        await client.push("bench.noop", ARGS, queue=q)

                prof.enable()
                async with anyio.create_task_group() as tg:
                    for count in _split(n):
                        tg.start_soon(pusher, count)
                prof.disable()
                return
            if phase == "push_batch":
                prof.enable()
            results = await client.push_batch([client.build("bench.noop", ARGS, queue=q) for _ in range(n)])
            if phase == "push_batch":
                prof.disable()
            assert all(r.ok for r in results)
            if phase == "worker":
                prof.enable()
                await _ours_worker(client, q, n, c)
                prof.disable()
        finally:
            for name in (names.job_queue(q), names.dlx_queue(q), names.control_queue(q),
                         names.redelivered_queue(q)):  # fmt: skip
                with contextlib.suppress(amqp.AMQPError):
                    await ch.queue_delete(name)


RSS_SIZES = (20_000, 200_000)
RSS_LIMIT_MB = 20.0


async def _rss_fill(url: str, q: str, n: int) -> None:
    """Declare ``q`` and push ``n`` jobs in batches (in this process, not the measured one)."""
    async with ojs.connect(url) as client:
        await client.declare_queue(q)
        left = n
        while left:
            k = min(left, 10_000)
            results = await client.push_batch([client.build("bench.noop", ARGS, queue=q) for _ in range(k)])
            if not all(r.ok for r in results):
                raise RuntimeError("push_batch: some jobs failed")
            left -= k


async def _rss_drain(url: str, q: str, n: int, c: int) -> None:
    async with ojs.connect(url) as client:
        await _ours_worker(client, q, n, c)


async def _rss_cleanup(url: str, q: str) -> None:
    async with ojs.connect(url) as client:
        ch = await client.channel()
        names = client.names
        for name in (names.job_queue(q), names.dlx_queue(q), names.control_queue(q),
                     names.redelivered_queue(q)):  # fmt: skip
            with contextlib.suppress(amqp.AMQPError):
                await ch.queue_delete(name)


def rss_child(args: argparse.Namespace) -> int:
    """``--rss-child``: drain the queue's ``--n`` jobs, then print the peak RSS in KiB."""
    import resource

    anyio.run(_rss_drain, args.url, args.queue, args.n, args.c, backend=args.rss_backend)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, flush=True)  # KiB on Linux
    return 0


def run_rss(url: str, backends: Sequence[str], c: int) -> bool:
    """Peak RSS of a worker process draining 20,000 and 200,000 jobs (issue 15's memory
    target: the larger within RSS_LIMIT_MB of the smaller).  The jobs are pushed by this
    process first; a fresh subprocess per size runs only the worker."""
    ok = True
    print(f"\nPeak RSS of a worker process (concurrency {c}) draining N jobs:")
    for backend in backends:
        peaks: dict[int, float] = {}
        for n in RSS_SIZES:
            q = f"bench-rss-{uuid.uuid4().hex[:10]}"
            try:
                anyio.run(_rss_fill, url, q, n)
                cmd = [sys.executable, os.path.abspath(__file__), "--rss-child", "--rss-backend", backend,
                       "--url", url, "--queue", q, "--n", str(n), "--c", str(c)]  # fmt: skip
                proc = subprocess.run(cmd, capture_output=True, check=False, timeout=max(120.0, n / 100))
                if proc.returncode != 0:
                    raise RuntimeError(f"worker exited {proc.returncode}: {_tail(proc.stderr)}")
                peaks[n] = int(proc.stdout.split()[-1]) / 1024
            finally:
                anyio.run(_rss_cleanup, url, q)
            log(f"  {backend}: N={n:,}: peak RSS {peaks[n]:.1f} MiB")
        small, large = peaks[RSS_SIZES[0]], peaks[RSS_SIZES[-1]]
        verdict = "met" if large - small <= RSS_LIMIT_MB else "MISSED"
        ok = ok and verdict == "met"
        print(
            f"  {backend:8} N={RSS_SIZES[0]:,}: {small:6.1f} MiB   N={RSS_SIZES[-1]:,}: {large:6.1f} MiB   "
            f"growth {large - small:+.1f} MiB (target <= {RSS_LIMIT_MB:.0f} MiB: {verdict})"
        )
    return ok


def profile_ours(
    url: str,
    n: int,
    c: int,
    backend: str,
    top: int = 35,
    phases: Sequence[str] = ("push_batch", "push_concurrent", "worker"),
) -> None:
    """cProfile our push_batch, our push x100 tasks and our worker draining N at concurrency
    c: Python calls per job (or push), the top functions by own time, own time per file."""
    import cProfile
    import pstats

    for phase in phases:
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        anyio.run(_profile_ours, url, n, c, prof, phase, backend=backend)
        wall = time.perf_counter() - t0
        entries = pstats.Stats(prof).stats  # type: ignore[attr-defined]
        total = sum(v[2] for v in entries.values()) or 1e-9
        label = {"push_batch": "push_batch", "push_concurrent": f"push x{PUSH_TASKS} tasks"}.get(
            phase, f"worker c={c}"
        )
        calls = sum(v[1] for v in entries.values())  # steadier than the times
        print(f"\n== cProfile ojs-anyio/{backend}, {label}, N={n}: profiled {total:.2f}s "
              f"(this phase's run took {wall:.1f}s with setup); {calls / n:.1f} calls/job ==")  # fmt: skip
        print(f"{'own%':>6} {'cum%':>6} {'calls':>9}  function")
        rows = sorted(entries.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
        for (filename, line, func), (_cc, nc, tt, ct, _callers) in rows:
            where = f"{_short(filename)}:{line}:{func}"
            print(f"{100 * tt / total:6.1f} {100 * ct / total:6.1f} {nc:9d}  {where}")
        per_file: dict[str, float] = {}
        for (filename, _line, _func), (_cc, _nc, tt, _ct, _callers) in entries.items():
            key = _short(filename)
            per_file[key] = per_file.get(key, 0.0) + tt
        print("-- own time per file --")
        for key, tt in sorted(per_file.items(), key=lambda kv: kv[1], reverse=True)[:20]:
            print(f"{100 * tt / total:6.1f}  {key}")


def _short(filename: str) -> str:
    for marker in ("/ojs_anyio/", "/codec/", "/anyio/", "/asyncio/", "/trio/", "/pamqp/", "/msgspec/"):
        i = filename.rfind(marker)
        if i >= 0:
            return filename[i + 1 :]
    return os.path.basename(filename) if filename.startswith("/") else filename


# =====================================================================================
# peers: parent side


@dataclass
class PeerRun:
    queue: str
    queues: list[str]
    exchanges: list[str]


def peer_entities(peer: str, q: str) -> PeerRun:
    if peer == "celery":
        return PeerRun(q, [q], [q])
    if peer == "dramatiq":
        return PeerRun(q, [q, f"{q}.DQ", f"{q}.XQ"], [])
    if peer == "taskiq":
        return PeerRun(q, [q, f"{q}.dlq"], [f"{q}.x"])
    return PeerRun(q, [q], [])


def peer_available(peer: str, python: str) -> bool:
    module = PEER_MODULES[peer][0]
    if python == sys.executable:
        try:
            return importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            return False
    probe = subprocess.run([python, "-c", f"import {module}"], capture_output=True, check=False)
    return probe.returncode == 0


def _child_cmd(python: str, url: str, spec: PeerSpec, role: str, q: str, n: int, c: int,
               rate: float = 0.0) -> list[str]:  # fmt: skip
    cmd = [
        python, os.path.abspath(__file__), "--child", spec.peer, "--role", role, "--queue", q,
        "--n", str(n), "--c", str(c), "--pool", spec.pool or "-", "--url", url, "--rate", str(rate),
    ]  # fmt: skip
    return cmd + (["--parity"] if spec.parity else [])


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """End the child we started and its own children (its process group), SIGTERM then SIGKILL."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # pool children that outlived their parent


def peer_enqueue(python: str, url: str, spec: PeerSpec, q: str, n: int) -> float:
    timeout = max(60.0, n / 50)
    proc = subprocess.run(
        _child_cmd(python, url, spec, "enqueue", q, n, 1),
        capture_output=True,
        timeout=timeout,
        check=False,
        start_new_session=True,
    )
    lines = proc.stdout.decode(errors="replace").strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"enqueue child failed ({proc.returncode}): {_tail(proc.stderr)}")
    result = json.loads(lines[-1])
    return float(result["rate"])


def _watch_worker(
    python: str, url: str, spec: PeerSpec, q: str, c: int, path: str, records: int, size: int,
    timeout: float, env: dict[str, str], feed: list[str] | None = None,
) -> bytes:  # fmt: skip
    """Start the peer's worker child at concurrency c and wait until the stamp file at
    ``path`` holds ``records`` records of ``size`` bytes; ``feed``, if given, is a command
    run (to its end) meanwhile, e.g. the paced enqueue.  Returns the file's bytes."""
    err = tempfile.TemporaryFile()  # noqa: SIM115 (closed in the finally below)
    proc = subprocess.Popen(
        _child_cmd(python, url, spec, "worker", q, 0, c),
        stdout=subprocess.DEVNULL,
        stderr=err,
        env=env,
        start_new_session=True,
    )
    feeder: subprocess.Popen[bytes] | None = None
    deadline = time.monotonic() + timeout
    try:
        if feed is not None:
            feeder = subprocess.Popen(
                feed, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True
            )
        while True:
            have = os.stat(path).st_size // size
            if have >= records:
                break
            for p, what in ((proc, "worker"), (feeder, "enqueue")):
                if p is not None and p.poll() not in (None, 0):
                    if p is proc:
                        err.seek(0)
                        why = _tail(err.read())
                    else:
                        why = _tail(p.stderr.read()) if p.stderr is not None else ""
                    raise RuntimeError(f"{what} child exited ({p.returncode}) after {have} jobs: {why}")
            if proc.poll() == 0:
                raise RuntimeError(f"worker child exited after {have} jobs")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timeout: {have} of {records} jobs done after {timeout:.0f}s")
            time.sleep(0.02)
        with open(path, "rb") as f:
            return f.read()
    finally:
        _kill_group(proc)
        if feeder is not None:
            _kill_group(feeder)
            if feeder.stderr is not None:
                feeder.stderr.close()
        err.close()


def peer_worker(python: str, url: str, spec: PeerSpec, q: str, n: int, c: int) -> float:
    path = stamp_file("ojs-bench-stamps-")
    env = dict(os.environ, **{STAMP_ENV: path})
    env.pop(LATENCY_ENV, None)
    try:
        data = _watch_worker(python, url, spec, q, c, path, n, _STAMP.size, max(60.0, n / 50), env)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    stamps = sorted(_stamps_of(data))[:n]
    span = stamps[-1] - stamps[0]
    return (n - 1) / span if n > 1 and span > 0 else math.nan


def peer_latency(
    python: str, url: str, spec: PeerSpec, total: int, rate: float, c: int
) -> list[tuple[float, float]]:
    """For ``benchmarks/latency.py``: the peer's worker at concurrency c on a fresh queue,
    and its enqueue sending ``total`` jobs at ``rate`` per second (after one probe job it
    waits for, so the worker's start-up is not measured), each carrying its push's
    wall-clock time.  Returns (pushed at, handler started at) per job, in push order."""
    q = f"bench.{spec.peer}.{uuid.uuid4().hex[:10]}"
    ent = peer_entities(spec.peer, q)
    path = stamp_file("ojs-bench-latency-")
    env = dict(os.environ, **{STAMP_ENV: path, LATENCY_ENV: "1"})
    feed = _child_cmd(python, url, spec, "pace", q, total, c, rate)
    try:
        data = _watch_worker(
            python, url, spec, q, c, path, total + 1, _LATENCY_REC.size, 120.0 + 3 * total / rate, env, feed
        )
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        delete_entities(url, ent.queues, ent.exchanges)
    records = [r for r in _LATENCY_REC.iter_unpack(data[: len(data) // 16 * 16]) if r[0] >= 0]
    return sorted(records)


def _tail(data: bytes, limit: int = 300) -> str:
    """The last line of a child's stderr (its exception, usually), shortened."""
    lines = [line for line in data.decode(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip()[-limit:] if lines else "(no output)"


def wait_for_broker(url: str, timeout: float = 120.0) -> bool:
    """Wait until the broker accepts a connection (the shared broker may be restarting)."""

    async def probe() -> None:
        async with amqp.connect(url):
            pass

    deadline = time.monotonic() + timeout
    while True:
        try:
            anyio.run(probe)
            return True
        except Exception:
            if time.monotonic() > deadline:
                return False
            time.sleep(1.0)


def run_peer(python: str, url: str, row: str, spec: PeerSpec, n: int, c: int, out: Rates) -> str | None:
    """One round: the peer's enqueue of N into a fresh queue, then its worker at concurrency c.

    Returns None, or what went wrong (the round's rates are then not recorded)."""
    q = f"bench.{spec.peer}.{uuid.uuid4().hex[:10]}"
    ent = peer_entities(spec.peer, q)
    try:
        try:
            enqueue_rate = peer_enqueue(python, url, spec, q, n)
            log(f"  {row}: enqueue {enqueue_rate:,.0f} jobs/s")
        except Exception as exc:
            return f"enqueue failed: {exc}"
        count = wait_for_count(url, q, n)
        if count != n:
            return f"after the enqueue the queue holds {count} messages, expected {n}"
        try:
            rate = peer_worker(python, url, spec, q, n, c)
        except Exception as exc:
            return f"worker c={c} failed: {exc}"
        log(f"  {row}: worker c={c}: {rate:,.0f} jobs/s")
        out.add("enqueue", enqueue_rate)
        out.add(f"worker_c{c}", rate)
        return None
    finally:
        delete_entities(url, ent.queues, ent.exchanges)


# =====================================================================================
# peers: child side (runs in a subprocess: ``--child PEER --role enqueue|worker|pace``)
#
# Each peer's child sets up its client the way its own documentation does (``parity``: with
# the options that bring it to our footing, where it has them, see PARITY_OPTIONS) and hands
# its enqueue call to one of the shared drivers below: ``enqueue`` times N calls
# (throughput), ``pace`` sends them on a steady schedule (``benchmarks/latency.py``).  The
# workers' no-op tasks all call ``on_job``.


def _split(n: int) -> list[int]:
    return [n // PUSH_TASKS + (1 if k < n % PUSH_TASKS else 0) for k in range(PUSH_TASKS)]


def _emit(rate: float) -> None:
    print(json.dumps({"rate": rate}), flush=True)


def _wait_forever() -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()


def _wait_for_probe() -> None:
    """``pace``: block until the worker has run the probe job (its first record is in the file)."""
    path = os.environ[STAMP_ENV]
    deadline = time.monotonic() + 120.0
    while os.stat(path).st_size < _LATENCY_REC.size:
        if time.monotonic() > deadline:
            raise SystemExit("the worker did not run the probe job within 120 s")
        time.sleep(0.01)


def _drive_sync(send: Callable[[str, str], object], opts: argparse.Namespace) -> None:
    """A synchronous enqueue API (Celery, Dramatiq), on this one thread."""
    if opts.role == "enqueue":
        send(*ARGS)  # connects and declares the queue: not timed
        t0 = time.perf_counter()
        for _ in range(opts.n - 1):
            send(*ARGS)
        _emit((opts.n - 1) / (time.perf_counter() - t0))
        return
    send(PROBE, ARGS[1])
    _wait_for_probe()
    t0 = time.monotonic()
    for i in range(opts.n):
        delay = t0 + i / opts.rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)  # a steady load's schedule
        send(repr(time.time()), ARGS[1])


async def _drive_async(send: Callable[[str, str], Awaitable[object]], opts: argparse.Namespace) -> None:
    """An asyncio enqueue API (taskiq, FastStream): the shape of ours, 100 tasks each
    enqueueing N/100 in a row; ``pace``: each send in its own task, on a steady schedule."""
    import asyncio

    if opts.role == "enqueue":

        async def pusher(count: int) -> None:
            for _ in range(count):
                await send(*ARGS)

        t0 = time.perf_counter()
        await asyncio.gather(*(pusher(k) for k in _split(opts.n)))
        _emit(opts.n / (time.perf_counter() - t0))
        return
    await send(PROBE, ARGS[1])
    await asyncio.to_thread(_wait_for_probe)
    loop = asyncio.get_running_loop()
    tasks = []
    t0 = loop.time()
    for i in range(opts.n):
        delay = t0 + i / opts.rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)  # a steady load's schedule
        tasks.append(asyncio.ensure_future(send(repr(time.time()), ARGS[1])))
    await asyncio.gather(*tasks)


def child_celery(opts: argparse.Namespace) -> None:
    import logging

    from celery import Celery

    logging.basicConfig(level=logging.WARNING)
    app = Celery("bench", broker=opts.url)
    app.conf.update(
        task_default_queue=opts.queue,
        task_ignore_result=True,
        worker_enable_remote_control=False,
        worker_send_task_events=False,
        broker_connection_retry_on_startup=True,
    )
    if opts.parity:
        app.conf.update(
            worker_prefetch_multiplier=1,
            task_acks_late=True,
            broker_transport_options={"confirm_publish": True},
        )

    @app.task(name="bench.noop")
    def noop(a: str, b: str) -> None:
        on_job(a)

    if opts.role != "worker":
        _drive_sync(noop.delay, opts)
        app.close()  # release the producer's connection cleanly (not timed)
        return
    app.worker_main(
        ["worker", "-P", opts.pool, "-c", str(opts.c), "-Q", opts.queue, "-l", "WARNING",
         "--without-gossip", "--without-mingle", "--without-heartbeat"]
    )  # fmt: skip


def child_dramatiq(opts: argparse.Namespace) -> None:
    if opts.parity and opts.role == "worker":
        os.environ["dramatiq_queue_prefetch"] = str(opts.c)  # noqa: SIM112 (dramatiq's spelling; read at import)
    import dramatiq
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    broker = RabbitmqBroker(url=opts.url, confirm_delivery=bool(opts.parity))
    dramatiq.set_broker(broker)

    @dramatiq.actor(queue_name=opts.queue, actor_name="bench_noop", broker=broker)
    def noop(a: str, b: str) -> None:
        on_job(a)

    if opts.role != "worker":
        _drive_sync(noop.send, opts)
        broker.close()
        return
    worker = dramatiq.Worker(broker, worker_threads=opts.c)
    worker.start()
    try:
        _wait_forever()
    finally:
        worker.stop()


def child_taskiq(opts: argparse.Namespace) -> None:
    import asyncio

    from taskiq.api import run_receiver_task
    from taskiq_aio_pika import AioPikaBroker, Exchange, Queue, QueueType

    q = opts.queue
    broker = AioPikaBroker(
        opts.url,
        qos=opts.c if opts.parity else max(10, opts.c),
        exchange=Exchange(name=f"{q}.x"),
        task_queues=[Queue(name=q, type=QueueType.CLASSIC)],
        dead_letter_queue=Queue(name=f"{q}.dlq", type=QueueType.CLASSIC),
    )

    @broker.task(task_name="bench.noop")
    async def noop(a: str, b: str) -> None:
        on_job(a)

    async def enqueue() -> None:
        await broker.startup()
        await _drive_async(noop.kiq, opts)
        await broker.shutdown()

    async def work() -> None:
        await run_receiver_task(broker, max_async_tasks=opts.c, run_startup=True)

    asyncio.run(work() if opts.role == "worker" else enqueue())


def child_faststream(opts: argparse.Namespace) -> None:
    import asyncio

    from faststream.rabbit import RabbitBroker, RabbitQueue
    from faststream.rabbit.schemas import Channel

    queue = RabbitQueue(opts.queue, durable=True)

    async def enqueue() -> None:
        broker = RabbitBroker(opts.url, logger=None)
        async with broker:
            await broker.connect()
            await broker.declare_queue(queue)

            async def send(a: str, b: str) -> None:
                await broker.publish({"a": a, "b": b}, queue=queue, persist=True)

            await _drive_async(send, opts)

    async def work() -> None:
        broker = RabbitBroker(opts.url, logger=None, default_channel=Channel(prefetch_count=opts.c))

        @broker.subscriber(queue)
        async def noop(a: str, b: str) -> None:
            on_job(a)

        async with broker:
            await broker.start()
            await asyncio.Event().wait()

    asyncio.run(work() if opts.role == "worker" else enqueue())


def child_main(args: argparse.Namespace) -> int:
    if args.role == "worker":
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    run = {"celery": child_celery, "dramatiq": child_dramatiq, "taskiq": child_taskiq,
           "faststream": child_faststream}  # fmt: skip
    if args.child not in run:
        raise SystemExit(f"unknown peer {args.child!r}")
    run[args.child](args)
    return 0


# =====================================================================================
# report

SCENARIOS = (
    ("push_batch", "enqueue: ours push_batch"),
    ("push_concurrent", f"enqueue: ours push x{PUSH_TASKS} tasks"),
    ("enqueue", "enqueue: peer idiomatic"),
    ("enqueue_unconfirmed", "enqueue: no confirms (raw only)"),
    ("enqueue_window", f"enqueue: ≤{PUSH_TASKS} unconfirmed (raw)"),
)


def compare(
    ours: dict[str, Rates],
    peers: dict[str, Rates | str],
    concurrencies: tuple[int, ...],
    ceiling: Rates,
) -> list[dict[str, Any]]:
    def best_ours(key: str) -> tuple[float | None, str | None]:
        cands = [(r.values[key], b) for b, r in ours.items() if key in r.values]
        return max(cands) if cands else (None, None)

    specs = dict(PEER_ROWS)

    def best_peer(key: str, at_parity: bool = False) -> tuple[float | None, str | None]:
        """The best peer at its defaults, or at parity (its ``@parity`` row, or its default
        where that is parity already)."""
        cands = [
            (r.values[key], name)
            for name, r in peers.items()
            if isinstance(r, Rates)
            and key in r.values
            and (
                not specs[name].parity
                if not at_parity
                else specs[name].parity or specs[name].peer in PARITY_BY_DEFAULT
            )
        ]
        return max(cands) if cands else (None, None)

    rows = []
    pairs = [("push_batch", "enqueue"), ("push_concurrent", "enqueue")]
    pairs += [(f"worker_c{c}", f"worker_c{c}") for c in concurrencies]
    for ours_key, peer_key in pairs:
        o, ob = best_ours(ours_key)
        p, pb = best_peer(peer_key)
        ratio = o / p if o is not None and p else None
        pp, ppb = best_peer(peer_key, at_parity=True)
        ratio_parity = o / pp if o is not None and pp else None
        # Issue 29: ahead of every peer at parity, and at the defaults too unless the best
        # default peer's lead is one its parity row takes away (it was measured at parity).
        excused = pb is not None and f"{pb}@parity" in peers and isinstance(peers[f"{pb}@parity"], Rates)
        ahead = None
        if ratio_parity is not None:
            ahead = ratio_parity >= 1.0 and (ratio is None or ratio >= 1.0 or excused)
        top = ceiling.values.get(peer_key)
        rows.append(
            {
                "scenario": ours_key,
                "ours": o,
                "ours_backend": ob,
                "best_peer": pb,
                "peer": p,
                "ratio": ratio,
                "target": TARGET,
                "verdict": None if ratio is None else ("PASS" if ratio >= TARGET else "MISS"),
                "best_peer_parity": ppb,
                "peer_parity": pp,
                "ratio_parity": ratio_parity,
                "ahead": None if ahead is None else ("PASS" if ahead else "MISS"),
                "ceiling": top,
                "ours_of_ceiling": o / top if o is not None and top else None,
                # Whether TARGET x the best peer is at most the raw-socket ceiling at all.
                "target_reachable": None if p is None or top is None else TARGET * p <= top,
            }
        )
    return rows


def _fmt(v: float | None) -> str:
    return "-" if v is None or math.isnan(v) else f"{v:,.0f}"


#: Issue 29's target for a no-op job at worker c=100 on asyncio: client CPU µs per job.
CPU_TARGET_US = 40.0


def print_cpu(ours: dict[str, Rates], memory: dict[str, Rates], concurrencies: tuple[int, ...]) -> None:
    """Client CPU per job (µs, ``time.process_time`` of this process over the timed region,
    median of the rounds) per scenario and backend: steadier than the rates on a loaded
    machine.  ``--profile`` gives Python calls per job."""
    cols = [f"ojs/{b}" for b in ours] + [f"memory://{b}" for b in memory]
    if not any(r.cpu for r in (*ours.values(), *memory.values())):
        return
    keys = [(k, label) for k, label in SCENARIOS if k in ("push_batch", "push_concurrent")]
    keys += [(f"worker_c{c}", f"worker concurrency={c}") for c in concurrencies]
    if 1 in concurrencies:
        keys.append((f"worker_c1_prefetch{PREFETCH_C1}", f"worker c=1, prefetch={PREFETCH_C1}"))
    print()
    print("client CPU per job, µs (this process, time.process_time; lower is better)")
    print(f"{'scenario':<34}" + "".join(f"{c:>16}" for c in cols))
    for key, label in keys:
        cells = [r.cpu.get(key) for r in (*ours.values(), *memory.values())]
        print(f"{label:<34}" + "".join(f"{'-' if v is None else f'{v:.1f}':>16}" for v in cells))
    asyncio_cpu = ours["asyncio"].cpu.get("worker_c100") if "asyncio" in ours else None
    if asyncio_cpu is not None:
        verdict = "PASS" if asyncio_cpu <= CPU_TARGET_US else "MISS"
        print(f"  worker c=100 on asyncio: {asyncio_cpu:.1f} µs/job (target ≤ {CPU_TARGET_US:g}): {verdict}")


def print_report(
    args: argparse.Namespace,
    n: int,
    ours: dict[str, Rates],
    peers: dict[str, Rates | str],
    comparison: list[dict[str, Any]],
    concurrencies: tuple[int, ...],
    elapsed: float,
    ceiling: Rates,
    memory: dict[str, Rates] | None = None,
) -> None:
    memory = memory or {}
    ran = [name for name, r in peers.items() if isinstance(r, Rates)]
    cols = ["raw-socket"] + [f"ojs/{b}" for b in ours] + [f"memory://{b}" for b in memory] + ran
    width = max(12, *(len(c) + 2 for c in cols))
    keys = [(k, label) for k, label in SCENARIOS]
    keys += [(f"worker_c{c}", f"worker concurrency={c}") for c in concurrencies]
    if 1 in concurrencies:
        keys.append((f"worker_c1_prefetch{PREFETCH_C1}", f"worker c=1, ours prefetch={PREFETCH_C1}"))
    print(f"ojs-anyio job throughput in jobs/s: N={n:,} no-op jobs, args {list(ARGS)}, {_host(args.url)}")
    print(
        f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs;"
        f" the run took {elapsed:.0f}s"
    )
    print()
    print(f"{'scenario':<34}" + "".join(f"{c:>{width}}" for c in cols))
    for key, label in keys:
        cells = [_fmt(ceiling.values.get(key))]
        for b in ours:
            cells.append(_fmt(ours[b].values.get(key)))
        for b in memory:
            cells.append(_fmt(memory[b].values.get(key)))
        for name in ran:
            r = peers[name]
            assert isinstance(r, Rates)
            cells.append(_fmt(r.values.get(key)))
        print(f"{label:<34}" + "".join(f"{c:>{width}}" for c in cells))
    for name, r in peers.items():
        if isinstance(r, str):
            print(f"  {name}: {r}")
        else:
            for key, note in r.notes.items():
                print(f"  {name} {key}: {note}")
    for b, r in ours.items():
        for key, note in r.notes.items():
            print(f"  ojs/{b} {key}: {note}")
    for b, r in memory.items():
        for key, note in r.notes.items():
            print(f"  memory://{b} {key}: {note}")
    for key, note in ceiling.notes.items():
        print(f"  raw-socket {key}: {note}")
    if memory:
        print("  memory://: ours on the in-process broker (no network, no RabbitMQ); not compared with peers")
    print("  raw-socket: the ceiling, the same job messages and topology over a bare socket")
    loose = ceiling.values.get("enqueue_unconfirmed")
    if loose is not None:
        print(
            f"  raw-socket without publisher confirms (which AMQP-014 requires): {_fmt(loose)}/s,"
            " the broker's own ingest rate for these messages"
        )
    print()
    print("ours (best backend) ÷ raw-socket ceiling; is the target (5x the best peer) below the ceiling?")
    for row in comparison:
        if row["ceiling"] is None or row["ours"] is None:
            continue
        reach = row["target_reachable"]
        verdict = (
            "no peer result"
            if reach is None
            else f"target {_fmt(TARGET * row['peer'])}/s "
            + ("is below the ceiling" if reach else "is ABOVE the ceiling: no client can reach it here")
        )
        print(f"  {row['scenario']:<18} {row['ours_of_ceiling']:6.1%} of {_fmt(row['ceiling'])}; {verdict}")
    print()
    print(
        "ours per backend ÷ raw-socket ceiling (issue 29's targets: workers ≥ 85% on asyncio and "
        "≥ 80% on Trio, push_batch ≥ 90% on asyncio); are 1x and 2x the best peer below the ceiling?"
    )
    for row in comparison:
        top = row["ceiling"]
        if not top:
            continue
        goal = _share_goal(row["scenario"])
        shares = []
        for b, r in ours.items():
            v = r.values.get(row["scenario"])
            if v is not None:
                mark = "" if b not in goal else (" PASS" if v / top >= goal[b] else " MISS")
                shares.append(f"{b} {v / top:.0%}{mark}")
        peer = row["peer"]
        room = "no peer result"
        if peer is not None:
            room = f"1x peer {'below' if peer <= top else 'ABOVE'}, "
            room += f"2x peer {'below' if 2 * peer <= top else 'ABOVE'}"
        print(f"  {row['scenario']:<18} {', '.join(shares)}; {room}")
    # The other raw drains of each worker scenario, as further shares.
    others = (
        (PER_DELIVERY, "acking each delivery with a frame of its own", "issue 29's first ceiling"),
        (ON_ASYNCIO, "on a bare asyncio protocol", "{share} of the blocking socket: the event loop's cost"),
    )
    for suffix, how, what in others:
        for row in comparison:
            other = ceiling.values.get(row["scenario"] + suffix)
            if not other or not row["ceiling"]:
                continue
            sc = row["scenario"]
            shares = ", ".join(f"{b} {r.values[sc] / other:.0%}" for b, r in ours.items() if sc in r.values)
            note = what.format(share=f"{other / row['ceiling']:.0%}")
            print(f"  {sc:<18} against the raw worker {how} ({_fmt(other)}/s, {note}): {shares}")
    windowed = ceiling.values.get("enqueue_window")
    if windowed:
        shares = []
        for b, r in ours.items():
            if "push_concurrent" in r.values:
                share = r.values["push_concurrent"] / windowed
                mark = "" if b != "asyncio" else (" PASS" if share >= PUSH_WINDOW_TARGET else " MISS")
                shares.append(f"{b} {share:.0%}{mark}")
        print(
            f"  push_concurrent against the raw socket held to {PUSH_TASKS} unconfirmed publishes"
            f" ({_fmt(windowed)}/s; target ≥ {PUSH_WINDOW_TARGET:.0%} on asyncio): {', '.join(shares)}"
        )
    print()
    print(f"ours (best backend) ÷ best peer, target ≥ {TARGET:g}x:")
    for row in comparison:
        if row["ours"] is None:
            line = "ours not measured"
        elif row["peer"] is None:
            line = f"{_fmt(row['ours'])} ({row['ours_backend']}); no peer result"
        else:
            line = (
                f"{_fmt(row['ours'])} ({row['ours_backend']}) ÷ {_fmt(row['peer'])} ({row['best_peer']})"
                f" = {row['ratio']:.2f}x  {row['verdict']}"
            )
        print(f"  {row['scenario']:<18} {line}")
    if any(row["peer_parity"] is not None for row in comparison):
        print()
        print(
            "ours (best backend) ÷ best peer at its defaults | at parity (confirms on, prefetch = c, acks "
            "after the task, where the peer's own options allow; target: ahead at parity, and at the "
            "defaults unless the lead is one parity takes away):"
        )
        for row in comparison:
            if row["ours"] is None:
                continue
            default = (
                "-" if row["ratio"] is None else f"{row['ratio']:.2f}x {row['best_peer']} {_fmt(row['peer'])}"
            )
            at_parity = (
                "-"
                if row["ratio_parity"] is None
                else f"{row['ratio_parity']:.2f}x {row['best_peer_parity']} {_fmt(row['peer_parity'])}"
            )
            print(f"  {row['scenario']:<18} {default:<40} | {at_parity:<44} {row['ahead'] or ''}")


def _share_goal(scenario: str) -> dict[str, float]:
    """Issue 29's share of the raw-socket ceiling for a scenario, per backend: every worker
    scenario at the same prefetch, and push_batch of the confirmed ceiling (asyncio)."""
    if scenario.startswith("worker"):
        return {"asyncio": 0.85, "trio": 0.80}
    if scenario == "push_batch":
        return {"asyncio": 0.90}
    return {}


def _host(url: str) -> str:
    return url.rsplit("@", 1)[-1]


# =====================================================================================


# =====================================================================================
# `ojs-anyio worker --processes P` (issue 14): the CLI's supervisor and worker processes.
# Separate from the rounds above: one fresh queue per P, pre-loaded with N jobs, drained by
# `python -m ojs_anyio.cli worker jobs:cli_bench_worker --processes P --concurrency C`; the
# handler stamps completion times into a shared file (as the peers do) and the rate is
# (N-1) / (last stamp - first stamp), so process start-up is excluded.

CLI_QUEUE_ENV = "OJS_BENCH_QUEUE"


def cli_bench_worker() -> ojs.Worker:
    """The worker the CLI runs (``jobs:cli_bench_worker``): a no-op that stamps its completion."""
    worker = ojs.Worker(queues=[os.environ[CLI_QUEUE_ENV]], concurrency=10, heartbeat_interval=3600.0)

    @worker.handler("bench.noop")
    async def noop(ctx: ojs.JobContext, a: str, b: str) -> None:
        stamp()

    return worker


async def _cli_preload(url: str, q: str, n: int) -> None:
    async with ojs.connect(url) as client:
        await client.declare_queue(q)
        results = await client.push_batch([client.build("bench.noop", ARGS, queue=q) for _ in range(n)])
        if not all(r.ok for r in results):
            raise RuntimeError("pre-loading the queue failed")


def run_cli_processes(url: str, n: int, c: int, processes: Sequence[int]) -> dict[str, float]:
    """Jobs/s of ``ojs-anyio worker --processes P --concurrency c`` for each P, in this run."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rates: dict[str, float] = {}
    for p in processes:
        q = f"bench-cli-{uuid.uuid4().hex[:8]}"
        path = stamp_file("ojs-bench-stamps-")
        env = dict(os.environ, **{STAMP_ENV: path, CLI_QUEUE_ENV: q, "OJS_AMQP_URL": url})
        env["PYTHONPATH"] = os.pathsep.join([root, os.path.join(root, "codec"), env.get("PYTHONPATH", "")])
        proc: subprocess.Popen[bytes] | None = None
        try:
            anyio.run(_cli_preload, url, q, n)
            cmd = [sys.executable, "-m", "ojs_anyio.cli", "worker", "jobs:cli_bench_worker"]
            cmd += ["--processes", str(p), "--concurrency", str(c), "--log-level", "WARNING"]
            proc = subprocess.Popen(
                cmd,
                cwd=os.path.dirname(os.path.abspath(__file__)),
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            deadline = time.monotonic() + max(60.0, n / 50)
            while os.stat(path).st_size // 8 < n:
                if proc.poll() is not None:
                    why = _tail(proc.stderr.read()) if proc.stderr is not None else ""
                    raise RuntimeError(f"ojs-anyio worker exited ({proc.returncode}): {why}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"timeout: {os.stat(path).st_size // 8} of {n} jobs done")
                time.sleep(0.02)
            stamps = sorted(read_stamps(path))[:n]
            span = stamps[-1] - stamps[0]
            rates[f"processes_{p}"] = (n - 1) / span if span > 0 else math.nan
        finally:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # the supervisor stops its workers gracefully
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    _kill_group(proc)
            if proc is not None and proc.stderr is not None:
                proc.stderr.close()
            with contextlib.suppress(OSError):
                os.unlink(path)
            delete_entities(url, [q, f"ojs.queue.{q}", f"ojs.queue.dlx.{q}", f"ojs.queue.control.{q}"])
    return rates


def print_cli_processes(rates: dict[str, float], c: int) -> None:
    if not rates:
        return
    print()
    print(f"ojs-anyio worker --processes P --concurrency {c} (CLI supervisor, same run), jobs/s:")
    for key, rate in rates.items():
        print(f"  {key.replace('_', ' ', 1):<14} {_fmt(rate)}")


# =====================================================================================


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--n", type=int, default=None, help="jobs per scenario (default 20000; 200 with --smoke)")
    ap.add_argument("--url", default=os.environ.get("OJS_AMQP_URL", DEFAULT_URL))
    ap.add_argument("--smoke", action="store_true", help="tiny N, ours only unless --peers is given")
    ap.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="PATH",
        help="write one JSON object to PATH (stdout without one); benchmarks/plot.py draws it",
    )
    ap.add_argument("--peers", default=None, help="all | none | comma list of " + ",".join(PEER_MODULES))
    ap.add_argument("--backends", default="asyncio,trio", help="our backends (asyncio,trio)")
    ap.add_argument(
        "--memory",
        default="asyncio",
        help="backends for the memory:// column (the in-process broker, no network; 'none' to skip)",
    )
    ap.add_argument("--concurrency", default=",".join(map(str, CONCURRENCIES)), help="worker concurrencies")
    ap.add_argument(
        "--repeat", type=int, default=None, help="rounds, of which each figure is the median (default 3)"
    )
    ap.add_argument("--profile", choices=["asyncio", "trio"], help="cProfile our push_batch and worker; exit")
    ap.add_argument("--profile-concurrency", type=int, default=10, help="worker concurrency for --profile")
    ap.add_argument(
        "--profile-phases",
        default="push_batch,push_concurrent,worker",
        help="what --profile runs (push_batch, push_concurrent, worker)",
    )
    ap.add_argument("--retries", type=int, default=1, help="re-runs of a round that failed (default 1)")
    ap.add_argument("--peer-python", default=sys.executable, help="interpreter for the peer subprocesses")
    ap.add_argument("--cli-processes", default="1,2", help="`ojs-anyio worker --processes P` runs ('' skips)")
    ap.add_argument("--cli-concurrency", type=int, default=10, help="--concurrency of those runs")
    # child mode (internal)
    ap.add_argument("--child", choices=list(PEER_MODULES), help=argparse.SUPPRESS)
    ap.add_argument("--role", choices=["enqueue", "worker", "pace"], help=argparse.SUPPRESS)
    ap.add_argument("--rate", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--queue", help=argparse.SUPPRESS)
    ap.add_argument("--c", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--pool", default="-", help=argparse.SUPPRESS)
    ap.add_argument(
        "--parity",
        action="store_true",
        default=None,
        help="also run each peer at parity (its own options set to our footing: "
        + "; ".join(f"{k}: {v}" for k, v in PARITY_OPTIONS.items())
        + "; default on unless --smoke)",
    )
    ap.add_argument("--no-parity", dest="parity", action="store_false", help="peers at their defaults only")
    ap.add_argument(
        "--rss",
        action="store_true",
        help="peak RSS of a worker subprocess draining 20,000 and then 200,000 jobs "
        "(per --backends, at the last --concurrency); exit",
    )
    ap.add_argument("--rss-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rss-backend", default="asyncio", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.child:
        return child_main(args)
    if args.rss_child:
        return rss_child(args)
    if args.rss:
        c = int(args.concurrency.split(",")[-1]) if args.concurrency else 100
        return 0 if run_rss(args.url, [b for b in args.backends.split(",") if b], c) else 1

    n = args.n or (200 if args.smoke else 20_000)
    repeat = args.repeat or (1 if args.smoke else 3)
    if n < 2:
        ap.error("--n must be at least 2")
    if args.profile:
        profile_ours(
            args.url, n, args.profile_concurrency, args.profile, phases=args.profile_phases.split(",")
        )
        return 0
    concurrencies = tuple(int(c) for c in args.concurrency.split(",") if c)
    backends = [b for b in args.backends.split(",") if b]
    peers_arg = args.peers or ("none" if args.smoke else "all")
    wanted = [] if peers_arg == "none" else list(PEER_MODULES) if peers_arg == "all" else peers_arg.split(",")
    for p in wanted:
        if p not in PEER_MODULES:
            ap.error(f"unknown peer {p!r}")

    started = time.monotonic()
    failed = False
    ours: dict[str, Rates] = {b: Rates() for b in backends}
    # The in-process memory:// broker: a column of its own, never compared with the peers
    # (they all talk to RabbitMQ over TCP).
    memory: dict[str, Rates] = {b: Rates() for b in args.memory.split(",") if b and b != "none"}
    ceiling = Rates()
    peers: dict[str, Rates | str] = {}
    parity = args.parity if args.parity is not None else not args.smoke
    for row, spec in PEER_ROWS:
        peer = spec.peer
        if spec.parity and not parity:
            continue
        if peer not in wanted:
            if args.peers is None and args.smoke:
                peers[row] = "skipped (--smoke; pass --peers to include)"
        elif not peer_available(peer, args.peer_python):
            peers[row] = f"not installed (pip install '{PEER_MODULES[peer][1]}')"
        else:
            peers[row] = Rates()
    # Rounds interleave the systems, so drift in the machine's load hits all of them alike.
    for rnd in range(repeat):
        for i, c in enumerate(concurrencies):
            style = "push_batch" if i % 2 == 0 else "push_concurrent"
            key = f"round {rnd + 1}.{i + 1}"
            log(f"{key}: raw-socket ceiling: enqueue N={n}, consume+ack at prefetch {c}")
            try:
                run_ceiling(args.url, n, c, ceiling)
                log("  " + ", ".join(f"{k} {v:,.0f}" for k, v in ceiling.values.items()))
            except Exception as exc:
                log(f"  failed: {exc!r}")
                ceiling.notes[key] = "error: " + repr(exc)
            for backend in backends:
                for attempt in range(1 + args.retries):
                    log(f"round {rnd + 1}.{i + 1}: ojs-anyio/{backend}: {style} N={n}, worker c={c}")
                    key = f"round {rnd + 1}.{i + 1}"
                    try:
                        run_ours(args.url, n, backend, c, style, ours[backend])
                        log("  " + ", ".join(f"{k} {v:,.0f}" for k, v in ours[backend].values.items()))
                        break
                    except Exception as exc:
                        log(f"  failed: {exc!r}")
                        traceback.print_exc(file=sys.stderr)
                        final = attempt == args.retries
                        failed = failed or final
                        ours[backend].notes[key] = ("error: " if final else "retried after: ") + repr(exc)
                        if not final:
                            wait_for_broker(args.url)
            for backend, rates in memory.items():
                log(f"round {rnd + 1}.{i + 1}: ojs-anyio/{backend} on memory://: {style} N={n}, worker c={c}")
                try:
                    run_ours("memory://bench", n, backend, c, style, rates)
                    log("  " + ", ".join(f"{k} {v:,.0f}" for k, v in rates.values.items()))
                except Exception as exc:
                    log(f"  failed: {exc!r}")
                    traceback.print_exc(file=sys.stderr)
                    failed = True
                    rates.notes[f"round {rnd + 1}.{i + 1}"] = "error: " + repr(exc)
            for row, spec in PEER_ROWS:
                rates = peers.get(row)
                if not isinstance(rates, Rates):
                    continue
                for attempt in range(1 + args.retries):
                    log(f"round {rnd + 1}.{i + 1}: {row}: enqueue N={n}, worker c={c}")
                    why = run_peer(args.peer_python, args.url, row, spec, n, c, rates)
                    if why is None:
                        break
                    log(f"  {row}: {why}")
                    prefix = "error: " if attempt == args.retries else "retried after: "
                    rates.notes[f"round {rnd + 1}.{i + 1}"] = prefix + why
                    if attempt < args.retries:
                        wait_for_broker(args.url)

    cli_rates: dict[str, float] = {}
    cli_processes = [int(p) for p in args.cli_processes.split(",") if p]
    if cli_processes:
        log(f"ojs-anyio worker --processes {args.cli_processes}: N={n}, concurrency {args.cli_concurrency}")
        try:
            cli_rates = run_cli_processes(args.url, n, args.cli_concurrency, cli_processes)
            log("  " + ", ".join(f"{k} {v:,.0f}" for k, v in cli_rates.items()))
        except Exception as exc:
            log(f"  failed: {exc!r}")
            failed = True
    comparison = compare(ours, peers, concurrencies, ceiling)
    elapsed = time.monotonic() - started
    if args.json:
        dump = open(args.json, "w") if args.json != "-" else sys.stdout  # noqa: SIM115
        print(
            json.dumps(
                {
                    "benchmark": "jobs",
                    "n": n,
                    "args": list(ARGS),
                    "smoke": args.smoke,
                    "repeat": repeat,
                    "python": platform.python_version(),
                    "cpus": os.cpu_count(),
                    "seconds": round(elapsed, 1),
                    "ours": {b: r.dump() for b, r in ours.items()},
                    "memory": {b: r.dump() for b, r in memory.items()},
                    "peers": {
                        name: (r.dump() if isinstance(r, Rates) else {"status": r})
                        for name, r in peers.items()
                    },
                    "ceiling": ceiling.dump(),
                    "comparison": comparison,
                    "target": TARGET,
                    "cli_worker": {"concurrency": args.cli_concurrency, "rates": cli_rates},
                }
            ),
            file=dump,
        )
        if dump is not sys.stdout:
            dump.close()
            print_report(args, n, ours, peers, comparison, concurrencies, elapsed, ceiling)
            print_cpu(ours, memory, concurrencies)
    else:
        print_report(args, n, ours, peers, comparison, concurrencies, elapsed, ceiling, memory)
        print_cpu(ours, memory, concurrencies)
        print_cli_processes(cli_rates, args.cli_concurrency)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
