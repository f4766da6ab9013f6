"""The lean one-shot wake-up behind PublishHandle.wait (no broker)."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest

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
