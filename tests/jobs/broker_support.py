"""Helpers for the job layer's real-broker tests (``tests/jobs/test_*_broker.py``).

* :data:`URL` / :data:`OJS_VHOST_URL`: the test broker on vhost ``/`` and on ``/ojs`` (the
  vhost of 001's examples).
* :class:`Outcomes`: records a worker's :class:`ojs_anyio.JobOutcome` events and waits on
  them (the tests synchronise on these, never on sleeps).
* :func:`running`: run a worker for the duration of a block, stop it gracefully on exit.
* :func:`wait_message_count`: wait until a queue holds ``n`` messages (for the one hop no
  worker event reports: the broker moving a rejected copy into ``ojs.queue.dlx.{q}``).
* :func:`queue_facts` / :func:`consumer_facts` / :func:`bindings_to`: broker-side truth
  from ``rabbitmqctl``.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
from harness.broker import rabbitmqctl
from helpers import wait_message_count as _wait_message_count

import ojs_anyio as ojs

__all__ = [
    "OJS_VHOST",
    "OJS_VHOST_URL",
    "URL",
    "WAIT",
    "Outcomes",
    "bindings_to",
    "both",
    "consumer_facts",
    "queue_facts",
    "running",
    "wait_message_count",
]

URL = os.environ.get("OJS_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
OJS_VHOST = "/ojs"
OJS_VHOST_URL = os.environ.get("OJS_AMQP_VHOST_URL", "amqp://guest:guest@127.0.0.1:5672/%2Fojs")
#: Bound on any single wait in these tests (seconds).
WAIT = 15.0


#: Wait until a queue holds exactly ``n`` ready messages (tests/helpers.py), up to WAIT.
wait_message_count = functools.partial(_wait_message_count, timeout=WAIT)

A = TypeVar("A")
B = TypeVar("B")


class Outcomes:
    """Every :class:`JobOutcome` a worker reports, in order, with a way to wait for some."""

    def __init__(self, worker: ojs.Worker) -> None:
        self.items: list[ojs.JobOutcome] = []
        self._changed = anyio.Event()
        worker.add_listener(self._on_outcome)

    def _on_outcome(self, outcome: ojs.JobOutcome) -> None:
        self.items.append(outcome)
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    def matching(self, pred: Callable[[ojs.JobOutcome], bool]) -> list[ojs.JobOutcome]:
        return [o for o in self.items if pred(o)]

    async def wait_for(
        self,
        pred: Callable[[ojs.JobOutcome], bool],
        count: int = 1,
        timeout: float = WAIT,
    ) -> list[ojs.JobOutcome]:
        """Wait until ``count`` outcomes match ``pred``; return them."""
        with anyio.fail_after(timeout):
            while len(found := self.matching(pred)) < count:
                await self._changed.wait()
        return found

    async def wait_final(self, job_id: str, timeout: float = WAIT) -> ojs.JobOutcome:
        """Wait for the job's final outcome (completed or dead-lettered)."""
        found = await self.wait_for(
            lambda o: o.job_id == job_id and o.outcome in ("completed", "dead_lettered", "cancelled"),
            timeout=timeout,
        )
        return found[0]

    def of(self, job_id: str) -> list[ojs.JobOutcome]:
        return self.matching(lambda o: o.job_id == job_id)


@asynccontextmanager
async def running(
    worker: ojs.Worker,
    client: ojs.Client,
    timeout: float = WAIT,
) -> AsyncIterator[ojs.Worker]:
    """Run ``worker`` in the background; on exit ``stop()`` it and wait for ``run()`` to return
    (if the block raised, cancel it instead)."""
    finished = anyio.Event()

    async def run() -> None:
        try:
            await worker.run(client)
        finally:
            finished.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        with anyio.fail_after(timeout):
            await worker.wait_ready()
        try:
            yield worker
        except BaseException:
            tg.cancel_scope.cancel()  # the test failed: don't wait out a graceful stop
            raise
        finally:
            worker.stop()
            with anyio.move_on_after(worker.grace_period + timeout, shield=True):
                await finished.wait()
            stuck = not finished.is_set()
            tg.cancel_scope.cancel()
        if stuck:
            raise AssertionError("worker.run() did not return after stop() and the grace period")


async def _ctl_json(*args: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(await rabbitmqctl(*args, "--formatter", "json", "-q"))
    return rows


def _args(raw: list[list[Any]]) -> dict[str, Any]:
    return {name: value for name, _type, value in raw}


async def queue_facts(*names: str, vhost: str = "/") -> dict[str, dict[str, Any]]:
    """``rabbitmqctl list_queues`` for ``names``: durable, auto_delete, exclusive, arguments
    (as a plain dict), type, messages_ready, messages_unacknowledged."""
    rows = await _ctl_json(
        "list_queues", "-p", vhost,
        "name", "durable", "auto_delete", "exclusive", "arguments", "type",
        "messages_ready", "messages_unacknowledged",
    )  # fmt: skip
    wanted = set(names)
    out = {}
    for row in rows:
        if row["name"] in wanted:
            row["arguments"] = _args(row["arguments"])
            out[row["name"]] = row
    return out


async def consumer_facts(queue: str, vhost: str = "/") -> list[dict[str, Any]]:
    """``rabbitmqctl list_consumers`` rows of ``queue``: ack_required, prefetch_count."""
    rows = await _ctl_json("list_consumers", "-p", vhost, "queue_name", "ack_required", "prefetch_count")
    return [row for row in rows if row["queue_name"] == queue]


async def bindings_to(*destinations: str, vhost: str = "/") -> dict[str, set[tuple[str, str]]]:
    """``{destination: {(source exchange, routing key), ...}}`` for every binding to one of
    ``destinations`` (bindings of the default exchange left out), in one ``rabbitmqctl`` call."""
    rows = await _ctl_json("list_bindings", "-p", vhost, "source_name", "destination_name", "routing_key")
    out: dict[str, set[tuple[str, str]]] = {name: set() for name in destinations}
    for row in rows:
        if row["destination_name"] in out and row["source_name"]:
            out[row["destination_name"]].add((row["source_name"], row["routing_key"]))
    return out


async def both(first: Awaitable[A], second: Awaitable[B]) -> tuple[A, B]:
    """Await two things concurrently (two ``rabbitmqctl`` calls take the time of one)."""
    results: dict[int, Any] = {}

    async def run(i: int, awaitable: Awaitable[Any]) -> None:
        results[i] = await awaitable

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, 0, first)
        tg.start_soon(run, 1, second)
    return results[0], results[1]
