"""The event bus (``ojs_anyio.events``) against the raw-socket ceiling and its peers.

One topology for everyone: a durable topic exchange, a durable queue bound with ``rec.*``
(and the dead-letter arguments the bus declares), persistent JSON events of ~120 bytes
published with routing key ``rec.read``, ``mandatory``, publisher confirms, a message id,
a timestamp and a content type.  Each scenario, in one run:

* **publish**: N events until all are confirmed;
* **consume+handle**: the N events consumed at prefetch 512, each decoded into its type
  (``msgspec`` Struct; dict for the peers that have no Struct support) by a handler, and
  acked after it returned.

Clients:

* ``raw-socket``: the ceiling (``benchmarks/hotpath.py``'s blocking-socket client): the
  same message pre-encoded once and written in 64 KiB batches; consume parses frames in
  bulk and acks each delivery, decoding nothing.
* ``events/asyncio``, ``events/trio``: ``bus.publish_window()`` (the bulk path) and
  ``bus.subscribe(..., payload_type=Event, prefetch=512)``.
* ``faststream``: ``RabbitBroker.publish(..., persist=True)`` over ``asyncio.gather``
  batches; a ``@broker.subscriber`` with ``Channel(prefetch_count=512)``.
* ``aio-pika``: ``exchange.publish`` over ``asyncio.gather`` batches; ``queue.iterator()``.

A peer that is not installed is skipped with a note (``pip install -e .[bench,bench-peers]``).
Rates are the median of ``--repeat`` rounds (rounds interleave the scenarios); every round
is printed.  Both workloads are bound by the broker (persistent messages), whose speed
swings between rounds: with the same client, consume has ranged from ~15,000 to ~74,000
events/s on a 2-CPU machine.  So the report also gives, per scenario and phase, the CPU
time per event of the client (this process) and of a local broker (its ``beam.smp``), and
a ceiling target passes only when both the ratio of the medians and the median of the
per-round ratios reach it.  The figures depend on the machine's load: on a shared machine
they are indicative only.

    python3 benchmarks/events.py [--n 20000] [--repeat 7] [--smoke] [--json] [--url amqp://...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import anyio
import msgspec
from hotpath import (
    RawConnection,
    Result,
    Skipped,
    _url_parts,
    peer_ratios,
    print_rates,
    print_shares,
    run_rounds,
)

import ojs_codec
from ojs_anyio import amqp, events

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"
PREFETCH = 512
WINDOW = 1024
PEER_BATCH = 1024
ROUTING_KEY = "rec.read"
BINDING = "rec.*"
SCENARIO_TIMEOUT = 180.0
ATTEMPTS = 2
CEILING = "raw-socket"
OURS = ("events/asyncio", "events/trio")
PEERS = ("faststream", "aio-pika")
TARGETS = (  # (scenario, minimum fraction of the ceiling)
    ("events/asyncio", 0.85),
    ("events/trio", 0.75),
)
PEER_TARGET = ("faststream", 3.0)
WORKLOADS = (("publish", "publish+confirm"), ("consume", "consume+handle"))


class Event(msgspec.Struct):
    id: int
    store: str
    operation: str
    record: dict[str, str]


PAYLOAD = Event(12345, "mongo", "read", {"collection": "users", "key": "a1b2c3d4e5f6", "by": "rBroker"})
PAYLOAD_DICT = msgspec.to_builtins(PAYLOAD)
BODY = msgspec.json.encode(PAYLOAD)


def _find_broker_pid() -> int | None:
    """The local broker's Erlang VM (the one ``beam.smp`` process), to read its CPU time;
    ``None`` when there is none or more than one (a cluster on this machine)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/comm") as f:
                    if f.read().strip() == "beam.smp":
                        found.append(int(entry.name))
            except OSError:
                continue
    return found[0] if len(found) == 1 else None


