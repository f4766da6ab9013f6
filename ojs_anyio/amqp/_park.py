"""A one-shot wake-up for one waiting task, cheaper than an ``anyio.Event``.

``anyio.Event()`` finds the running backend anew on each call and, on asyncio, builds an
``asyncio.Event`` whose ``wait()`` makes a future: three objects and a backend lookup per
wait.  :func:`wait` parks the calling task directly: on asyncio (and uvloop) on one bare
future, on Trio with ``wait_task_rescheduled``.  The waiter lives in the ``_waiter`` slot
of the object waited on; :func:`wake` resumes it.  Cancellation works as with any
checkpoint: the waiting task gets the backend's cancellation exception and the slot is
cleared.

Used where one task waits for one thing to happen, often: a publish waiting for its
broker confirm.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, Protocol

__all__ = ["wait", "wake"]


class Slot(Protocol):
    _waiter: Any


def _on_trio() -> bool:
    # Trio marks its thread for sniffio (Trio depends on sniffio), also in guest mode.
    sniffio = sys.modules.get("sniffio")
    return sniffio is not None and sniffio.thread_local.name == "trio"


async def wait(slot: Slot) -> None:
    """Suspend until :func:`wake` is called with ``slot._waiter`` (which must be empty)."""
    if not _on_trio():
        fut = asyncio.get_running_loop().create_future()
        slot._waiter = fut
        try:
            await fut
        finally:
            if slot._waiter is fut:
                slot._waiter = None
        return
    import trio

    task = trio.lowlevel.current_task()
    slot._waiter = task

    def abort(_: Any) -> trio.lowlevel.Abort:
        if slot._waiter is task:
            slot._waiter = None
        return trio.lowlevel.Abort.SUCCEEDED

    await trio.lowlevel.wait_task_rescheduled(abort)


def wake(slot: Slot) -> None:
    """Resume the task parked on ``slot`` by :func:`wait`, if any."""
    waiter = slot._waiter
    if waiter is None:
        return
    slot._waiter = None
    if isinstance(waiter, asyncio.Future):
        if not waiter.done():
            waiter.set_result(None)
    else:
        import trio

        trio.lowlevel.reschedule(waiter)
