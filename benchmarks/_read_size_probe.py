"""What one socket read costs by the size it asks for: CPU µs and minor page faults a read.

A probe behind docs/benchmarks.md (issue 29), not a benchmark with targets (the leading
underscore keeps it out of CI's smoke loop).  A socket pair, one small message (a job
delivery's size) written and read back per round: ``recv(size)`` for each size, and
``recv_into`` a buffer kept across reads followed by a copy of what was read (what the
asyncio feeder of ``ojs_anyio.amqp._socket_io`` does).  A ``recv`` allocates its result at
the size asked for and shrinks it to what came: above glibc's ``mmap`` threshold that can
be a fresh mapping per read, with its page faults.

    python3 benchmarks/_read_size_probe.py
"""

from __future__ import annotations

import argparse
import resource
import socket
import time
from collections.abc import Callable

SIZES = (64 * 1024, 128 * 1024, 256 * 1024)


def _measure(read: Callable[[], bytes], a: socket.socket, message: bytes, n: int) -> tuple[float, float]:
    """(CPU µs, minor faults) per write-and-read round, over ``n`` rounds."""
    for _ in range(100):  # warm: the allocator settles
        a.send(message)
        read()
    faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    cpu0 = time.process_time()
    for _ in range(n):
        a.send(message)
        read()
    cpu = time.process_time() - cpu0
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
    return 1e6 * cpu / n, faults / n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--n", type=int, default=20000, help="rounds per variant")
    ap.add_argument("--bytes", type=int, default=580, help="the message's size (a job delivery's)")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved passes; the median is shown")
    args = ap.parse_args(argv)
    a, b = socket.socketpair()
    message = b"x" * args.bytes
    kept = memoryview(bytearray(64 * 1024))

    def into() -> bytes:
        return kept[: b.recv_into(kept)].tobytes()

    variants: list[tuple[str, Callable[[], bytes]]] = [
        (f"recv({size // 1024} KiB)", (lambda size=size: b.recv(size))) for size in SIZES
    ]
    variants.append(("recv_into(kept 64 KiB) + copy", into))
    results: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in variants}
    for _ in range(args.repeat):
        for name, read in variants:
            results[name].append(_measure(read, a, message, args.n))
    print(f"one {args.bytes}-byte write and read on a socket pair, {args.n} rounds, "
          f"median of {args.repeat} interleaved passes")  # fmt: skip
    for name, runs in results.items():
        runs.sort()
        cpu, faults = runs[len(runs) // 2]
        print(f"  {name:<32} {cpu:6.2f} µs CPU a round, {faults:5.2f} minor faults a read")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
