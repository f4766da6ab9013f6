"""Virtual time with a cron Scheduler: wall-clock seconds per virtual day of hourly ticks.

``python3 benchmarks/virtual_time.py [--hours 72] [--smoke]`` runs a ``job_tester`` (private
memory:// broker, virtual clock) with a ``Scheduler`` firing every hour, advances the clock
``--hours``, and prints the wall time on asyncio and Trio, with the jobs fired (which must be
one per hour).  docs/testing.md quotes it.
"""

from __future__ import annotations

import argparse
import time

import anyio

import ojs_anyio as ojs
from ojs_anyio.testing import job_tester


async def one_run(hours: int) -> tuple[float, int]:
    async with job_tester() as jobs, anyio.create_task_group() as tg:
        schedule = ojs.Scheduler("bench", clock=jobs.scheduler_clock)
        schedule.add("report.build", "0 * * * *", args=[], queue="bench", name="hourly")
        tg.start_soon(schedule.run, jobs.client)
        started = time.perf_counter()
        await jobs.advance(hours * 3600)
        wall = time.perf_counter() - started
        fired = len(jobs.enqueued(queue="bench"))
        tg.cancel_scope.cancel()
    return wall, fired


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=int, default=72)
    parser.add_argument("--smoke", action="store_true", help="3 virtual hours, to check it runs")
    args = parser.parse_args()
    hours = 3 if args.smoke else args.hours
    for backend in ("asyncio", "trio"):
        wall, fired = anyio.run(one_run, hours, backend=backend)
        assert fired == hours, f"{fired} ticks fired in {hours} virtual hours"
        per_tick = wall / hours * 1000
        print(f"{backend:8s} {hours} virtual h, {fired} ticks: {wall:.2f} s wall ({per_tick:.0f} ms/tick)")


if __name__ == "__main__":
    main()
