"""The client's own per-message cost on a channel, without a broker, in CPU time.

``hotpath.py`` times the whole path against RabbitMQ: on a shared machine its figures
move by a factor of several from run to run (its ``raw-socket`` row, which runs none of
the client, shows how much), far more than a change to the channel's code could.  This
benchmark times only the client side of one :class:`ojs_anyio.amqp.Channel`, over a stub
link that implements the :class:`~ojs_anyio.amqp._link.ChannelLink` verbs the channel uses
and does no I/O (publishes get tags, a flush confirms them, settles are dropped).  A / B
above 1 means B (the second tree) is faster:

* ``publish_window``: ``PublishWindow.publish`` of N 256-byte messages, window 1024, and
  the confirms resolving them (a flush confirms what is outstanding in one Basic.Ack);
* ``deliver_ack``: N deliveries handed to the channel's delivery handler in batches of
  512 (the prefetch), each taken with ``Consumer.__anext__`` and acked.

Figures are CPU nanoseconds per message (``time.process_time``: time the process was not
running does not count), the best of ``--repeat`` runs, on asyncio and Trio.

``--compare A B`` runs this script in each tree (``PYTHONPATH`` = the tree and its
``codec/``) in interleaved rounds (A B, B A, ...) and prints medians, the median of the
per-round ratios and the best of all rounds::

    python3 benchmarks/channel_path.py [--n 20000] [--repeat 7] [--json] [--smoke]
    python3 benchmarks/channel_path.py --compare /tmp/before . --rounds 12
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from ojs_anyio.amqp import Channel
from ojs_codec import BasicProperties, Confirmed, Delivery

BODY = b"x" * 256
PREFETCH = 512


class _Topology:
    def consumer_gone(self, queue: str, consumed: Any) -> None:
        pass


class StubLink:
    """The ChannelLink verbs a channel uses, without a connection (see the docstring)."""

    def __init__(self) -> None:
        self.connected = anyio.Event()
        self.connected.set()
        self.unblocked = anyio.Event()
        self.unblocked.set()
        self.outbound = bytearray()  # never grows: a window flushes only when full
        self.publish_timeout: float | None = None
        self.close_timeout = 1.0
        self.is_connected = True
        self.is_unblocked = True
        self.topology = _Topology()
        self.endpoint: Any = None
        self._tag = 0
        self._unconfirmed: list[int] = []
        self._reply_due = False

    async def wait_ready(self, timeout: float | None = None) -> None:
        pass

    def register(self, endpoint: Any) -> None:
        self.endpoint = endpoint

    def unregister(self, endpoint: Any) -> None:
        pass

    def attach(self, channel_id: int, endpoint: Any) -> None:
        self.endpoint = endpoint

    def detach(self, channel_id: int, endpoint: Any) -> None:
        pass

    def open_channel(self) -> int:
        self._reply_due = True
        return 1

    def close_channel(self, channel_id: int) -> None:
        pass

    def send_method(self, channel_id: int, method: Any) -> bool:
        self._reply_due = True
        return True

    async def flush(self) -> None:
        if self._reply_due:
            self._reply_due = False
            self.endpoint.on_reply(None)
        if self._unconfirmed:
            tags, self._unconfirmed = self._unconfirmed, []
            self.endpoint.on_confirmed(Confirmed(1, tags, True, None))

    async def flush_quietly(self) -> None:
        await self.flush()

    async def flush_deferred(self) -> None:
        pass

    def defer_flush(self) -> None:
        pass

    def publish(
        self, channel_id: int, exchange: str, routing_key: str, body: bytes, properties: Any, mandatory: bool
    ) -> int:
        self._tag += 1
        self._unconfirmed.append(self._tag)
        return self._tag

    def ack(
        self, channel_id: int, delivery_tag: int, multiple: bool, batch: bool = False, fold: bool = False
    ) -> bool:
        return False

    def reject(self, channel_id: int, delivery_tag: int, requeue: bool, batch: bool = False) -> bool:
        return False

    def queue_consumed(self, queue: str) -> bool:
        return False


async def measure(n: int, repeat: int) -> dict[str, float]:
    """CPU ns per message of each path, the best of ``repeat`` runs."""
    link = StubLink()
    ch = Channel(link)  # type: ignore[arg-type]  # the stub has the verbs the channel uses
    await ch.open()
    out: dict[str, float] = {}
    best = float("inf")
    for _ in range(repeat):
        window = ch.publish_window(1024)
        start = time.process_time()
        for _ in range(n):
            await window.publish(BODY, routing_key="q")
        failed = await window.wait_all()
        best = min(best, time.process_time() - start)
        assert not failed
    out["publish_window"] = best / n * 1e9
    batches = max(n // PREFETCH, 1)
    props = BasicProperties()
    best = float("inf")
    tag = 0
    async with ch.consume("q", prefetch=PREFETCH) as messages:
        for _ in range(repeat):
            start = time.process_time()
            for _ in range(batches):
                for _ in range(PREFETCH):
                    tag += 1
                    delivery = Delivery(1, messages.consumer_tag, tag, False, "", "q", props, BODY)
                    link.endpoint.on_delivery(delivery)
                for _ in range(PREFETCH):
                    message = await messages.__anext__()
                    await message.ack()
            best = min(best, time.process_time() - start)
    out["deliver_ack"] = best / (batches * PREFETCH) * 1e9
    await ch.aclose()
    return out


def run_here(n: int, repeat: int) -> dict[str, float]:
    rates: dict[str, float] = {}
    for backend in ("asyncio", "trio"):
        for path, ns in anyio.run(measure, n, repeat, backend=backend).items():
            rates[f"{backend} {path}"] = ns
    return rates


def run_tree(tree: Path, n: int, repeat: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{tree / 'codec'}")
    args = [sys.executable, str(Path(__file__).resolve()), "--json", "--n", str(n), "--repeat", str(repeat)]
    done = subprocess.run(args, env=env, cwd=tree, capture_output=True, text=True, check=True, timeout=600)
    result: dict[str, float] = json.loads(done.stdout)
    return result


def compare(a: Path, b: Path, rounds: int, n: int, repeat: int) -> None:
    trees = [a.resolve(), b.resolve()]
    runs: list[list[dict[str, float]]] = [[], []]
    for rnd in range(rounds):
        for i in (0, 1) if rnd % 2 == 0 else (1, 0):
            runs[i].append(run_tree(trees[i], n, repeat))
            shown = ", ".join(f"{k} {v:,.0f}" for k, v in runs[i][-1].items())
            print(f"round {rnd + 1}, {'AB'[i]}: {shown}", file=sys.stderr, flush=True)
    loadavg = Path("/proc/loadavg")
    load = loadavg.read_text().strip() if loadavg.exists() else "unknown"
    print(f"A = {trees[0]}\nB = {trees[1]}")
    print(f"{rounds} interleaved rounds, CPU ns per message (lower is better); load average after: {load}\n")
    print("| path | A median | B median | A / B | per-round A / B (median) | A best | B best | A / B, best |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for key in runs[0][0]:
        ma = statistics.median(r[key] for r in runs[0])
        mb = statistics.median(r[key] for r in runs[1])
        paired = statistics.median(ra[key] / rb[key] for ra, rb in zip(runs[0], runs[1], strict=True))
        ba = min(r[key] for r in runs[0])
        bb = min(r[key] for r in runs[1])
        cells = [f"{ma:,.0f}", f"{mb:,.0f}", f"{ma / mb:.3f}", f"{paired:.3f}"]
        cells += [f"{ba:,.0f}", f"{bb:,.0f}", f"{ba / bb:.3f}"]
        print(f"| {key} | {' | '.join(cells)} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20000, help="messages per path and run")
    ap.add_argument("--repeat", type=int, default=7, help="runs per path; the best is kept")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="tiny counts, one run")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"), help="two trees, interleaved")
    ap.add_argument("--rounds", type=int, default=9, help="rounds per tree with --compare")
    args = ap.parse_args()
    if args.smoke:
        args.n, args.repeat, args.rounds = 1024, 1, 1
    if args.compare:
        compare(*args.compare, args.rounds, args.n, args.repeat)
        return 0
    rates = run_here(args.n, args.repeat)
    if args.json:
        print(json.dumps(rates))
    else:
        for key, ns in rates.items():
            print(f"{key:24} {ns:8,.0f} ns/message (CPU)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
