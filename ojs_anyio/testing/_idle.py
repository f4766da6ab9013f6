"""When a memory broker and its clients are idle, and how virtual time moves: shared by the
job tester and the bus tester."""

from __future__ import annotations

import anyio

from .._misuse import ArgumentTypeError
from ..memory import MemoryBroker, VirtualClock

__all__ = ["QUIET", "advance", "settle"]

#: The client batches acks for up to 2 ms (docs/amqp.md): a settle waits this long (real
#: time) for the broker to see no more traffic before it calls the system idle.
QUIET = 0.005


async def settle(broker: MemoryBroker) -> None:
    """Wait until no task can run and the broker saw no traffic for a short real-time window."""
    while True:
        before = broker.activity
        await anyio.wait_all_tasks_blocked()
        await anyio.sleep(QUIET)
        await anyio.wait_all_tasks_blocked()
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
        due = [t for t in (broker.due(), clock.next_wakeup()) if t is not None and t <= target]
        if not due:
            break
        broker.advance_to(max(min(due), clock.now()))
        await settle(broker)
    broker.advance_to(target)
    await settle(broker)
