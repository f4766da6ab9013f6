"""What being in a workflow costs (docs/workflows.md), ours beside Celery and Dramatiq, in one run.

Ours (``ojs_anyio``), on one worker (concurrency 50) in this process:

* ``plain``: N no-op jobs pushed one by one, drained by the worker: the time from the first
  push to the last job done, per job;
* ``batch``: the same N jobs as one ``ojs.batch`` with an ``on_complete`` callback: from
  ``client.batch(...)`` to the callback's start, per job (the difference to ``plain`` is
  the per-job overhead of being in a group);
* ``chain``: a chain of ``N / 10`` steps, per step, against ``plain-seq``: as many jobs
  pushed one at a time, each after the previous one is done (what a chain replaces);
* ``fan-in latency``: ``--batches`` batches of 10 jobs, one after another, from the last
  job's handler return to its batch's callback start, p50 and p99 in ms.

Then the same shape for each peer that is installed, on the same broker (``--url``) with
Redis as its result backend (``--redis``, a database other than 0), its worker a separate
process (``--child PEER --role worker``, started by a driver process ``--role driver``,
which enqueues and times):

* **Celery**: ``plain`` = ``task.delay()``; ``batch`` = ``chord(header)(callback)`` (the
  header's results in the Redis backend, the callback gets them as a list); ``chain`` =
  ``chain(*signatures)`` (each step's result travels to the next in the message);
  worker ``celery worker -P threads -c 50`` (one process, like ours; ``--without-gossip
  --without-mingle --without-heartbeat``, remote control and events off);
* **Dramatiq**: ``plain`` = ``actor.send()``; ``batch`` = ``group(messages)`` with
  ``add_completion_callback`` (the ``GroupCallbacks`` middleware counts down a barrier in
  Redis; the members store their results through the ``Results`` middleware in Redis, as
  the callback does not receive them); ``chain`` = ``pipeline(messages)``; worker
  ``dramatiq.Worker(broker, worker_threads=50)``.

A peer's handler writes one 16-byte record (kind, ``time.time()``) to a FIFO when it
returns (a job) or starts (a callback); the driver reads them on a thread and times from
them as ours does from its events.  Each peer's queues and exchanges on the broker, and its
keys in Redis (a unique prefix for Celery's; the message keys and barrier keys the driver
created for Dramatiq's), are deleted afterwards.  A peer that is not installed, or no
Redis, is reported skipped with the reason; ``pip install -e '.[bench]'`` installs both
peers and the Redis client.

Usage::

    python3 benchmarks/workflows.py [--n 2000] [--batches 50] [--backend asyncio|trio]
                                    [--url amqp://guest:guest@127.0.0.1:5672/]
                                    [--redis redis://127.0.0.1:6379/13]
                                    [--peers all|none|celery,dramatiq] [--smoke]

``--url memory://`` runs ours on the in-memory broker (no peers).  Wall-clock figures, as
noisy as the machine: not timed assertions.  Exit status 1 only when ours failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import anyio
from jobs import _kill_group, _tail, delete_entities, peer_entities

import ojs_anyio as ojs
from ojs_anyio import amqp
from ojs_anyio.jobs._workflows import workflow_queues

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"
DEFAULT_REDIS = "redis://127.0.0.1:6379/13"
CONCURRENCY = 50
FAN_IN_SIZE = 10
PEERS = ("celery", "dramatiq")
#: peer -> modules its driver and worker import (``pip install -e '.[bench]'`` has them all)
PEER_IMPORTS = {"celery": ("celery", "redis"), "dramatiq": ("dramatiq", "pika", "redis")}
EVENTS_ENV = "OJS_BENCH_WF_EVENTS"
#: one record per handler event on the FIFO: (kind, time.time()), 16 bytes (atomic writes)
_REC = struct.Struct("<dd")
JOB, CALLBACK, STOP = 0.0, 1.0, -1.0


class Bench:
    def __init__(self, client: ojs.Client, q: str) -> None:
        self.client, self.q = client, q
        self.worker = ojs.Worker(
            queues=[q], concurrency=CONCURRENCY, middleware=[ojs.WorkflowMiddleware(client)]
        )
        self.done = 0
        self.target = -1
        self.all_done = anyio.Event()
        self.last_return = 0.0
        self.callbacks: list[tuple[float, float]] = []  # (callback start, last job return)
        self.callback_seen = anyio.Event()
        self.handles: list[Any] = []

        async def job(ctx: ojs.JobContext, *args: Any) -> int:
            self.last_return = time.perf_counter()
            self.done += 1
            if self.done == self.target:
                self.all_done.set()
            return 1

        async def callback(ctx: ojs.JobContext) -> None:
            self.callbacks.append((time.perf_counter(), self.last_return))
            self.callback_seen.set()

        self.worker.register("bench.job", job)
        self.worker.register("bench.callback", callback)

    def expect(self, n: int) -> None:
        self.done, self.target, self.all_done = 0, n, anyio.Event()

    async def wait_callback(self) -> None:
        await self.callback_seen.wait()
        self.callback_seen = anyio.Event()

    def step(self) -> ojs.Step:
        return ojs.step("bench.job", queue=self.q)

    async def plain(self, n: int) -> float:
        self.expect(n)
        started = time.perf_counter()
        for _ in range(n):
            await self.client.push("bench.job", queue=self.q)
        await self.all_done.wait()
        return (time.perf_counter() - started) / n

    async def batch(self, n: int) -> float:
        started = time.perf_counter()
        self.handles.append(
            await self.client.batch(
                [self.step() for _ in range(n)], on_complete=ojs.step("bench.callback", queue=self.q)
            )
        )
        await self.wait_callback()
        return (time.perf_counter() - started) / n

    async def plain_sequential(self, n: int) -> float:
        started = time.perf_counter()
        for _ in range(n):
            self.expect(1)
            await self.client.push("bench.job", queue=self.q)
            await self.all_done.wait()
        return (time.perf_counter() - started) / n

    async def chain(self, n: int) -> float:
        self.expect(n)
        started = time.perf_counter()
        self.handles.append(await self.client.chain(*(self.step() for _ in range(n))))
        await self.all_done.wait()
        return (time.perf_counter() - started) / n

    async def fan_in(self, batches: int) -> list[float]:
        self.callbacks.clear()
        for _ in range(batches):
            self.handles.append(
                await self.client.batch(
                    [self.step() for _ in range(FAN_IN_SIZE)],
                    on_complete=ojs.step("bench.callback", queue=self.q),
                )
            )
            await self.wait_callback()
        return [(start - last) * 1000 for start, last in self.callbacks]


async def ours(args: argparse.Namespace) -> dict[str, float]:
    q = f"bwf{uuid.uuid4().hex[:10]}"
    async with ojs.connect(args.url) as client:
        bench = Bench(client, q)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(bench.worker.run, client)
                await bench.worker.wait_ready()
                plain = await bench.plain(args.n)
                in_batch = await bench.batch(args.n)
                seq = await bench.plain_sequential(args.steps)
                in_chain = await bench.chain(args.steps)
                latencies = await bench.fan_in(args.batches)
                bench.worker.stop()
        finally:
            with anyio.CancelScope(shield=True):
                await _cleanup(args.url, client, q, bench.handles)
    return figures(plain, in_batch, seq, in_chain, latencies)


def figures(
    plain: float, batch: float, seq: float, chain: float, latencies_ms: list[float]
) -> dict[str, float]:
    lat = sorted(latencies_ms)
    return {
        "plain": plain * 1e6,
        "batch": batch * 1e6,
        "seq": seq * 1e6,
        "chain": chain * 1e6,
        "p50": statistics.median(lat),
        "p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))],
    }


async def _cleanup(url: str, client: ojs.Client, q: str, handles: list[Any]) -> None:
    names = client.names
    queues = [names.job_queue(q), names.dlx_queue(q), names.redelivered_queue(q), names.control_queue(q)]
    for handle in handles:
        queues += workflow_queues(names.prefix, handle.envelope)
    async with amqp.connect(url) as conn, conn.channel(confirms=False) as ch:
        for name in queues:
            await ch.queue_delete(name)


# =====================================================================================
# peers: the handlers' side (worker processes)


_event_fd: tuple[int, int] | None = None  # (pid, fd)


def emit(kind: float) -> None:
    """One record on the driver's FIFO: a job returned (JOB) or a callback started."""
    global _event_fd
    st = _event_fd
    if st is None or st[0] != os.getpid():
        st = _event_fd = (os.getpid(), os.open(os.environ[EVENTS_ENV], os.O_WRONLY))
    os.write(st[1], _REC.pack(kind, time.time()))


