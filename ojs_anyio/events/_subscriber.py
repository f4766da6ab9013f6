"""A subscription: one durable queue, its bindings, its consumers, redelivery and dead letters.

Queues (``q`` is ``{queue_tag}{name}``):

* ``q``: durable, bound to the bus's topic exchange with the subscription's patterns, with
  ``x-dead-letter-exchange ""`` and ``x-dead-letter-routing-key {q}.dlq`` (a message the
  broker dead-letters still lands in the DLQ).
* ``{q}.dlq``: durable, no arguments.  Dead letters, each with its reason.
* ``{q}.wait.{ms}``: durable, ``x-message-ttl`` ms, dead-lettering back into ``q`` through
  the default exchange.  Declared on first use; at most one per rung of the wait ladder.

Every publish here goes through the default exchange straight to one queue, so a
redelivery reaches this subscription only, never the other queues bound to the same key.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Protocol

import anyio
import msgspec
from opentelemetry import metrics

from .. import _pipeline, amqp
from .._attempts import parse_attempt, timeout_reason
from .._ladder import ttl_queue_arguments
from .._queue_options import (
    QueueOptions,
    dead_letter_queue_arguments,
    queue_arguments,
    quorum_queue_arguments,
)
from ._context import EventContext
from ._metrics import SubscriptionMetrics
from ._middleware import Middleware, build_handler_chain
from ._redelivery import RedeliveryPolicy
from ._wire import (
    CONTENT_JSON,
    H_ATTEMPT,
    H_DEAD_LETTERED_AT,
    H_ERROR,
    H_QUEUE,
    H_REASON,
    H_ROUTING_KEY,
    consumer_span,
    settle_span,
)

__all__ = ["DeadLetter", "EventContext", "Handler", "Subscription"]

log = logging.getLogger("ojs_anyio.events")

#: ``async def handler(payload[, ctx])``, or a plain ``def`` (it runs in a worker thread).
#: What it returns is ignored by the bus; ``around_handler`` middleware gets it.
Handler = Callable[..., Awaitable[object]] | Callable[..., object]


class BusView(Protocol):
    """What a subscription uses of its bus (``EventBus`` is one; ``_bus.py`` imports this
    module, not the other way round)."""

    exchange: str
    republish: amqp.RepublishPolicy
    #: Where the subscriptions' instruments go (None: metrics off).
    meter_provider: metrics.MeterProvider | None

    def queue_name(self, name: str) -> str: ...


class HandlerTimeoutError(TimeoutError):
    """An event handler's attempt ran past its subscription's ``timeout``: a failed attempt
    (redelivered with backoff, then dead-lettered).  A plain ``def`` handler runs in a
    thread, which cannot be interrupted: its attempt fails when it returns."""


class DeadLetter(Exception):
    """Raise from a handler to send the event to the dead-letter queue at once, no retry."""


def _wants_context(fn: Callable[..., Any]) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    positional = 0
    for p in sig.parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            return True
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            positional += 1
    return positional >= 2


def _annotated_payload(where: str, fn: Callable[..., Any]) -> Any:
    """What the handler's first parameter is annotated with, as a payload type (None: not
    annotated, ``Any`` or ``object``); the shared pipeline's rules (a dataclass, a
    TypedDict, a Struct, a pydantic model, ``list[int]``…)."""
    try:
        first = next(iter(inspect.signature(fn).parameters.values()))
    except (TypeError, ValueError, StopIteration):  # no signature, no parameter: no annotation
        return None
    return _pipeline.target_type(where, first.name, first.annotation, _pipeline.namespace(fn))


def _decoder(payload_type: Any) -> Callable[[bytes, str | None], Any]:
    """``decode(body, content_type)``; every failure is a ``_pipeline.ConversionError``."""
    if payload_type is bytes:
        return lambda body, _ct: body
    if payload_type is None:
        decode_any = _pipeline.json_decoder(Any)

        def untyped(body: bytes, content_type: str | None) -> Any:
            if content_type == CONTENT_JSON:
                return decode_any(body)
            return body  # bytes events (application/octet-stream, or no content type)

        return untyped
    decode_typed = _pipeline.json_decoder(payload_type)
    return lambda body, _ct: decode_typed(body)


class Subscription:
    """A running subscription (the value of ``async with bus.subscribe(...)``)."""

    def __init__(
        self,
        bus: BusView,
        name: str,
        handler: Handler,
        *,
        bindings: list[str],
        payload_type: Any,
        concurrency: int,
        prefetch: int,
        consumers: int,
        redelivery: RedeliveryPolicy,
        queue_options: QueueOptions | None = None,
        timeout: float | None = None,
        middleware: tuple[Middleware, ...] = (),
    ) -> None:
        self.bus = bus
        self.name = name
        #: Seconds an attempt may take (``subscribe(timeout=...)``); past it the attempt
        #: fails with :class:`HandlerTimeoutError` and the event is redelivered as for any
        #: failure.  None: no limit.
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
        ):
            raise amqp.UsageError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
        self.timeout = timeout
        #: The queue's limits, overflow, TTL and type (``subscribe(queue=...)``).
        self.queue_options = QueueOptions() if queue_options is None else queue_options
        self.queue = bus.queue_name(name)
        self.dead_letter_queue = f"{self.queue}.dlq"
        self.bindings = bindings
        self.handler = handler
        where = f"handler of subscription {name!r}"
        self._is_async = _pipeline.check_callable(where, handler)
        if payload_type is None:
            payload_type = _annotated_payload(where, handler)
        self.payload_type = payload_type
        #: Plain ``def`` handlers run in worker threads, as many at once as handlers may run.
        self._limiter = None if self._is_async else anyio.CapacityLimiter(concurrency * consumers)
        provider = bus.meter_provider
        self._metrics = None if provider is None else SubscriptionMetrics(provider, self.queue)
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.consumers = consumers
        self.redelivery = redelivery
        self._decode = _decoder(payload_type)
        self._wants_context = _wants_context(handler)
        #: The bus's middleware, then the subscription's (first = outermost).
        self.middleware = middleware
        #: Every ``around_handler`` around the handler, or None: the handler is called directly.
        self._handler_chain = build_handler_chain(middleware)
        #: Wait queues declared, per channel (recovery re-declares them).
        self._wait_declared: set[tuple[int, int]] = set()
        #: Events handled (acked), redelivered by the bus, and dead-lettered.
        self.handled = 0
        self.redelivered = 0
        self.dead_lettered = 0
        #: The AMQP connections this subscription's consumers run on.
        self.connections: list[amqp.Connection] = []
        self._listeners: list[Callable[[str, amqp.IncomingMessage], None]] = []

    def add_listener(self, callback: Callable[[str, amqp.IncomingMessage], None]) -> Callable[[], None]:
        """Call ``callback(outcome, message)`` after each event is settled; ``outcome`` is
        ``"handled"``, ``"redelivered"`` or ``"dead_lettered"``.  Returns a remover.
        Called synchronously: keep it short, and don't raise."""
        self._listeners.append(callback)
        return lambda: self._listeners.remove(callback)

    def _report(self, outcome: str, msg: amqp.IncomingMessage) -> None:
        for callback in self._listeners:
            callback(outcome, msg)

    def wait_queue_name(self, wait_ms: int) -> str:
        return f"{self.queue}.wait.{wait_ms}"

    def __repr__(self) -> str:
        return f"<Subscription {self.queue!r} bindings={self.bindings!r}>"

    # ------------------------------------------------------------------ topology

    async def declare(self, ch: amqp.Channel) -> None:
        """Exchange, DLQ, queue and bindings, idempotently (recorded for recovery)."""
        bus = self.bus
        options = self.queue_options
        await ch.exchange_declare(bus.exchange, "topic", durable=True)
        dlq_arguments = dead_letter_queue_arguments(options)
        await ch.queue_declare(self.dead_letter_queue, durable=True, arguments=dlq_arguments or None)
        await ch.queue_declare(
            self.queue,
            durable=True,
            arguments=queue_arguments(
                options,
                dead_letter_exchange="",
                dead_letter_routing_key=self.dead_letter_queue,
                priorities=False,
            ),
        )
        for pattern in self.bindings:
            await ch.queue_bind(self.queue, bus.exchange, pattern)

    async def _wait_queue(self, ch: amqp.Channel, wait_ms: int) -> str:
        name = self.wait_queue_name(wait_ms)
        key = (id(ch), wait_ms)
        if key not in self._wait_declared:
            await ch.queue_declare(
                name,
                durable=True,
                arguments=quorum_queue_arguments(
                    ttl_queue_arguments(wait_ms, dead_letter_exchange="", dead_letter_routing_key=self.queue),
                    self.queue_options,
                ),
            )
            self._wait_declared.add(key)
        return name

    # ------------------------------------------------------------------ consuming

    async def pull(self, ch: amqp.Channel, deliveries: amqp.Consumer) -> None:
        """One of ``concurrency`` loops sharing a consumer's bounded delivery stream."""
        decode = self._decode
        wants_context = self._wants_context
        needs_context = wants_context or self._handler_chain is not None
        queue = self.queue
        async for msg in deliveries:
            if msg.malformed is not None:
                await self._reject_malformed(msg)
                continue
            props = msg.properties
            headers = props.headers
            attempt = 1
            routing_key = msg.routing_key
            try:
                if headers:
                    original_key = headers.get(H_ROUTING_KEY)
                    if isinstance(original_key, str):
                        routing_key = original_key
                    try:
                        attempt = parse_attempt(headers.get(H_ATTEMPT))
                    except ValueError as exc:
                        error = f"{H_ATTEMPT}: {exc}"
                        await self._dead_letter(ch, msg, routing_key, 1, "invalid_payload", error)
                        continue
                try:
                    payload = decode(msg.body, props.content_type)
                except _pipeline.ConversionError as exc:
                    await self._dead_letter(ch, msg, routing_key, attempt, "invalid_payload", str(exc))
                    continue
                ctx = EventContext(msg, queue, routing_key, attempt, payload) if needs_context else None
                args: tuple[Any, ...] = (payload, ctx) if wants_context else (payload,)
                failure = await self._call(args, ctx, msg, routing_key, attempt)
                if isinstance(failure, DeadLetter):
                    reason = _pipeline.error_text(failure)
                    await self._dead_letter(ch, msg, routing_key, attempt, "rejected", reason, failure)
                    continue
                if failure is not None:
                    await self._rejected(ch, msg, routing_key, attempt, failure)
                    continue
                with settle_span(msg, queue, routing_key, "ack", "handled"):
                    await msg.ack()
                self.handled += 1
                if self._metrics is not None:
                    self._metrics.handled()
                if self._listeners:
                    self._report("handled", msg)
            except amqp.DELIVERY_LOST_ERRORS as exc:
                # Not settled: the broker puts the event back and redelivers it.
                log.warning(
                    "could not settle event %s on %s: %s; the broker will redeliver it",
                    props.message_id, queue, exc,
                )  # fmt: skip
            except Exception:
                # The backstop: a fault of ours (not the handler's, which is caught above) with
                # this one message.  It goes to the DLQ through the queue's own dead-letter
                # arguments, and the subscriber carries on with the next one.
                log.exception(
                    "event %s on %s could not be processed; rejected into %s",
                    props.message_id, queue, self.dead_letter_queue,
                )  # fmt: skip
                with (
                    contextlib.suppress(*amqp.DELIVERY_LOST_ERRORS, amqp.DeliveryAlreadySettledError),
                    settle_span(msg, queue, msg.routing_key, "reject", "dead_lettered"),
                ):
                    await msg.reject(requeue=False)

    def _invoke(self, args: tuple[Any, ...], ctx: EventContext | None) -> Awaitable[Any]:
        """The handler's call (in a thread if it is a plain ``def``), inside the
        ``around_handler`` chain when there is one."""
        chain = self._handler_chain
        if chain is None:
            return _pipeline.call(self.handler, self._is_async, args, self._limiter)
        assert ctx is not None  # built whenever there is a chain (pull)

        def call_handler() -> Awaitable[Any]:
            return _pipeline.call(self.handler, self._is_async, args, self._limiter)

        return chain(ctx, call_handler)

    async def _call(
        self,
        args: tuple[Any, ...],
        ctx: EventContext | None,
        msg: amqp.IncomingMessage,
        routing_key: str,
        attempt: int,
    ) -> Exception | None:
        """Run the handler once, through the middleware; what it (or they) raised, or None."""
        started = time.perf_counter()
        failure: Exception | None = None
        try:
            props = msg.properties
            with consumer_span(props.headers, self.queue, routing_key, props.message_id, attempt):
                if self.timeout is None:
                    await self._invoke(args, ctx)
                else:
                    with anyio.fail_after(self.timeout):
                        await self._invoke(args, ctx)
        except TimeoutError as exc:
            if self.timeout is None:
                failure = exc
            else:
                reason = timeout_reason(self.timeout)
                failure = HandlerTimeoutError(f"{reason} (subscription {self.queue})")
                failure.__cause__ = exc
        except Exception as exc:
            failure = exc
        if self._metrics is not None:
            self._metrics.finished(time.perf_counter() - started, failure)
        return failure

    def _log_extra(self, msg: amqp.IncomingMessage, routing_key: str, attempt: int) -> dict[str, Any]:
        """The ``extra`` of every per-event log record."""
        return {
            "event_id": msg.properties.message_id,
            "queue": self.queue,
            "routing_key": routing_key,
            "attempt": attempt,
        }

    async def _reject_malformed(self, msg: amqp.IncomingMessage) -> None:
        """An event whose content header the codec let through as malformed
        (``msg.malformed``).  It cannot be published again with its headers (nor read with
        them), so it is rejected without requeue: the queue's dead-letter arguments take it
        to the DLQ as it is, with RabbitMQ's ``x-death`` and without our reason headers,
        and the reason goes to the log."""
        message_id = amqp.property_text(msg.properties.message_id)
        try:
            with settle_span(msg, self.queue, msg.routing_key, "reject", "dead_lettered"):
                await msg.reject(requeue=False)
        except amqp.DELIVERY_LOST_ERRORS as exc:
            log.warning(
                "could not settle event %s on %s: %s; the broker will redeliver it",
                message_id, self.queue, exc,
            )  # fmt: skip
            return
        self.dead_lettered += 1
        if self._metrics is not None:
            self._metrics.dead_lettered("invalid_payload")
        self._report("dead_lettered", msg)
        log.error(
            "event %s on %s dead-lettered (malformed, rejected into %s): %s",
            message_id, self.queue, self.dead_letter_queue, msg.malformed,
        )  # fmt: skip

    async def _rejected(
        self, ch: amqp.Channel, msg: amqp.IncomingMessage, routing_key: str, attempt: int, exc: Exception
    ) -> None:
        policy = self.redelivery
        error = _pipeline.error_text(exc)
        if policy.exhausted(attempt):
            await self._dead_letter(
                ch, msg, routing_key, attempt, "max_attempts",
                f"{error} (after {policy.max_attempts} redeliveries)", exc,
            )  # fmt: skip
            return
        wait_ms = policy.wait_ms(attempt)
        target = self.queue if wait_ms == 0 else await self._wait_queue(ch, wait_ms)
        headers = dict(msg.properties.headers or {})
        headers[H_ATTEMPT] = attempt + 1
        headers[H_ROUTING_KEY] = routing_key
        headers[H_ERROR] = error
        props = msgspec.structs.replace(msg.properties, headers=headers)

        async def redeclare() -> None:
            self._wait_declared.discard((id(ch), wait_ms))
            if wait_ms:
                await self._wait_queue(ch, wait_ms)
            else:
                await self.declare(ch)

        # Confirmed before the original is acked: a crash in between duplicates, never loses.
        published = await amqp.republish(
            ch, msg.body, exchange="", routing_key=target, properties=props, mandatory=True,
            policy=self.bus.republish, redeclare=redeclare,
        )  # fmt: skip
        if published.final:
            await self._dead_letter(
                ch, msg, routing_key, attempt, "max_attempts",
                f"{error} (the redelivery cannot be queued: {published.reason})", exc,
            )  # fmt: skip
            return
        if published.gave_up:
            # A transient refusal is no verdict on the event: back to the broker, unchanged.
            with settle_span(msg, self.queue, routing_key, "reject", "requeued"):
                await msg.reject(requeue=True)
            _pipeline.log_failed_attempt(
                log, exc, self._log_extra(msg, routing_key, attempt),
                "event %s on %s failed (attempt %d): %s; the redelivery was not confirmed (%s): requeued",
                msg.properties.message_id, self.queue, attempt, error, published.reason,
            )  # fmt: skip
            return
        with settle_span(msg, self.queue, routing_key, "ack", "redelivered"):
            await msg.ack()
        self.redelivered += 1
        if self._metrics is not None:
            self._metrics.redelivered()
        self._report("redelivered", msg)
        _pipeline.log_failed_attempt(
            log, exc, self._log_extra(msg, routing_key, attempt),
            "event %s on %s failed (attempt %d): %s; redelivered in %d ms",
            msg.properties.message_id, self.queue, attempt, error, wait_ms,
        )  # fmt: skip

    async def _dead_letter(
        self,
        ch: amqp.Channel,
        msg: amqp.IncomingMessage,
        routing_key: str,
        attempt: int,
        reason: str,
        error: str,
        failure: BaseException | None = None,
    ) -> None:
        """Copy the event into the DLQ with its reason (confirmed), then ack the original;
        logged at ERROR, with the traceback of ``failure`` when a handler raised."""
        headers = dict(msg.properties.headers or {})
        headers.update(
            {
                H_REASON: reason,
                H_ERROR: error,
                H_ATTEMPT: attempt,
                H_ROUTING_KEY: routing_key,
                H_QUEUE: self.queue,
                H_DEAD_LETTERED_AT: datetime.now(UTC).isoformat(timespec="milliseconds"),
            }
        )
        props = msgspec.structs.replace(msg.properties, headers=headers)
        published = await amqp.republish(
            ch, msg.body, exchange="", routing_key=self.dead_letter_queue, properties=props, mandatory=True,
            policy=self.bus.republish,
        )  # fmt: skip
        if published.confirmed:
            with settle_span(msg, self.queue, routing_key, "ack", "dead_lettered"):
                await msg.ack()
        else:
            # Dead all the same: the queue's own dead-letter arguments take it to the DLQ
            # (with x-death), without the reason.
            log.error(
                "dead letter copy for %s refused (%s); rejected without the reason",
                self.queue, published.reason,
            )  # fmt: skip
            with settle_span(msg, self.queue, routing_key, "reject", "dead_lettered"):
                await msg.reject(requeue=False)
        self.dead_lettered += 1
        if self._metrics is not None:
            self._metrics.dead_lettered(reason)
        self._report("dead_lettered", msg)
        _pipeline.log_dead_letter(
            log, failure, {**self._log_extra(msg, routing_key, attempt), "reason": reason},
            "event %s on %s dead-lettered (%s, attempt %d): %s",
            msg.properties.message_id, self.queue, reason, attempt, error,
        )  # fmt: skip