_BROKER_PID: int | None = None
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _broker_cpu() -> float | None:
    """Seconds of CPU the local broker has used so far (user + system), if it is known."""
    if _BROKER_PID is None:
        return None
    try:
        with open(f"/proc/{_BROKER_PID}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


Mark = tuple[float, float | None]
#: A scenario's publish seconds, consume seconds and CPU figures (see :func:`_cpu_lap`).
Timing = tuple[float, float, dict[str, float]]


def _mark() -> Mark:
    """The CPU clocks at the start of a phase: this process's and the broker's."""
    return time.process_time(), _broker_cpu()


def _cpu_lap(mark: Mark, n: int, phase: str, extra: dict[str, float]) -> None:
    """Record the phase's CPU per event, in microseconds: the client's (this process) and
    the broker's (when it runs on this machine)."""
    extra[f"{phase}_client_us"] = 1e6 * (time.process_time() - mark[0]) / n
    if mark[1] is not None and (now := _broker_cpu()) is not None:
        extra[f"{phase}_broker_us"] = 1e6 * (now - mark[1]) / n


def _have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _names(tag: str) -> tuple[str, str]:
    token = f"{os.getpid()}-{tag}-{time.monotonic_ns() % 10**9}"
    return f"ojs-bench-events-{token}", f"ojs-bench-events-{token}"


def _queue_arguments(queue: str) -> dict[str, Any]:
    return {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": f"{queue}.dlq"}


async def _declare(url: str, exchange: str, queue: str) -> None:
    """The bus's topology for ``queue`` (exchange, DLQ, queue, binding), for every scenario."""
    async with amqp.connect(url) as conn, conn.channel() as ch:
        await ch.exchange_declare(exchange, "topic", durable=True)
        await ch.queue_declare(f"{queue}.dlq", durable=True)
        await ch.queue_declare(queue, durable=True, arguments=_queue_arguments(queue))
        await ch.queue_bind(queue, exchange, BINDING)


async def _drop(url: str, exchange: str, queue: str) -> None:
    async with amqp.connect(url) as conn, conn.channel(confirms=False) as ch:
        for q in (queue, f"{queue}.dlq"):
            await ch.queue_delete(q)
        await ch.exchange_delete(exchange)


def _topology(url: str, exchange: str, queue: str, *, drop: bool = False) -> None:
    anyio.run(_drop if drop else _declare, url, exchange, queue)


# =====================================================================================
# Scenarios: each returns (publish seconds, consume seconds) for N events
# =====================================================================================


def run_raw(url: str, n: int) -> Timing:
    exchange, queue = _names("raw")
    _topology(url, exchange, queue)
    try:
        conn = RawConnection(url)
        try:
            props = ojs_codec.BasicProperties(
                content_type=events.CONTENT_JSON,
                delivery_mode=2,
                message_id=events.new_message_id(),
                timestamp=events._wire.now_timestamp(),
            )
            extra: dict[str, float] = {}
            mark = _mark()
            pub = conn.publish(ROUTING_KEY, n, exchange=exchange, properties=props, body=BODY, mandatory=True)
            _cpu_lap(mark, n, "publish", extra)
            mark = _mark()
            cons = conn.consume(queue, n, PREFETCH)
            _cpu_lap(mark, n, "consume", extra)
        finally:
            conn.close()
    finally:
        _topology(url, exchange, queue, drop=True)
    return pub, cons, extra


async def _ours(url: str, n: int) -> Timing:
    exchange, queue = _names("ours")
    await _declare(url, exchange, queue)
    try:
        async with events.connect(url, exchange=exchange, publisher_pool_size=1) as bus:
            extra: dict[str, float] = {}
            window = bus.publish_window(max_in_flight=WINDOW)
            mark = _mark()
            t0 = time.perf_counter()
            for _ in range(n):
                await window.publish(ROUTING_KEY, PAYLOAD)
            failed = await window.wait_all()
            pub = time.perf_counter() - t0
            _cpu_lap(mark, n, "publish", extra)
            if failed:
                raise RuntimeError(f"{len(failed)} publishes failed: {failed[0].error!r}")
            done = anyio.Event()
            count = 0

            async def handle(event: Event) -> None:
                nonlocal count
                count += 1
                if count >= n:
                    done.set()

            mark = _mark()
            t0 = time.perf_counter()
            async with bus.subscribe(queue, handle, bindings=[BINDING], prefetch=PREFETCH):
                await done.wait()
                cons = time.perf_counter() - t0
                _cpu_lap(mark, n, "consume", extra)
    finally:
        await _drop(url, exchange, queue)
    return pub, cons, extra


def _ours_on(backend: str) -> Callable[[str, int], Timing]:
    def run(url: str, n: int) -> Timing:
        async def main() -> Timing:
            with anyio.fail_after(SCENARIO_TIMEOUT):
                return await _ours(url, n)

        return anyio.run(main, backend=backend)

    return run


def run_faststream(url: str, n: int) -> Timing:
    if not _have("faststream") or not _have("aio_pika"):
        raise Skipped("faststream[rabbit] is not installed")
    import logging

    from faststream.rabbit import Channel, ExchangeType, RabbitBroker, RabbitExchange, RabbitQueue

    logging.getLogger("faststream").setLevel(logging.WARNING)
    exchange, queue = _names("faststream")
    _topology(url, exchange, queue)

    async def main() -> Timing:
        extra: dict[str, float] = {}
        exch = RabbitExchange(exchange, type=ExchangeType.TOPIC, durable=True)
        rq = RabbitQueue(queue, durable=True, routing_key=BINDING, arguments=_queue_arguments(queue))
        publisher = RabbitBroker(url, logger=None)
        async with publisher:
            await publisher.start()
            mark = _mark()
            t0 = time.perf_counter()
            for first in range(0, n, PEER_BATCH):
                await asyncio.gather(
                    *(
                        publisher.publish(
                            PAYLOAD_DICT,
                            exchange=exch,
                            routing_key=ROUTING_KEY,
                            persist=True,
                            mandatory=True,
                            timestamp=events._wire.now_timestamp(),
                        )
                        for _ in range(min(PEER_BATCH, n - first))
                    )
                )
            pub = time.perf_counter() - t0
            _cpu_lap(mark, n, "publish", extra)
        done = asyncio.Event()
        count = 0
        consumer = RabbitBroker(url, logger=None)

        @consumer.subscriber(rq, exch, channel=Channel(prefetch_count=PREFETCH))
        async def handle(body: dict[str, Any]) -> None:
            nonlocal count
            count += 1
            if count >= n:
                done.set()

        mark = _mark()
        t0 = time.perf_counter()
        async with consumer:
            await consumer.start()
            await done.wait()
            cons = time.perf_counter() - t0
            _cpu_lap(mark, n, "consume", extra)
        return pub, cons, extra

    try:
        return asyncio.run(asyncio.wait_for(main(), SCENARIO_TIMEOUT))
    finally:
        _topology(url, exchange, queue, drop=True)


def run_aio_pika(url: str, n: int) -> Timing:
    if not _have("aio_pika"):
        raise Skipped("aio-pika is not installed")
    import aio_pika

    exchange, queue = _names("aiopika")
    _topology(url, exchange, queue)
    decode = msgspec.json.Decoder(Event).decode

    async def main() -> Timing:
        extra: dict[str, float] = {}
        conn = await aio_pika.connect(url)
        async with conn:
            ch = await conn.channel(publisher_confirms=True)
            ex = await ch.get_exchange(exchange, ensure=False)
            message = aio_pika.Message
            persistent = aio_pika.DeliveryMode.PERSISTENT
            mark = _mark()
            t0 = time.perf_counter()
            for first in range(0, n, PEER_BATCH):
                await asyncio.gather(
                    *(
                        ex.publish(
                            message(
                                BODY,
                                delivery_mode=persistent,
                                content_type=events.CONTENT_JSON,
                                message_id=events.new_message_id(),
                                timestamp=events._wire.now_timestamp(),
                            ),
                            routing_key=ROUTING_KEY,
                            mandatory=True,
                        )
                        for _ in range(min(PEER_BATCH, n - first))
                    )
                )
            pub = time.perf_counter() - t0
            _cpu_lap(mark, n, "publish", extra)
            await ch.set_qos(prefetch_count=PREFETCH)
            q = await ch.get_queue(queue, ensure=False)
            count = 0
            mark = _mark()
            t0 = time.perf_counter()
            async with q.iterator() as it:
                async for m in it:
                    decode(m.body)
                    await m.ack()
                    count += 1
                    if count >= n:
                        break
                cons = time.perf_counter() - t0
                _cpu_lap(mark, n, "consume", extra)
        return pub, cons, extra

    try:
        return asyncio.run(asyncio.wait_for(main(), SCENARIO_TIMEOUT))
    finally:
        _topology(url, exchange, queue, drop=True)


SCENARIOS: dict[str, Callable[[str, int], Timing]] = {
    CEILING: run_raw,
    "events/asyncio": _ours_on("asyncio"),
    "events/trio": _ours_on("trio"),
    "faststream": run_faststream,
    "aio-pika": run_aio_pika,
}


# =====================================================================================
# Runner and report
# =====================================================================================


def run_all(url: str, n: int, repeat: int, only: list[str] | None) -> dict[str, Result]:
    global _BROKER_PID
    if _url_parts(url)[0] in ("127.0.0.1", "localhost", "::1"):
        _BROKER_PID = _find_broker_pid()
    scenarios = {name: run for name, run in SCENARIOS.items() if only is None or name in only}
    return run_rounds("events", scenarios, url, n, repeat, ATTEMPTS, stat="median")


def cpu_medians(r: Result) -> dict[str, float]:
    """The median of each CPU figure over the rounds (microseconds per event)."""
    return {key: statistics.median(values) for key, values in r.extra.items() if values}


def paired(mine: Result, top: Result, wl: str) -> float | None:
    """The median over the rounds of ``mine / top`` within each round (rounds interleave
    the scenarios, so each pair met the broker at about the same time)."""
    if wl == "publish":
        pairs = zip(mine.publish, top.publish, strict=False)
    else:
        pairs = zip(mine.consume, top.consume, strict=False)  # a failed round leaves one short
    round_ratios = [a / b for a, b in pairs if b]
    return statistics.median(round_ratios) if round_ratios else None


def ratios(results: dict[str, Result]) -> dict[str, Any]:
    """Ratios of the medians, and for the ceiling also the median of the per-round ratios
    (``paired``).  The broker's own speed swings between rounds (see the CPU table), so a
    ceiling target passes only when both estimates reach it."""
    out = peer_ratios(results, OURS, PEERS, CEILING, WORKLOADS)
    out["paired_to_ceiling"] = {}
    top = results.get(CEILING)
    for ours, minimum in TARGETS:
        for wl, _ in WORKLOADS:
            got = out["to_ceiling"].get(f"{ours}:{wl}")
            mine = results.get(ours)
            pair = paired(mine, top, wl) if mine is not None and top is not None else None
            out["paired_to_ceiling"][f"{ours}:{wl}"] = pair
            if got is not None and pair is not None:
                got = min(got, pair)
            status = "n/a" if got is None else ("PASS" if got >= minimum else "MISS")
            what = f"{ours} {wl} / ceiling"
            out["targets"].append({"what": what, "minimum": minimum, "got": got, "status": status})
        peer, times = PEER_TARGET
        for wl, _ in WORKLOADS:
            got = out["to_peers"].get(f"{ours}/{peer}:{wl}")
            status = "n/a" if got is None else ("PASS" if got >= times else "MISS")
            what = f"{ours} {wl} / {peer}"
            out["targets"].append({"what": what, "minimum": times, "got": got, "status": status})
    return out


def print_report(args: argparse.Namespace, results: dict[str, Result], rat: dict[str, Any]) -> None:
    print(
        f"events: N={args.n} body={len(BODY)}B persistent, mandatory, confirms; prefetch={PREFETCH} "
        f"window={WINDOW} peer-batch={PEER_BATCH}; median of {args.repeat}; "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs "
        "(figures are indicative on a shared machine)"
    )
    if args.smoke:
        print("(smoke run: tiny N, the rates measure start-up more than throughput)")
    print_rates(results, CEILING, WORKLOADS, args.repeat, unit="events/s", width=16, error_chars=100)
    title = "ours / ceiling, median of the per-round ratios:"
    print_shares(title, rat["paired_to_ceiling"], OURS, WORKLOADS, width=16)
    print(f"\nCPU per event (microseconds, median of {args.repeat}): client = this process, broker = the")
    print(f"local beam.smp (blank when the broker is elsewhere); {os.cpu_count()} CPUs shared by both")
    print(f"  {'':<16} {'publish client':>15} {'broker':>8} {'consume client':>15} {'broker':>8}")
    for name, r in results.items():
        med = cpu_medians(r)
        if not med:
            continue
        cells = [
            f"{med[key]:.1f}" if key in med else ""
            for key in ("publish_client_us", "publish_broker_us", "consume_client_us", "consume_broker_us")
        ]
        print(f"  {name:<16} {cells[0]:>15} {cells[1]:>8} {cells[2]:>15} {cells[3]:>8}")
    print("\ntargets (context, not asserted; a ceiling share is the lower of the two estimates above):")
    for t in rat["targets"]:
        ratio = t["minimum"] > 1
        got = "n/a" if t["got"] is None else (f"{t['got']:.2f}x" if ratio else f"{100 * t['got']:.1f}%")
        want = f"{t['minimum']:.0f}x" if t["minimum"] > 1 else f"{100 * t['minimum']:.0f}%"
        print(f"  [{t['status']}] {t['what']}: {got} (target >= {want})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--n", type=int, help="events per workload (default 20000; 300 with --smoke)")
    ap.add_argument("--repeat", type=int, help="rounds, median reported (default 7; 1 with --smoke)")
    ap.add_argument("--url", default=DEFAULT_URL)
    ap.add_argument("--smoke", action="store_true", help="tiny N, one round")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--only", action="append", choices=list(SCENARIOS), help="run only these scenarios")
    args = ap.parse_args(argv)
    if args.n is None:
        args.n = 300 if args.smoke else 20_000
    if args.repeat is None:
        args.repeat = 1 if args.smoke else 7
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        results = run_all(args.url, args.n, args.repeat, args.only)
    rat = ratios(results)
    if args.json:
        print(
            json.dumps(
                {
                    "n": args.n,
                    "smoke": args.smoke,
                    "body_bytes": len(BODY),
                    "prefetch": PREFETCH,
                    "repeat": args.repeat,
                    "python": platform.python_version(),
                    "results": {
                        name: {
                            "publish_per_s": r.rate("publish"),
                            "consume_per_s": r.rate("consume"),
                            "publish_samples": r.publish,
                            "consume_samples": r.consume,
                            "cpu_us_per_event": cpu_medians(r),
                            "cpu_samples": r.extra,
                            "skipped": r.skipped,
                            "error": r.error,
                        }
                        for name, r in results.items()
                    },
                    **rat,
                }
            )
        )
    else:
        print_report(args, results, rat)
    failed = [name for name in (CEILING, *OURS) if name in results and results[name].error]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
