"""A handler's timeout: how long it may run, and the one task per worker that ends it.

:func:`handler_timeout` is the rule (the job's own ``timeout`` or the worker's default,
below the broker's consumer timeout).  :class:`TimeoutWatch` enforces it for every running
handler of a worker: each pull task runs its handlers in its own cancel scope (the
worker's ``_runner.py``), and the watch cancels that scope when the handler's
``ctx.deadline`` passes, as a deadline on the scope would, but without a timer armed and
disarmed per job (on asyncio about twenty calls a job).  It sleeps until the earliest
deadline of the handlers running; a handler that starts with an earlier one wakes it.

It also keeps sleeping until the deadline that last woke it after that handler is done:
a no-op job finishes before the watch gets to look, and were it then to sleep without a
deadline, the next job would wake it again, every job (at concurrency 1 that was a third
of a job's calls).  Handlers that start later, with later deadlines, need no wake; the
watch wakes once at that stale deadline, for nothing, and then sleeps until the earliest
deadline of the handlers running then.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import NoReturn

import anyio
from msgspec import UNSET

from ._context import JobContext
from ._envelope import Job

__all__ = ["JobScope", "TimeoutWatch", "handler_timeout"]

log = logging.getLogger("ojs_anyio.worker")


def handler_timeout(job: Job, default_timeout: float, broker_consumer_timeout: float) -> float:
    """The job's timeout in seconds, below the broker's consumer timeout."""
    own_timeout = job.timeout is not UNSET and isinstance(job.timeout, int) and job.timeout > 0
    timeout = float(job.timeout) if own_timeout else default_timeout  # type: ignore[arg-type]
    # The broker's clock starts at delivery, and a job may wait prefetched before its
    # handler starts: keep a 10% margin below the consumer timeout.  The worker's own
    # default is capped silently; a job that asks for more is warned about.
    cap = broker_consumer_timeout * 0.9
    if timeout > cap and own_timeout:
        log.warning(
            "job %s has timeout %.0fs, longer than the broker's consumer timeout (%.0fs): "
            "the broker would close the channel and redeliver it; it is capped at %.0fs",
            job.id, timeout, broker_consumer_timeout, cap,
        )  # fmt: skip
    return timeout if timeout <= cap else cap


class JobScope:
    """A pull task's cancel scope as the timeout watch, CANCEL, the grace period and a
    graceful stop cancel it (the worker's ``_runner.py``): they call :meth:`cancel`, and
    ``cut`` tells the pull task so without a call.  (``CancelScope.cancel_called`` is a
    property, on Trio one that reads the clock: read three times a job, it was a dozen
    calls there.)  The pull scope has no deadline, so ``cut`` is ``cancel_called``."""

    __slots__ = ("cut", "scope")

    def __init__(self, scope: anyio.CancelScope) -> None:
        self.scope = scope
        #: :meth:`cancel` was called.
        self.cut = False

    def cancel(self) -> None:
        self.cut = True
        self.scope.cancel()


class TimeoutWatch:
    """The timeouts of one worker's running handlers (see the module docstring)."""

    def __init__(self, running: dict[str, list[tuple[JobScope, JobContext]]]) -> None:
        #: The worker's running handlers by job id: (the pull task's scope, the context).
        self.running = running
        #: The earliest deadline of a running handler when the watch last looked (inf:
        #: none), and the event that wakes it (None while it is not running).  A handler
        #: starting with an earlier deadline lowers ``until`` and sets ``wake`` (the
        #: runner does, inline: one comparison per job).
        self.until = math.inf
        self.wake: anyio.Event | None = None

    async def run(self, scope: anyio.CancelScope, clock: Callable[[], float]) -> None:
        """Watch until ``scope`` is cancelled (the worker's queues are done)."""
        with scope:
            await self._watch(clock)
        self.wake = None
        self.until = math.inf

    async def _watch(self, clock: Callable[[], float]) -> NoReturn:
        while True:
            wake = self.wake = anyio.Event()
            now = clock()
            until = math.inf
            for entries in list(self.running.values()):
                for scope, ctx in entries:
                    deadline = ctx.deadline
                    if deadline is None:
                        continue
                    if deadline <= now:
                        scope.cancel()  # timed out (a sync handler is waited for: _run_sync)
                    elif deadline < until:
                        until = deadline
            if now < self.until < until:  # a deadline that woke it, of a handler since done
                until = self.until
            self.until = until
            with anyio.CancelScope(deadline=until):
                await wake.wait()
