"""Event-bus middleware: typed around-hooks for publishing and for handling.

::

    class Origin(events.Middleware):
        async def around_publish(self, event, call_next):
            headers = {**(event.headers or {}), "x-origin": "web"}
            return await call_next(msgspec.structs.replace(event, headers=headers))

        async def around_handler(self, ctx, call_next):
            started = time.perf_counter()
            try:
                return await call_next()
            finally:
                log.info("%s took %.3f s", ctx.routing_key, time.perf_counter() - started)

    async with events.connect(url, middleware=[Origin()]) as bus: ...
    async with bus.subscribe("rec.read", on_read, middleware=[Audit()]): ...

* :meth:`Middleware.around_publish` wraps one publish (``publish``, ``publish_many``, a
  window's ``publish``): it sees the :class:`OutgoingEvent` before it is encoded and
  sent, may replace it (another payload, more headers, another routing key), raise to
  refuse it, or observe the outcome (``call_next`` returns the event as sent, after its
  confirm for ``publish``; when it is sent for a window's, whose confirm is its handle's).
* :meth:`Middleware.around_handler` wraps one handler call: it sees the
  :class:`EventContext` (``ctx.payload`` is the decoded, typed payload), returns the
  handler's result (or another), or raises: a raise is the handler's failure
  (redelivered, then dead-lettered, by the subscription's rules; ``events.DeadLetter``
  dead-letters at once).  The subscription's ``timeout`` covers the whole chain.

The first middleware is the outermost; a bus's middleware wraps every subscription's own.
Hooks a middleware does not override cost nothing, and with none the bus publishes and
calls handlers directly: the chains are those of the job layer's middleware
(``ojs_anyio._pipeline``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec

from .. import _pipeline
from ._context import EventContext

__all__ = ["HandlerChain", "HandlerNext", "Middleware", "OutgoingEvent", "PublishNext"]


class OutgoingEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One event on its way out, as ``around_publish`` sees it (replace it with
    ``msgspec.structs.replace``)."""

    routing_key: str
    #: What ``publish`` was given: a msgspec Struct, a dict (JSON), bytes…  Encoded after
    #: the last ``around_publish``.
    payload: Any
    #: The AMQP ``message_id`` (``publish``'s, else a fresh UUIDv7).
    message_id: str
    #: Application headers, besides the trace context the bus adds.
    headers: dict[str, Any] | None = None


PublishNext = Callable[[OutgoingEvent], Awaitable[OutgoingEvent]]
HandlerNext = Callable[[], Awaitable[Any]]
HandlerChain = Callable[[EventContext, HandlerNext], Awaitable[Any]]


class Middleware:
    """Base class: override the hooks you need; the others pass straight through."""

    async def around_publish(self, event: OutgoingEvent, call_next: PublishNext) -> OutgoingEvent:
        return await call_next(event)

    async def around_handler(self, ctx: EventContext, call_next: HandlerNext) -> Any:
        return await call_next()


def check_middleware(middleware: Sequence[Middleware] | None) -> tuple[Middleware, ...]:
    """Validate a ``middleware=`` argument (a list of :class:`Middleware` instances)."""
    return _pipeline.check_middleware(middleware, Middleware, "ojs_anyio.events.Middleware")


def publish_hooks(
    middleware: Sequence[Middleware],
) -> list[Callable[[OutgoingEvent, PublishNext], Awaitable[OutgoingEvent]]]:
    """The ``around_publish`` hooks that do something (first = outermost)."""
    return _pipeline.hooks(middleware, Middleware, "around_publish")


def build_publish_chain(
    hooks: Sequence[Callable[[OutgoingEvent, PublishNext], Awaitable[OutgoingEvent]]], send: PublishNext
) -> PublishNext:
    """``send`` wrapped by every ``around_publish`` hook (first = outermost)."""
    return _pipeline.around_chain(hooks, send)


def build_handler_chain(middleware: Sequence[Middleware]) -> HandlerChain | None:
    """A function ``(ctx, call_handler) -> result`` running every ``around_handler``
    (first = outermost), or None when no middleware overrides it (call the handler directly)."""
    return _pipeline.context_chain(_pipeline.hooks(middleware, Middleware, "around_handler"))
