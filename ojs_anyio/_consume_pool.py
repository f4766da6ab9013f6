"""The consume pool shared by the job worker and the event bus: N consumers x M pull tasks,
then a grace period on stop.

A :class:`ConsumePool` runs, in its own task group, the pull tasks added to it (``M``
tasks per consumer's delivery stream: :meth:`ConsumePool.add`), for as long as its
``async with`` block lasts.  It does no per-message work: each pull task is the layer's
own loop (``jobs._runner.JobRunner._pull_loop``, ``events._subscriber.Subscription.pull``),
started once, and the pool only counts the tasks that have not returned.  What it adds on
a pull loop's way is one coroutine frame (``_run``, which counts), resumed with the loop
after each wait for a delivery: tens of nanoseconds, one more profiled call per job.

The graceful stop (:meth:`ConsumePool.stop`, or leaving the block normally):

1. ``stop_fetching()``, called at once (a coroutine it returns is awaited within the grace
   period): the layer stops taking deliveries (the event bus cancels its consumers, so
   what they buffered goes back to the queue; the worker cancels its pull tasks that wait
   for a delivery, and they take no new job);
2. the running work gets ``grace_period`` seconds to finish and settle, that is, for every
   pull task to return;
3. then ``abandon()``: by default the pull tasks still running are cancelled (what they
   held is unacked: the broker delivers it again); the worker passes its own, which
   cancels the handlers still running and lets each pull task settle its job as abandoned.

Leaving the block with an error, or cancelled, cancels the pull tasks at once.

:meth:`stop` (synchronous: a signal handler may call it) runs the graceful stop as a task
of the pool; leaving the block normally runs it in place, shielded, so a cancellation that
arrives meanwhile waits at most the grace period.  The pool imports neither ``jobs`` nor
``events`` (an import-linter contract).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import TracebackType
from typing import Any, Self

import anyio
import anyio.abc

__all__ = ["ConsumePool"]


class ConsumePool:
    """Pull tasks, counted, and their graceful stop (see the module docstring)."""

    __slots__ = (
        "_abandon", "_all_done", "_cm", "_pulls", "_running", "_stop_fetching", "_stopping", "_tg",
        "grace_period",
    )  # fmt: skip

    def __init__(
        self,
        *,
        grace_period: float,
        stop_fetching: Callable[[], Coroutine[Any, Any, None] | None],
        abandon: Callable[[], None] | None = None,
    ) -> None:
        self.grace_period = grace_period
        self._stop_fetching = stop_fetching
        self._abandon = abandon
        self._pulls: list[tuple[int, Callable[[], Coroutine[Any, Any, None]]]] = []
        self._running = 0
        self._all_done: anyio.Event | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._stopping = False
        self._cm: AbstractAsyncContextManager[Self] | None = None

    def add(self, tasks: int, pull: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``tasks`` tasks of ``pull()`` (one consumer's M pull tasks) in the block."""
        assert self._tg is None, "pull tasks are added before the pool is entered"
        self._pulls.append((tasks, pull))

    async def __aenter__(self) -> Self:
        self._cm = self._open()
        return await self._cm.__aenter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        assert self._cm is not None
        return await self._cm.__aexit__(exc_type, exc, tb)

    @asynccontextmanager
    async def _open(self) -> AsyncIterator[Self]:
        all_done = self._all_done = anyio.Event()
        self._running = sum(tasks for tasks, _ in self._pulls)
        if not self._running:
            all_done.set()
        async with anyio.create_task_group() as tg:
            self._tg = tg
            for tasks, pull in self._pulls:
                for _ in range(tasks):
                    tg.start_soon(self._run, pull)
            if self._stopping:  # stop() came before the pool was entered
                tg.start_soon(self._drain, tg, self._stop_fetching())
            try:
                yield self
            except BaseException:
                tg.cancel_scope.cancel()  # an error or a cancellation: no grace period
                raise
            else:
                if self._stopping:
                    await all_done.wait()  # the graceful stop that stop() began goes on
                elif not all_done.is_set():
                    self._stopping = True
                    with anyio.CancelScope(shield=True):
                        await self._drain(tg, self._stop_fetching())
                tg.cancel_scope.cancel()
            finally:
                self._tg = None

    async def _run(self, pull: Callable[[], Coroutine[Any, Any, None]]) -> None:
        # The pull tasks are the pool's task group's own children (no task group between
        # them and the layer's: anyio walks the cancel scopes above a task at every
        # checkpoint), and this frame is the only thing the pool adds on their way.
        try:
            await pull()
        finally:
            self._running -= 1
            if self._running == 0:
                assert self._all_done is not None
                self._all_done.set()

    async def wait(self) -> None:
        """Wait until every pull task has returned (after a stop, or on their own)."""
        assert self._all_done is not None, "wait() inside the pool's block"
        await self._all_done.wait()

    def stop(self) -> None:
        """Begin the graceful stop (once); it runs as a task of the pool.  Before the pool is
        entered, it begins as the pool is entered."""
        if self._stopping:
            return
        self._stopping = True
        tg = self._tg
        if tg is not None:
            # Called here, not in the task: a synchronous stop_fetching takes effect at
            # once, before any pull task can take one more delivery.
            tg.start_soon(self._drain, tg, self._stop_fetching())

    async def _drain(self, tg: anyio.abc.TaskGroup, fetching_stops: Coroutine[Any, Any, None] | None) -> None:
        """Finish stopping the fetching (``fetching_stops``: what an asynchronous
        ``stop_fetching()`` returned), give the running work the grace period, then
        abandon the rest."""
        assert self._all_done is not None
        if self._all_done.is_set():  # every pull task has returned: nothing to stop
            if fetching_stops is not None:
                fetching_stops.close()
            return
        with anyio.move_on_after(self.grace_period):
            if fetching_stops is not None:
                await fetching_stops
            await self._all_done.wait()
            return
        if self._abandon is None:
            tg.cancel_scope.cancel()
        else:
            self._abandon()
