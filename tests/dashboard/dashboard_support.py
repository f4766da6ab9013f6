"""Helpers of the dashboard tests: a client on a private memory:// broker, and a bounded
wait for what the observer hears."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio

import ojs_anyio as ojs
from ojs_anyio.dashboard import Observer
from ojs_anyio.memory import get_broker

__all__ = ["WAIT", "holding_worker", "memory_client", "qname", "wait_for"]

#: Bound on every wait of these tests (generous: a loaded machine is slow, never wrong).
WAIT = 20.0


def qname() -> str:
    """A fresh OJS queue name."""
    return f"tdash{uuid.uuid4().hex[:12]}"


@asynccontextmanager
async def memory_client(**options: Any) -> AsyncIterator[ojs.Client]:
    """``ojs.connect`` to a fresh private memory:// broker, dropped afterwards."""
    broker = get_broker(f"dash-{uuid.uuid4().hex[:12]}")
    try:
        async with ojs.connect(broker.url, **options) as client:
            yield client
    finally:
        broker.close()


async def wait_for(obs: Observer, predicate: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    """Wait until ``predicate()`` holds, checking it each time the observer takes in a
    presence message or a BEAT (workers and schedulers send them every few seconds)."""
    try:
        with anyio.fail_after(timeout):
            while not predicate():
                await obs.wait_heard()
    except TimeoutError:
        raise AssertionError(f"waited {timeout}s for {what}") from None


def holding_worker(queue: str, **options: Any) -> tuple[ojs.Worker, anyio.Event]:
    """A worker of ``queue`` whose ``t.hold`` jobs run until cancelled, and the event the
    first one sets when it starts."""
    worker = ojs.Worker(queues=[queue], **options)
    started = anyio.Event()

    @worker.handler("t.hold")
    async def hold(ctx: ojs.JobContext) -> None:
        started.set()
        await anyio.sleep_forever()

    return worker, started
