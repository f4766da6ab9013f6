"""Middleware: typed around-hooks for the producer and the consumer.

::

    class Timing(ojs.Middleware):
        async def around_handler(self, ctx, call_next):
            started = time.perf_counter()
            try:
                return await call_next()
            finally:
                log.info("%s took %.3f s", ctx.job.type, time.perf_counter() - started)

    worker = ojs.Worker(queues=["email"], middleware=[Timing()])
    async with ojs.connect(url, middleware=[Timing()]) as client: ...

* :meth:`Middleware.around_push` wraps one PUSH (``Client.push``/``push_job``): it sees the
  job before it is published and may replace it (add ``meta``, say), raise to refuse it, or
  observe the outcome of the publish.  ``push_batch`` calls it once per job, before the
  batch goes out, with a ``call_next`` that only records the (possibly changed) job.
* :meth:`Middleware.around_handler` wraps one handler call: it sees the
  :class:`JobContext`, returns the handler's result (or another), or raises (a raise is the
  handler's failure: retried or dead-lettered by the usual rules; :class:`Discard` and
  :class:`Retry` work from here too).
* :meth:`Middleware.on_skipped` is awaited before a job CANCELled before it started is
  acknowledged unrun (``WorkflowMiddleware`` settles the job's workflow with it).
* :meth:`Middleware.on_outcome` is told what became of each attempt (completed, retried,
  dead-lettered, cancelled, abandoned), synchronously, after the broker was told.

The first middleware in the list is the outermost.  Hooks a middleware does not override
cost nothing: the chains are built once, from the overridden hooks only, and with no
middleware at all the worker calls the handler directly (the mechanism is the one the
event bus's middleware uses: ``ojs_anyio._pipeline``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from .. import _pipeline

if TYPE_CHECKING:
    from ._context import JobContext, JobOutcome
    from ._envelope import Job

__all__ = ["Middleware", "build_handler_chain", "build_push_chain", "skip_hooks"]

log = logging.getLogger("ojs_anyio.middleware")

PushNext = Callable[["Job"], Awaitable["Job"]]
HandlerNext = Callable[[], Awaitable[Any]]


class Middleware:
    """Base class: override the hooks you need; the others pass straight through."""

    async def around_push(self, job: Job, call_next: PushNext) -> Job:
        return await call_next(job)

    async def around_handler(self, ctx: JobContext, call_next: HandlerNext) -> Any:
        return await call_next()

    def on_outcome(self, outcome: JobOutcome) -> None:
        return None

    async def on_skipped(self, job: Job) -> None:
        """A job CANCELled before it started is about to be acknowledged unrun (awaited
        first: a connection error leaves it unacknowledged, for the broker to redeliver)."""
        return None


def overrides(mw: Middleware, name: str) -> bool:
    """Whether ``mw`` overrides hook ``name`` (hooks left alone cost nothing)."""
    return _pipeline.overrides(mw, Middleware, name)


def check_middleware(middleware: Sequence[Middleware] | None) -> tuple[Middleware, ...]:
    """Validate a ``middleware=`` argument (a list of :class:`Middleware` instances)."""
    return _pipeline.check_middleware(middleware, Middleware, "ojs_anyio.Middleware")


def build_push_chain(middleware: Sequence[Middleware], publish: PushNext) -> PushNext:
    """``publish`` wrapped by every middleware's ``around_push`` (first = outermost)."""
    return _pipeline.around_chain(_pipeline.hooks(middleware, Middleware, "around_push"), publish)


HandlerChain = Callable[["JobContext", HandlerNext], Awaitable[Any]]


def build_handler_chain(middleware: Sequence[Middleware]) -> HandlerChain | None:
    """A function ``(ctx, call_handler) -> result`` running every ``around_handler``
    (first = outermost), or None when no middleware overrides it (call the handler directly)."""
    return _pipeline.context_chain(_pipeline.hooks(middleware, Middleware, "around_handler"))


def skip_hooks(middleware: Sequence[Middleware]) -> tuple[Callable[[Job], Awaitable[None]], ...]:
    return tuple(m.on_skipped for m in middleware if overrides(m, "on_skipped"))


def outcome_hooks(middleware: Sequence[Middleware]) -> tuple[Callable[[JobOutcome], None], ...]:
    return tuple(m.on_outcome for m in middleware if overrides(m, "on_outcome"))
