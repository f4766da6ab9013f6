"""Job latency at a light, steady load: push → handler start and push → ack, p50/p99/max.

::

    python3 benchmarks/latency.py [--rate 200] [--seconds 20] [--rounds 1] [--backends asyncio,trio]
                                  [--peers dramatiq,taskiq,faststream|none] [--peer-python PATH]
    python3 benchmarks/latency.py --smoke        # 50 jobs/s for 1 s, a few seconds in all

Per backend: a client in this process pushes no-op jobs at ``--rate`` jobs/s for
``--seconds`` (each push in its own task, started on a fixed schedule, so a slow confirm
does not delay the next push), and a ``Worker(concurrency=--concurrency)`` in a child
process of its own (as every peer's worker is; ``--same-process`` runs it on a second
connection in this process instead, sharing its event loop) runs them, after a probe job
it has run (so its start-up is not measured).  Each job carries the wall-clock time its
push started; the handler records when it starts (push → start), and an outcome listener
when the worker reported it, which is after its ``Basic.Ack`` was written or queued for
the batched flush (push → ack).  The first ``--warmup`` jobs are not counted.  Throughput
is not the point: at this rate every system is idle most of the time, and what is
measured is the path one job takes through the client, the broker and the worker.

The peers (``--peers``, default ``dramatiq,taskiq,faststream``; ``none`` skips them) run
in the same run, through ``benchmarks/jobs.py``'s peer children (the same clients, options
and no-op tasks as its throughput rounds, at their defaults; ``--parity`` runs them at
parity instead): a worker child at the same concurrency on a fresh queue, and an enqueue
child that sends one probe job, waits until the worker ran it (so its start-up is not
measured), then sends its jobs on the same schedule, each carrying its push's wall-clock
time as its first argument; the task records that and its own start.  A peer's ack cannot
be observed from outside its worker, so for the peers only push → start is measured.  The
PASS/MISS line asks for ours (the best backend) to have the lowest p50 and the lowest p99
push → start of all systems measured.

The machine's load shows in the tail (p99, max): run it on a quiet machine, and read the
p50 first.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import struct
import subprocess
import sys
import time
import uuid

import anyio

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jobs  # beside this script: the peers' children

import ojs_anyio as ojs
from ojs_anyio import amqp

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"
SCRIPT = os.path.abspath(__file__)


def percentile(values: list[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


_RECORD = struct.Struct("<ddd")  # (pushed at, handler started, reported after the ack)


async def worker_child(url: str, q: str, concurrency: int, path: str) -> None:
    """``--worker-child``: our worker in a process of its own (as the peers' are), appending
    one record per job to ``path``: (pushed at, handler started, outcome reported)."""
    started: dict[str, tuple[float, float]] = {}
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    worker = ojs.Worker(queues=[q], concurrency=concurrency, heartbeat_interval=3600.0)

    @worker.handler("latency.noop")
    async def noop(ctx: ojs.JobContext, at: float) -> None:
        started[ctx.id] = (at, time.time())

    def on_outcome(outcome: ojs.JobOutcome) -> None:
        if outcome.id is not None and outcome.outcome == "completed":
            at, start = started.pop(outcome.id)
            os.write(fd, _RECORD.pack(at, start, time.time()))

    worker.add_listener(on_outcome)
    async with ojs.connect(url) as consumer:
        await worker.run(consumer)


def measure_split(
    url: str, rate: float, seconds: float, concurrency: int, warmup: int, backend: str
) -> dict[str, list[float]]:
    """One backend's run with the worker in a child process (``worker_child``), pushed to
    from this one: after a probe job the child has run, ``total`` jobs on the schedule."""
    total = warmup + max(1, round(rate * seconds))
    q = f"latency-{uuid.uuid4().hex[:10]}"
    path = jobs.stamp_file("ojs-latency-")
    cmd = [sys.executable, SCRIPT, "--worker-child", q, "--stamps", path, "--backends", backend,
           "--concurrency", str(concurrency), "--url", url]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        anyio.run(_push_to_child, url, q, rate, seconds, total, proc, path, backend=backend)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
        with open(path, "rb") as f:
            data = f.read()
        os.unlink(path)
    whole = data[: len(data) // _RECORD.size * _RECORD.size]
    rows = sorted(r for r in _RECORD.iter_unpack(whole) if r[0] >= 0)[warmup:]
    return {
        "start": [1000 * (start - at) for at, start, _ in rows],
        "ack": [1000 * (acked - at) for at, _, acked in rows],
    }


async def _paced_pushes(client: ojs.Client, q: str, total: int, rate: float) -> None:
    """Push ``total`` no-op jobs at ``rate`` per second, each stamped with its push time."""

    async def push_one() -> None:
        await client.push("latency.noop", [time.time()], queue=q)

    t0 = anyio.current_time()
    async with anyio.create_task_group() as pushers:
        for i in range(total):
            delay = t0 + i / rate - anyio.current_time()
            if delay > 0:
                await anyio.sleep(delay)  # a steady load's schedule (not a synchronisation)
            pushers.start_soon(push_one)


async def _delete_queues(client: ojs.Client, q: str) -> None:
    """Delete what the run declared for queue ``q``."""
    ch = await client.channel()
    names = client.names
    for name in (names.job_queue(q), names.dlx_queue(q), names.control_queue(q), names.redelivered_queue(q)):
        try:
            await ch.queue_delete(name)
        except amqp.AMQPError:
            pass


async def _push_to_child(
    url: str, q: str, rate: float, seconds: float, total: int, proc: subprocess.Popen[bytes], path: str
) -> None:
    async def records(count: int, timeout: float) -> None:
        with anyio.fail_after(timeout):
            while (await anyio.Path(path).stat()).st_size < count * _RECORD.size:
                if proc.poll() is not None:
                    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                    raise RuntimeError(f"the worker child exited ({proc.returncode}): {err[-300:]}")
                await anyio.sleep(0.01)  # polling the child's file

    async with ojs.connect(url) as client:
        await client.declare_queue(q)
        try:
            await client.push("latency.noop", [-1.0], queue=q)  # the probe: the worker is up
            await records(1, 60.0)

            await _paced_pushes(client, q, total, rate)
            await records(total + 1, max(30.0, 2 * seconds))
        finally:
            await _delete_queues(client, q)


async def measure(
    url: str, rate: float, seconds: float, concurrency: int, warmup: int
) -> dict[str, list[float]]:
    """One backend's run, the worker in this process: the latencies in ms, by path
    (``start``, ``ack``)."""
    total = warmup + max(1, round(rate * seconds))
    q = f"latency-{uuid.uuid4().hex[:10]}"
    started: dict[str, float] = {}
    acked: dict[str, float] = {}
    pushed_at: dict[str, float] = {}
    done = anyio.Event()
    worker = ojs.Worker(queues=[q], concurrency=concurrency, heartbeat_interval=3600.0)

    @worker.handler("latency.noop")
    async def noop(ctx: ojs.JobContext, at: float) -> None:
        started[ctx.id] = time.time()
        pushed_at[ctx.id] = at

    def on_outcome(outcome: ojs.JobOutcome) -> None:
        if outcome.id is not None and outcome.outcome == "completed":
            acked[outcome.id] = time.time()
            if len(acked) == total:
                done.set()

    worker.add_listener(on_outcome)
    async with ojs.connect(url) as client, ojs.connect(url) as consumer:
        await client.declare_queue(q)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.run, consumer)
                await worker.wait_ready()

                await _paced_pushes(client, q, total, rate)
                with anyio.fail_after(max(30.0, 2 * seconds)):
                    await done.wait()
                worker.stop()
        finally:
            await _delete_queues(client, q)
    order = sorted(pushed_at, key=pushed_at.__getitem__)[warmup:]
    return {
        "start": [1000 * (started[j] - pushed_at[j]) for j in order],
        "ack": [1000 * (acked[j] - pushed_at[j]) for j in order],
    }


def measure_peer(python: str, url: str, spec: jobs.PeerSpec, rate: float, seconds: float, c: int,
                 warmup: int) -> dict[str, list[float]]:  # fmt: skip
    """One peer's run: push → handler start in ms, in push order, the first ``warmup`` dropped."""
    total = warmup + max(1, round(rate * seconds))
    records = jobs.peer_latency(python, url, spec, total, rate, c)
    if len(records) < total:
        raise RuntimeError(f"{len(records)} of {total} jobs recorded")
    return {"start": [1000 * (started - pushed) for pushed, started in records[warmup:]]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--url", default=os.environ.get("OJS_AMQP_URL", DEFAULT_URL))
    ap.add_argument("--rate", type=float, default=None, help="jobs per second (default 200; 50 with --smoke)")
    ap.add_argument("--seconds", type=float, default=None, help="seconds of pushing (20; 1 with --smoke)")
    ap.add_argument("--concurrency", type=int, default=10, help="the worker's concurrency (default 10)")
    ap.add_argument("--warmup", type=int, default=None, help="jobs not counted (default 50; 5 with --smoke)")
    ap.add_argument("--backends", default="asyncio,trio")
    ap.add_argument(
        "--peers",
        default=None,
        help="comma list of " + ",".join(jobs.PEER_MODULES) + ", or none "
        "(default dramatiq,taskiq,faststream; none with --smoke)",
    )
    ap.add_argument("--parity", action="store_true", help="run the peers at parity (see benchmarks/jobs.py)")
    ap.add_argument("--peer-python", default=sys.executable, help="interpreter for the peer subprocesses")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds, --seconds split among them")
    ap.add_argument(
        "--same-process",
        action="store_true",
        help="run our worker in the pushing process (default: a process of its own, as the peers')",
    )
    ap.add_argument("--worker-child", metavar="QUEUE", help=argparse.SUPPRESS)
    ap.add_argument("--stamps", help=argparse.SUPPRESS)
    ap.add_argument("--smoke", action="store_true", help="50 jobs/s for 1 s: a check that it runs")
    args = ap.parse_args(argv)
    if args.worker_child:
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        anyio.run(
            worker_child, args.url, args.worker_child, args.concurrency, args.stamps, backend=args.backends
        )
        return 0
    rate = args.rate or (50.0 if args.smoke else 200.0)
    seconds = args.seconds or (1.0 if args.smoke else 20.0)
    warmup = args.warmup if args.warmup is not None else (5 if args.smoke else 50)
    c = args.concurrency
    peers_arg = args.peers or ("none" if args.smoke else "dramatiq,taskiq,faststream")
    wanted = [] if peers_arg == "none" else peers_arg.split(",")
    for p in wanted:
        if p not in jobs.PEER_MODULES:
            ap.error(f"unknown peer {p!r}")
    results: dict[str, dict[str, list[float]]] = {}
    notes: list[str] = []
    specs: dict[str, jobs.PeerSpec] = {}
    for peer in wanted:
        name = peer + ("@parity" if args.parity else "")
        if not jobs.peer_available(peer, args.peer_python):
            notes.append(f"{name}: not installed (pip install '{jobs.PEER_MODULES[peer][1]}')")
        else:  # Celery's default pool; the others have one worker kind
            specs[name] = jobs.PeerSpec(peer, "prefork" if peer == "celery" else "", parity=args.parity)
    # Rounds interleave the systems (each round a share of --seconds, with its own warm-up),
    # so drift in the machine's load hits them alike.
    span = seconds / args.rounds
    for rnd in range(args.rounds):
        for backend in [b for b in args.backends.split(",") if b]:
            print(f"round {rnd + 1}: ojs-anyio/{backend}: {rate:g} jobs/s for {span:g} s, concurrency {c}",
                  file=sys.stderr)  # fmt: skip
            if args.same_process:
                got = anyio.run(measure, args.url, rate, span, c, warmup, backend=backend)
            else:
                got = measure_split(args.url, rate, span, c, warmup, backend)
            for path, values in got.items():
                results.setdefault(f"ojs/{backend}", {}).setdefault(path, []).extend(values)
        for name, spec in specs.items():
            print(
                f"round {rnd + 1}: {name}: {rate:g} jobs/s for {span:g} s, concurrency {c}", file=sys.stderr
            )
            try:
                got = measure_peer(args.peer_python, args.url, spec, rate, span, c, warmup)
            except Exception as exc:
                notes.append(f"{name} round {rnd + 1}: failed: {exc}")
                continue
            results.setdefault(name, {}).setdefault("start", []).extend(got["start"])
    load = os.getloadavg()[0]
    print(f"\njob latency in ms at {rate:g} jobs/s for {seconds:g} s in {args.rounds} interleaved round(s) "
          f"(the first {warmup} jobs of each not counted), "
          f"concurrency {c}; load average {load:.2f} on {os.cpu_count()} CPUs")  # fmt: skip
    print(f"{'system':<26}{'path':<16}{'n':>7}{'p50':>9}{'p99':>9}{'max':>9}")
    for system, paths in results.items():
        for path, label in (("start", "push → start"), ("ack", "push → ack")):
            values = paths.get(path)
            if not values:
                continue
            print(f"{system:<26}{label:<16}{len(values):>7}{statistics.median(values):>9.2f}"
                  f"{percentile(values, 99):>9.2f}{max(values):>9.2f}")  # fmt: skip
    for note in notes:
        print(f"  {note}")
    ours = {k: v["start"] for k, v in results.items() if k.startswith("ojs/")}
    others = {k: v["start"] for k, v in results.items() if not k.startswith("ojs/")}
    if ours and others:
        for label, stat in (("p50", statistics.median), ("p99", lambda v: percentile(v, 99))):
            best_ours = min(ours, key=lambda k: stat(ours[k]))
            best_peer = min(others, key=lambda k: stat(others[k]))
            o, p = stat(ours[best_ours]), stat(others[best_peer])
            verdict = "PASS" if o <= p else "MISS"
            print(f"lowest push → start {label} of all systems: ours {o:.2f} ms ({best_ours}), "
                  f"best peer {p:.2f} ms ({best_peer}): {verdict}")  # fmt: skip
    return 1 if wanted and not others else 0


if __name__ == "__main__":
    sys.exit(main())
