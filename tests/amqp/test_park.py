"""The lean one-shot wake-up behind PublishHandle.wait (no broker)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import sniffio

from ojs_anyio.amqp import PublishHandle, PublishNackedError, _park

pytestmark = pytest.mark.anyio


class Slot:
    _waiter: Any = None


async def test_wait_returns_after_wake() -> None:
    slot = Slot()
    done = anyio.Event()

    async def waiter() -> None:
        await _park.wait(slot)
        done.set()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            while slot._waiter is None:
                await anyio.lowlevel.checkpoint()
            assert not done.is_set()
            _park.wake(slot)
            await done.wait()
    assert slot._waiter is None
    _park.wake(slot)  # nothing parked: a no-op


async def test_wait_with_a_timeout_returns_when_it_passes_or_at_the_wake() -> None:
    slot = Slot()
    with anyio.fail_after(5):
        started = anyio.current_time()
        await _park.wait(slot, 0.05)  # nobody wakes it: back after the timeout
        assert anyio.current_time() - started >= 0.04
        assert slot._waiter is None
        _park.wake(slot)  # the timed-out task is not woken again
        woken = anyio.Event()

        async def waiter() -> None:
            await _park.wait(slot, 60)
            woken.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            while slot._waiter is None:
                await anyio.lowlevel.checkpoint()
            _park.wake(slot)  # long before its timeout
            await woken.wait()
    assert slot._waiter is None


async def test_cancelled_wait_clears_the_slot() -> None:
    slot = Slot()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_park.wait, slot)
            while slot._waiter is None:
                await anyio.lowlevel.checkpoint()
            tg.cancel_scope.cancel()
    assert slot._waiter is None
    _park.wake(slot)  # the cancelled task is not woken again


async def test_publish_handle_wakes_every_waiter_with_the_outcome() -> None:
    ok = PublishHandle(1, "ex", "rk", None)
    nacked = PublishHandle(2, "ex", "rk", None)
    outcomes: list[str] = []

    async def wait(handle: PublishHandle, name: str) -> None:
        try:
            await handle.wait()
        except PublishNackedError:
            outcomes.append(f"{name} nacked")
        else:
            outcomes.append(f"{name} ok")

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for name in ("a", "b"):  # two tasks on one handle: the second gets an Event
                tg.start_soon(wait, ok, name)
            tg.start_soon(wait, nacked, "c")
            while ok._waiter is None or ok._event is None or nacked._waiter is None:
                await anyio.lowlevel.checkpoint()
            ok._resolve(True)
            nacked._resolve(PublishNackedError("no", exchange="ex", routing_key="rk"))
    assert sorted(outcomes) == ["a ok", "b ok", "c nacked"]
    # Resolved already: waiting returns (or raises) at once.
    with anyio.fail_after(1):
        await ok.wait()
        with pytest.raises(PublishNackedError):
            await nacked.wait()


async def _parked(waiters: deque[Any], n: int) -> None:
    while len(waiters) < n:
        await anyio.lowlevel.checkpoint()


async def test_wait_in_wakes_in_fifo_order_one_at_a_time() -> None:
    waiters: deque[Any] = deque()
    woken: list[int] = []

    async def waiter(i: int) -> None:
        await _park.wait_in(waiters)
        woken.append(i)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(waiter, i)
                await _parked(waiters, i + 1)
            _park.wake_first(waiters)
            while not woken:
                await anyio.lowlevel.checkpoint()
            assert woken == [0] and len(waiters) == 2
            _park.wake_first(waiters)
            while len(woken) < 2:
                await anyio.lowlevel.checkpoint()
            assert woken == [0, 1]
            tg.start_soon(waiter, 3)
            await _parked(waiters, 2)
            _park.wake_all(waiters)  # Trio runs the woken in any order
    assert woken[:2] == [0, 1] and sorted(woken[2:]) == [2, 3]
    assert not waiters
    _park.wake_first(waiters)  # nobody parked: a no-op


@dataclass
class _TwoParked:
    waiters: deque[Any] = field(default_factory=deque)
    #: The names of the tasks that returned from ``wait_in``, in order.
    woken: list[str] = field(default_factory=list)
    a: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    b: anyio.CancelScope = field(default_factory=anyio.CancelScope)


@contextlib.asynccontextmanager
async def _a_then_b_parked() -> AsyncIterator[_TwoParked]:
    """Task "a" parked in ``waiters`` under scope ``a``, then task "b" under ``b``, in that
    order, in a task group the block runs in (all within 5 seconds)."""
    parked = _TwoParked()

    async def waiter(name: str, scope: anyio.CancelScope) -> None:
        with scope:
            await _park.wait_in(parked.waiters)
            parked.woken.append(name)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter, "a", parked.a)
            await _parked(parked.waiters, 1)
            tg.start_soon(waiter, "b", parked.b)
            await _parked(parked.waiters, 2)
            yield parked


async def test_wait_in_cancelled_leaves_the_queue() -> None:
    async with _a_then_b_parked() as p:
        p.a.cancel()
        while len(p.waiters) > 1:
            await anyio.lowlevel.checkpoint()
        _park.wake_first(p.waiters)  # goes to b, not to the cancelled a
    assert p.woken == ["b"]
    assert p.a.cancelled_caught


async def test_wait_in_woken_and_cancelled_at_once_loses_no_wake_up() -> None:
    """A wake-up that reaches a task cancelled in the same step is either taken by it (it
    returns normally) or passed on to the next parked task: never dropped."""
    async with _a_then_b_parked() as p:
        _park.wake_first(p.waiters)
        p.a.cancel()
        while not p.woken:
            await anyio.lowlevel.checkpoint()
        p.b.cancel()
    assert len(p.woken) == 1


async def test_wait_in_cancel_landing_after_the_wake_up() -> None:
    """On asyncio a bare ``Task.cancel()`` can land after the wake-up: the task gets the
    cancellation and the next waiter the wake-up.  Trio never cancels a task it already
    rescheduled: there the first waiter returns and takes the wake-up itself."""
    on_asyncio = sniffio.current_async_library() == "asyncio"
    waiters: deque[Any] = deque()
    woken: list[str] = []
    cancel: dict[str, Any] = {}

    async def waiter(name: str) -> None:
        scope = anyio.CancelScope()
        cancel[name] = asyncio.current_task().cancel if on_asyncio else scope.cancel  # type: ignore[union-attr]
        with scope:
            try:
                await _park.wait_in(waiters)
            except asyncio.CancelledError:
                woken.append(f"{name} cancelled")
                return  # swallowed for the test: cancelled by hand, not by a scope
            woken.append(name)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter, "a")
            await _parked(waiters, 1)
            tg.start_soon(waiter, "b")
            await _parked(waiters, 2)
            _park.wake_first(waiters)
            cancel["a"]()
            while len(woken) < (2 if on_asyncio else 1):
                await anyio.lowlevel.checkpoint()
            if not on_asyncio:
                cancel["b"]()
    assert woken == (["a cancelled", "b"] if on_asyncio else ["a"])
