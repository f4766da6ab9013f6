"""A one-shot wake-up for one waiting task, cheaper than an ``anyio.Event``.

``anyio.Event()`` finds the running backend anew on each call and, on asyncio, builds an
``asyncio.Event`` whose ``wait()`` makes a future: three objects and a backend lookup per
wait.  :func:`wait` parks the calling task directly: on asyncio (and uvloop) on one bare
future, on Trio with ``wait_task_rescheduled``.  The waiter lives in the ``_waiter`` slot
of the object waited on; :func:`wake` resumes it.  Cancellation works as with any
checkpoint: the waiting task gets the backend's cancellation exception and the slot is
cleared.

Used where one task waits for one thing to happen, often: a publish waiting for its
broker confirm (whose ``confirm_timeout`` is the connection's one deadline watcher's, see
_confirm_deadlines: the watcher is what waits here with a timeout).  :func:`wait_in` /
:func:`wake_first` do the same for several tasks parked in a FIFO (a consumer's idle
readers).
"""

from __future__ import annotations

import asyncio
import sys
from collections import deque
from typing import Any, Protocol

__all__ = ["wait", "wait_in", "wake", "wake_all", "wake_first"]


class Slot(Protocol):
    _waiter: Any


def _sniffio_local() -> Any:
    sniffio = sys.modules.get("sniffio")
    return None if sniffio is None else sniffio.thread_local


#: sniffio's thread-local, when it was imported before this module (anyio imports it).
_SNIFFIO_LOCAL = _sniffio_local()


def _on_trio() -> bool:
    # Trio marks its thread for sniffio (Trio depends on sniffio), also in guest mode.
    local = _SNIFFIO_LOCAL or _sniffio_local()
    return local is not None and local.name == "trio"


async def wait(slot: Slot, timeout: float | None = None) -> None:
    """Suspend until :func:`wake` is called with ``slot._waiter`` (which must be empty), or
    until ``timeout`` seconds passed: the caller tells the two apart by what it waits for.
    The timeout is a bare timer (asyncio) rather than a cancel scope, for the hot path."""
    if not _on_trio():
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        slot._waiter = fut
        timer = None if timeout is None else loop.call_later(timeout, _resolve, fut)
        try:
            await fut
        finally:
            if slot._waiter is fut:
                slot._waiter = None
            if timer is not None:
                timer.cancel()
        return
    import trio

    task = trio.lowlevel.current_task()
    slot._waiter = task

    def abort(_: Any) -> trio.lowlevel.Abort:
        if slot._waiter is task:
            slot._waiter = None
        return trio.lowlevel.Abort.SUCCEEDED

    if timeout is None:
        await trio.lowlevel.wait_task_rescheduled(abort)
        return
    with trio.move_on_after(timeout):
        await trio.lowlevel.wait_task_rescheduled(abort)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


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


# ----------------------------------------------------------- several waiters, FIFO


async def wait_in(waiters: deque[Any]) -> None:
    """Park in the FIFO ``waiters`` until :func:`wake_first` (or :func:`wake_all`) picks us.

    A condition-variable notify, not a hand-off: the woken task re-checks what it waits for.
    A task cancelled while parked leaves the queue; one woken and cancelled at the same
    time passes its wake-up on to the next waiter, so no notification is lost.
    """
    if not _on_trio():
        fut = asyncio.get_running_loop().create_future()
        waiters.append(fut)
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                wake_first(waiters)  # woken, then cancelled before it ran: pass it on
            else:
                try:
                    waiters.remove(fut)
                except ValueError:
                    pass
            raise
        return
    import trio

    task = trio.lowlevel.current_task()
    waiters.append(task)

    def abort(_: Any) -> trio.lowlevel.Abort:
        # Only called while still parked (Trio never aborts a rescheduled task).
        try:
            waiters.remove(task)
        except ValueError:
            pass
        return trio.lowlevel.Abort.SUCCEEDED

    await trio.lowlevel.wait_task_rescheduled(abort)


def wake_first(waiters: deque[Any]) -> None:
    """Resume the longest-parked task of ``waiters`` (see :func:`wait_in`), if any."""
    while waiters:
        waiter = waiters.popleft()
        if isinstance(waiter, asyncio.Future):
            if waiter.done():
                continue  # cancelled, its task not yet run to leave the queue
            waiter.set_result(None)
            return
        import trio

        trio.lowlevel.reschedule(waiter)
        return


def wake_all(waiters: deque[Any]) -> None:
    """Resume every task parked in ``waiters``."""
    while waiters:
        wake_first(waiters)
