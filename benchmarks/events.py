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
Best of ``--repeat`` rounds (rounds interleave the scenarios).  The figures depend on the
machine's load: on a shared machine they are indicative only.

    python3 benchmarks/events.py [--n 20000] [--repeat 3] [--smoke] [--json] [--url amqp://...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import anyio
import msgspec
from hotpath import RawConnection, Result, Skipped, peer_ratios, print_rates, run_rounds

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


def run_raw(url: str, n: int) -> tuple[float, float]:
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
            pub = conn.publish(ROUTING_KEY, n, exchange=exchange, properties=props, body=BODY, mandatory=True)
            cons = conn.consume(queue, n, PREFETCH)
        finally:
            conn.close()
    finally:
        _topology(url, exchange, queue, drop=True)
    return pub, cons


async def _ours(url: str, n: int) -> tuple[float, float]:
    exchange, queue = _names("ours")
    await _declare(url, exchange, queue)
    try:
        async with events.connect(url, exchange=exchange, publisher_pool_size=1) as bus:
            window = bus.publish_window(max_in_flight=WINDOW)
            t0 = time.perf_counter()
            for _ in range(n):
                await window.publish(ROUTING_KEY, PAYLOAD)
            failed = await window.wait_all()
            pub = time.perf_counter() - t0
            if failed:
                raise RuntimeError(f"{len(failed)} publishes failed: {failed[0].error!r}")
            done = anyio.Event()
            count = 0

            async def handle(event: Event) -> None:
                nonlocal count
                count += 1
                if count >= n:
                    done.set()

            t0 = time.perf_counter()
            async with bus.subscribe(queue, handle, bindings=[BINDING], prefetch=PREFETCH):
                await done.wait()
                cons = time.perf_counter() - t0
    finally:
        await _drop(url, exchange, queue)
    return pub, cons


def _ours_on(backend: str) -> Callable[[str, int], tuple[float, float]]:
    def run(url: str, n: int) -> tuple[float, float]:
        async def main() -> tuple[float, float]:
            with anyio.fail_after(SCENARIO_TIMEOUT):
                return await _ours(url, n)

        return anyio.run(main, backend=backend)

    return run


def run_faststream(url: str, n: int) -> tuple[float, float]:
    if not _have("faststream") or not _have("aio_pika"):
        raise Skipped("faststream[rabbit] is not installed")
    import logging

    from faststream.rabbit import Channel, ExchangeType, RabbitBroker, RabbitExchange, RabbitQueue

    logging.getLogger("faststream").setLevel(logging.WARNING)
    exchange, queue = _names("faststream")
    _topology(url, exchange, queue)

    async def main() -> tuple[float, float]:
        exch = RabbitExchange(exchange, type=ExchangeType.TOPIC, durable=True)
        rq = RabbitQueue(queue, durable=True, routing_key=BINDING, arguments=_queue_arguments(queue))
        publisher = RabbitBroker(url, logger=None)
        async with publisher:
            await publisher.start()
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
        done = asyncio.Event()
        count = 0
        consumer = RabbitBroker(url, logger=None)

        @consumer.subscriber(rq, exch, channel=Channel(prefetch_count=PREFETCH))
        async def handle(body: dict[str, Any]) -> None:
            nonlocal count
            count += 1
            if count >= n:
                done.set()

        t0 = time.perf_counter()
        async with consumer:
            await consumer.start()
            await done.wait()
            cons = time.perf_counter() - t0
        return pub, cons

    try:
        return asyncio.run(asyncio.wait_for(main(), SCENARIO_TIMEOUT))
    finally:
        _topology(url, exchange, queue, drop=True)


def run_aio_pika(url: str, n: int) -> tuple[float, float]:
    if not _have("aio_pika"):
        raise Skipped("aio-pika is not installed")
    import aio_pika

    exchange, queue = _names("aiopika")
    _topology(url, exchange, queue)
    decode = msgspec.json.Decoder(Event).decode

    async def main() -> tuple[float, float]:
        conn = await aio_pika.connect(url)
        async with conn:
            ch = await conn.channel(publisher_confirms=True)
            ex = await ch.get_exchange(exchange, ensure=False)
            message = aio_pika.Message
            persistent = aio_pika.DeliveryMode.PERSISTENT
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
            await ch.set_qos(prefetch_count=PREFETCH)
            q = await ch.get_queue(queue, ensure=False)
            count = 0
            t0 = time.perf_counter()
            async with q.iterator() as it:
                async for m in it:
                    decode(m.body)
                    await m.ack()
                    count += 1
                    if count >= n:
                        break
                cons = time.perf_counter() - t0
        return pub, cons

    try:
        return asyncio.run(asyncio.wait_for(main(), SCENARIO_TIMEOUT))
    finally:
        _topology(url, exchange, queue, drop=True)


SCENARIOS: dict[str, Callable[[str, int], tuple[float, float]]] = {
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
    scenarios = {name: run for name, run in SCENARIOS.items() if only is None or name in only}
    return run_rounds("events", scenarios, url, n, repeat, ATTEMPTS)


def ratios(results: dict[str, Result]) -> dict[str, Any]:
    out = peer_ratios(results, OURS, PEERS, CEILING, WORKLOADS)
    for ours, minimum in TARGETS:
        for wl, _ in WORKLOADS:
            got = out["to_ceiling"].get(f"{ours}:{wl}")
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
        f"window={WINDOW} peer-batch={PEER_BATCH}; best of {args.repeat}; "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs "
        "(figures are indicative on a shared machine)"
    )
    if args.smoke:
        print("(smoke run: tiny N, the rates measure start-up more than throughput)")
    print_rates(results, CEILING, WORKLOADS, args.repeat, unit="events/s", width=16, error_chars=100)
    print("\ntargets (context, not asserted):")
    for t in rat["targets"]:
        ratio = t["minimum"] > 1
        got = "n/a" if t["got"] is None else (f"{t['got']:.2f}x" if ratio else f"{100 * t['got']:.1f}%")
        want = f"{t['minimum']:.0f}x" if t["minimum"] > 1 else f"{100 * t['minimum']:.0f}%"
        print(f"  [{t['status']}] {t['what']}: {got} (target >= {want})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--n", type=int, help="events per workload (default 20000; 300 with --smoke)")
    ap.add_argument("--repeat", type=int, help="rounds, best reported (default 3; 1 with --smoke)")
    ap.add_argument("--url", default=DEFAULT_URL)
    ap.add_argument("--smoke", action="store_true", help="tiny N, one round")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--only", action="append", choices=list(SCENARIOS), help="run only these scenarios")
    args = ap.parse_args(argv)
    if args.n is None:
        args.n = 300 if args.smoke else 20_000
    if args.repeat is None:
        args.repeat = 1 if args.smoke else 3
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
                            "publish_per_s": r.best("publish"),
                            "consume_per_s": r.best("consume"),
                            "publish_samples": r.publish,
                            "consume_samples": r.consume,
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
