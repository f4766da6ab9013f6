"""When a memory broker and its clients are idle, and how virtual time moves: shared by the
job tester and the bus tester."""

from __future__ import annotations

import asyncio

import anyio

from .._common import current_backend
from .._misuse import ArgumentTypeError
from ..memory import MemoryBroker, VirtualClock

__all__ = ["QUIET", "advance", "settle"]

#: The client batches acks for up to 2 ms (docs/amqp.md): a settle waits this long (real
#: time) for the broker to see no more traffic before it calls the system idle.
QUIET = 0.005


async def all_tasks_blocked() -> None:
    """``anyio.wait_all_tasks_blocked()``, without its 0.1 s naps on asyncio.

    On asyncio anyio checks every task and, while one can run, sleeps 0.1 s before looking
    again: a virtual day of cron ticks then cost minutes.  Here the check yields to the
    loop instead (``sleep(0)``) for a while, then falls back to anyio's.  Trio's own
    implementation is exact and is used as it is."""
    if current_backend() != "asyncio":
        await anyio.wait_all_tasks_blocked()
        return
    this = asyncio.current_task()
    for _ in range(_SPINS):
        busy = False
        for task in asyncio.all_tasks():
            if task is this:
                continue
            waiter = getattr(task, "_fut_waiter", None)  # what anyio's check reads too
            if waiter is None or waiter.done():
                busy = True
                break
        if not busy:
            return
        await asyncio.sleep(0)
    await anyio.wait_all_tasks_blocked()


#: How many turns of the asyncio loop :func:`all_tasks_blocked` gives the tasks to block.
_SPINS = 10_000


async def settle(broker: MemoryBroker) -> None:
    """Wait until no task can run and the broker saw no traffic for a short real-time window."""
    while True:
        before = broker.activity
        await all_tasks_blocked()
        await anyio.sleep(QUIET)
        await all_tasks_blocked()
        if broker.activity == before:
            return


async def advance(broker: MemoryBroker, seconds: float) -> None:
    """Move ``broker``'s virtual clock ``seconds`` ahead, step by step through every expiry and
    every timer on the way, letting the clients react (:func:`settle`) after each step."""
    clock = broker.clock
    if not isinstance(clock, VirtualClock):
        raise ArgumentTypeError("advance() needs a broker with a virtual clock (virtual_time=True)")
    target = clock.now() + seconds
    await settle(broker)
    while True:
        broker_due, timer_due = broker.due(), clock.next_wakeup()
        due = [t for t in (broker_due, timer_due) if t is not None and t <= target]
        if not due:
            break
        step = min(due)
        before = broker.activity
        broker.advance_to(max(step, clock.now()))
        if broker_due is None or broker_due > step:
            # Only a timer fell due (a cron scheduler's tick or lease): once every task is
            # blocked, if none sent the broker anything, no ack or publish can be on its
            # way, so the real-time quiet window is not needed (a day of ticks then takes
            # far less than a second per virtual hour).
            await all_tasks_blocked()
            if broker.activity == before:
                continue
        await settle(broker)
    broker.advance_to(target)
    await settle(broker)