# =====================================================================================
# peers: the driver's side


class Events:
    """The records the peer's handlers write to the FIFO, read on a thread of the driver."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDWR)  # a reader and a writer: never blocks, never EOF
        self.cond = threading.Condition()
        self.jobs: list[float] = []  # job return times, in arrival order
        self.callbacks: list[tuple[float, int]] = []  # (callback start, jobs recorded before it)
        self.thread = threading.Thread(target=self._read, name="events")
        self.thread.start()

    def _read(self) -> None:
        buf = b""
        while True:
            buf += os.read(self.fd, 1 << 16)
            whole = len(buf) // _REC.size * _REC.size
            records, buf = buf[:whole], buf[whole:]
            with self.cond:
                for kind, t in _REC.iter_unpack(records):
                    if kind == STOP:
                        return
                    if kind == JOB:
                        self.jobs.append(t)
                    else:
                        self.callbacks.append((t, len(self.jobs)))
                self.cond.notify_all()

    def wait(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        with self.cond:
            if not self.cond.wait_for(done, timeout):
                raise TimeoutError(f"{what}: not seen within {timeout:.0f} s")

    def close(self) -> None:
        os.write(self.fd, _REC.pack(STOP, 0.0))
        self.thread.join()
        os.close(self.fd)


def drive(
    ev: Events,
    n: int,
    steps: int,
    batches: int,
    send: Callable[[], object],
    send_batch: Callable[[int], object],
    send_chain: Callable[[int], object],
) -> dict[str, float]:
    """The rounds of ``ours``, in the same order, for a peer (``send*`` enqueue)."""
    timeout = max(120.0, n / 10)

    def jobs_reach(count: int, what: str) -> None:
        ev.wait(lambda: len(ev.jobs) >= count, timeout, what)

    def callbacks_reach(count: int, what: str) -> None:
        ev.wait(lambda: len(ev.callbacks) >= count, timeout, what)

    send()  # warm-up: the worker is consuming (its start-up is not timed)
    jobs_reach(1, "warm-up job")

    base = len(ev.jobs)
    t0 = time.perf_counter()
    for _ in range(n):
        send()
    jobs_reach(base + n, "plain jobs")
    plain = (time.perf_counter() - t0) / n

    cb = len(ev.callbacks)
    t0 = time.perf_counter()
    send_batch(n)
    callbacks_reach(cb + 1, "batch callback")
    batch = (time.perf_counter() - t0) / n

    t0 = time.perf_counter()
    for _ in range(steps):
        base = len(ev.jobs)
        send()
        jobs_reach(base + 1, "sequential job")
    seq = (time.perf_counter() - t0) / steps

    base = len(ev.jobs)
    t0 = time.perf_counter()
    send_chain(steps)
    jobs_reach(base + steps, "chain steps")
    chain = (time.perf_counter() - t0) / steps

    latencies = []
    for _ in range(batches):
        cb, first = len(ev.callbacks), len(ev.jobs)
        send_batch(FAN_IN_SIZE)
        callbacks_reach(cb + 1, "fan-in callback")
        start, upto = ev.callbacks[cb]
        latencies.append((start - max(ev.jobs[first:upto])) * 1000)
    return figures(plain, batch, seq, chain, latencies)


def celery_app(args: argparse.Namespace) -> tuple[Any, Any, Any, Any]:
    """The app and its three tasks (``job`` stores no result, ``member`` does: a chord's header)."""
    from celery import Celery

    app = Celery("bwf", broker=args.url, backend=args.redis)
    app.conf.update(
        task_default_queue=args.queue,
        worker_enable_remote_control=False,
        worker_send_task_events=False,
        broker_connection_retry_on_startup=True,
        result_expires=3600,
        result_backend_transport_options={"global_keyprefix": f"{args.tag}:"},
    )

    @app.task(name="bwf.job", ignore_result=True)
    def job(*_: Any) -> int:
        emit(JOB)
        return 1

    @app.task(name="bwf.member")
    def member(*_: Any) -> int:
        emit(JOB)
        return 1

    @app.task(name="bwf.callback", ignore_result=True)
    def callback(_results: list[int]) -> None:
        emit(CALLBACK)

    return app, job, member, callback


def child_celery(args: argparse.Namespace) -> dict[str, float] | None:
    app, job, member, callback = celery_app(args)
    if args.role == "worker":
        app.worker_main(
            ["worker", "-P", "threads", "-c", str(CONCURRENCY), "-Q", args.queue, "-l", "WARNING",
             "--without-gossip", "--without-mingle", "--without-heartbeat"]
        )  # fmt: skip
        return None
    import redis
    from celery import chain, chord

    ev = Events(os.environ[EVENTS_ENV])
    try:
        return drive(
            ev, args.n, args.steps, args.batches,
            send=job.delay,
            send_batch=lambda k: chord(member.s() for _ in range(k))(callback.s()),
            send_chain=lambda k: chain(*(job.s() for _ in range(k))).apply_async(),
        )  # fmt: skip
    finally:
        ev.close()
        app.close()
        r = redis.Redis.from_url(args.redis)
        for key in r.scan_iter(match=f"{args.tag}:*", count=1000):
            r.delete(key)
        r.close()


def dramatiq_broker(args: argparse.Namespace, barriers: list[str]) -> tuple[Any, Any, Any, Any, Any]:
    """The broker (Results and GroupCallbacks in Redis) and its actors; ``barriers`` collects
    the group barriers' keys this process creates, to delete them."""
    import dramatiq
    from dramatiq.brokers.rabbitmq import RabbitmqBroker
    from dramatiq.middleware import GroupCallbacks
    from dramatiq.rate_limits.backends import RedisBackend as RateLimitsRedis
    from dramatiq.results import Results
    from dramatiq.results.backends import RedisBackend as ResultsRedis

    class Barriers(RateLimitsRedis):  # type: ignore[misc]
        def add(self, key: str, value: int, ttl: int) -> bool:
            barriers.append(key)
            return bool(super().add(key, value, ttl))

    results = ResultsRedis(url=args.redis, namespace=f"{args.tag}-results")
    broker = RabbitmqBroker(url=args.url)
    broker.add_middleware(Results(backend=results, result_ttl=3_600_000))
    broker.add_middleware(GroupCallbacks(Barriers(url=args.redis)))
    dramatiq.set_broker(broker)

    @dramatiq.actor(queue_name=args.queue, actor_name="bwf_job", broker=broker)
    def job(*_: Any) -> None:  # a pipeline passes None on (a value would be logged as discarded)
        emit(JOB)

    @dramatiq.actor(queue_name=args.queue, actor_name="bwf_member", store_results=True, broker=broker)
    def member(*_: Any) -> int:
        emit(JOB)
        return 1

    @dramatiq.actor(queue_name=args.queue, actor_name="bwf_callback", broker=broker)
    def callback() -> None:
        emit(CALLBACK)

    return broker, results, job, member, callback


def child_dramatiq(args: argparse.Namespace) -> dict[str, float] | None:
    import dramatiq

    barriers: list[str] = []
    broker, results, job, member, callback = dramatiq_broker(args, barriers)
    if args.role == "worker":
        worker = dramatiq.Worker(broker, worker_threads=CONCURRENCY)
        worker.start()
        threading.Event().wait()  # until the driver's parent ends this process
        return None
    result_keys: list[str] = []

    def send_batch(k: int) -> None:
        messages = [member.message() for _ in range(k)]
        result_keys.extend(results.build_message_key(m) for m in messages)
        members = dramatiq.group(messages)
        members.add_completion_callback(callback.message())
        members.run()

    ev = Events(os.environ[EVENTS_ENV])
    try:
        return drive(
            ev, args.n, args.steps, args.batches,
            send=job.send,
            send_batch=send_batch,
            send_chain=lambda k: dramatiq.pipeline(job.message() for _ in range(k)).run(),
        )  # fmt: skip
    finally:
        ev.close()
        broker.close()
        keys = result_keys + barriers + [f"{key}@events" for key in barriers]
        for i in range(0, len(keys), 500):
            results.client.delete(*keys[i : i + 500])


def child_main(args: argparse.Namespace) -> int:
    import signal

    if args.role == "worker":
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    out = child_celery(args) if args.child == "celery" else child_dramatiq(args)
    if out is not None:
        print(json.dumps(out), flush=True)
    return 0


# =====================================================================================
# peers: the parent's side


def peer_missing(peer: str, redis_url: str) -> str | None:
    """Why ``peer`` cannot run here, or None."""
    for module in PEER_IMPORTS[peer]:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            return f"{module} is not installed (pip install -e '.[bench]')"
    where = urlsplit(redis_url)
    try:
        socket.create_connection((where.hostname or "127.0.0.1", where.port or 6379), timeout=3).close()
    except OSError as exc:
        return f"no Redis at {where.hostname}:{where.port or 6379} ({exc})"
    return None


def run_peer(peer: str, args: argparse.Namespace) -> dict[str, float]:
    """The peer's worker and driver as two processes (each its own process group), ended and
    cleaned up afterwards; the driver's figures."""
    tag = f"bwf{uuid.uuid4().hex[:10]}"
    with tempfile.TemporaryDirectory(prefix="ojs-bwf-") as tmp:
        fifo = os.path.join(tmp, "events")
        os.mkfifo(fifo)
        env = {**os.environ, EVENTS_ENV: fifo}

        def child(role: str, log: Any) -> subprocess.Popen[bytes]:
            cmd = [
                sys.executable, os.path.abspath(__file__), "--child", peer, "--role", role,
                "--queue", tag, "--tag", tag, "--url", args.url, "--redis", args.redis,
                "--n", str(args.n), "--steps", str(args.steps), "--batches", str(args.batches),
            ]  # fmt: skip
            # The driver prints its figures; the worker's output (Celery's banner) goes to its log.
            out = subprocess.PIPE if role == "driver" else log
            return subprocess.Popen(cmd, env=env, stdout=out, stderr=log, start_new_session=True)

        with (
            open(os.path.join(tmp, "worker.log"), "wb") as wlog,
            open(os.path.join(tmp, "driver.log"), "wb") as dlog,
        ):
            worker = child("worker", wlog)
            try:
                driver = child("driver", dlog)
                try:
                    out, _ = driver.communicate(timeout=max(300.0, args.n / 2))
                finally:
                    _kill_group(driver)
            finally:
                _kill_group(worker)
                entities = peer_entities(peer, tag)
                delete_entities(args.url, entities.queues, entities.exchanges)
        lines = out.decode(errors="replace").strip().splitlines()
        if driver.returncode != 0 or not lines:
            with (
                open(os.path.join(tmp, "driver.log"), "rb") as f,
                open(os.path.join(tmp, "worker.log"), "rb") as g,
            ):
                raise RuntimeError(f"driver: {_tail(f.read())}; worker: {_tail(g.read())}")
        result: dict[str, float] = json.loads(lines[-1])
        return result


ROWS = (
    ("plain push + run, µs/job", "plain", None),
    ("in a batch (chord, group), µs/job", "batch", "plain"),
    ("pushed one after another, µs/job", "seq", None),
    ("chain (pipeline), µs/step", "chain", "seq"),
)


def report(args: argparse.Namespace, columns: dict[str, dict[str, float]], skipped: dict[str, str]) -> None:
    print(f"broker {args.url.split('@')[-1]}  N={args.n}  chain steps {args.steps}  "
          f"fan-in: {args.batches} batches of {FAN_IN_SIZE}")  # fmt: skip
    names = list(columns)
    width = 36
    print(" " * width + "".join(f"{name:>22}" for name in names))
    for label, key, base in ROWS:
        cells = []
        for name in names:
            value = columns[name][key]
            extra = f" ({value - columns[name][base]:+,.0f})" if base else ""
            cells.append(f"{value:,.0f}{extra}")
        print(f"{label:<{width}}" + "".join(f"{c:>22}" for c in cells))
    cells = [f"{columns[n]['p50']:.1f} / {columns[n]['p99']:.1f}" for n in names]
    print(f"{'fan-in latency p50 / p99, ms':<{width}}" + "".join(f"{c:>22}" for c in cells))
    for peer, why in skipped.items():
        print(f"{peer}: skipped: {why}")


def main(args: argparse.Namespace) -> int:
    columns = {f"ours/{args.backend}": anyio.run(ours, args, backend=args.backend)}
    skipped: dict[str, str] = {}
    wanted = PEERS if args.peers == "all" else [p for p in args.peers.split(",") if p and p != "none"]
    for peer in wanted:
        if args.url.startswith("memory:"):
            skipped[peer] = "the peers need a RabbitMQ --url"
            continue
        why = peer_missing(peer, args.redis)
        if why is None:
            try:
                columns[peer] = run_peer(peer, args)
                continue
            except Exception as exc:
                why = f"FAILED: {exc}"
        skipped[peer] = why
    report(args, columns, skipped)
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--n", type=int, help="jobs of the plain and batch rounds (default 2000; 50 with --smoke)"
    )
    ap.add_argument("--steps", type=int, help="chain steps (default N / 10, at least 2)")
    ap.add_argument(
        "--batches", type=int, help="batches of the fan-in latency round (default 50; 5 with --smoke)"
    )
    ap.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    ap.add_argument("--url", default=DEFAULT_URL)
    ap.add_argument("--redis", default=DEFAULT_REDIS, help="the peers' result backend")
    ap.add_argument("--peers", default="all", help="all, none, or a list: celery,dramatiq")
    ap.add_argument("--smoke", action="store_true", help="tiny N (a quick check that it runs)")
    ap.add_argument("--child", choices=PEERS, help=argparse.SUPPRESS)
    ap.add_argument("--role", choices=["driver", "worker"], help=argparse.SUPPRESS)
    ap.add_argument("--queue", help=argparse.SUPPRESS)
    ap.add_argument("--tag", help=argparse.SUPPRESS)
    parsed = ap.parse_args()
    parsed.n = parsed.n or (50 if parsed.smoke else 2000)
    parsed.steps = parsed.steps or max(2, parsed.n // 10)
    parsed.batches = parsed.batches or (5 if parsed.smoke else 50)
    sys.exit(child_main(parsed) if parsed.child else main(parsed))
