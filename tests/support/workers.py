"""Running a worker in a test, and what it reports (``from support.workers import Outcomes, running``).

* :class:`Outcomes`: records a worker's :class:`ojs_anyio.JobOutcome` events and waits on
  them (the tests synchronise on these, never on sleeps).
* :func:`running`: run a worker for the duration of a block, stop it gracefully on exit.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio

import ojs_anyio as ojs

__all__ = ["WAIT", "Outcomes", "running"]

#: Bound on any single wait of the job tests (seconds).
WAIT = 15.0


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
            lambda o: o.id == job_id and o.outcome in ("completed", "dead_lettered", "cancelled"),
            timeout=timeout,
        )
        return found[0]

    def of(self, job_id: str) -> list[ojs.JobOutcome]:
        return self.matching(lambda o: o.id == job_id)


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
