"""The event bus: a topic exchange, a publisher channel pool, a subscriber connection pool.

``async with events.connect(url, exchange="beds.events", queue_tag="prod_") as bus:``

The bus owns a task group.  Every AMQP connection it opens (one for publishing, and as
many for subscribing as the per-connection subscription limit requires) is held by one
task of that group, inside ``amqp.connect(...)`` with recovery on, so no connection
outlives the block, and each recovers on its own after a connection loss: topology
(exchange, queues, bindings), channels, consumers.  If one gives up, the block exits with
its ``RecoveryFailedError``.  The bus uses only the public API of ``ojs_anyio.amqp``; the
URL picks the transport and the vhost, so ``memory://`` needs nothing special here.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, NoReturn

import anyio
import anyio.abc
from opentelemetry import metrics as otel_metrics

from .. import amqp
from .._common import single_error
from .._consume_pool import ConsumePool
from .._misuse import ArgumentTypeError, UsageError
from .._queue_options import QueueOptions
from ._dead_letters import EventDeadLetters
from ._middleware import Middleware, OutgoingEvent, build_publish_chain, check_middleware, publish_hooks
from ._pool import ConnectionPool, ConsumerStopper, Slot, stop_all
from ._redelivery import RedeliveryPolicy
from ._subscriber import Handler, Subscription
from ._wire import encode_payload, event_properties, new_message_id, producer_span, trace_headers

__all__ = ["DEFAULT_URL", "EventBus", "EventHandle", "EventWindow", "connect"]

#: The job layer's default broker, kept for code that imported it from here; the bus itself
#: does not use it (see :data:`DEVELOPMENT_URL`).
DEFAULT_URL = "amqp://guest:guest@localhost:5672/"
#: Where a bus goes with no URL and no ``$OJS_AMQP_URL``: the process's in-memory broker, as
#: seed 004 says ("if mq-url is not set then the in-memory implementation is used").
DEVELOPMENT_URL = "memory://"
#: Name prefixes the bus refuses for its exchange and queues: ``amq.`` is RabbitMQ's own (a
#: declare gets 403) and ``ojs.`` the job layer's (a clash gets 406, or mixes jobs with events).
RESERVED_PREFIXES = ("amq.", "ojs.")

log = logging.getLogger("ojs_anyio.events")

#: ``callback(routing_key, message_id, body, content_type, headers)``: see
#: :meth:`EventBus.add_publish_listener`.
PublishListener = Callable[[str, str, bytes, str, "dict[str, Any] | None"], None]


class QueueFullError(amqp.PublishNackedError):
    """QUEUE_FULL: the broker refused an event (``Basic.Nack``): a queue its routing key
    reaches is at its ``max_length`` / ``max_length_bytes`` with ``overflow="reject-publish"``,
    or a quorum queue had no leader at that moment.  The queues that did accept it keep it
    (RabbitMQ nacks when any one refuses); the refusing queue does not have it.  Publish it
    again later (with the same ``message_id`` if duplicates matter).  Also an
    ``amqp.PublishNackedError``."""

    code = "QUEUE_FULL"

    def __init__(self, message: str, *, exchange: str, routing_key: str, message_id: str) -> None:
        super().__init__(message, exchange=exchange, routing_key=routing_key)
        self.message_id = message_id


def queue_full(exc: amqp.PublishNackedError, message_id: str) -> QueueFullError:
    """The bus's error for a nacked event."""
    error = QueueFullError(
        f"QUEUE_FULL: event {message_id} ({exc.routing_key!r} on {exc.exchange!r}) was refused by the "
        "broker: a queue it routes to is full with overflow reject-publish, or a quorum queue had no "
        "leader; queues that accepted it keep it",
        exchange=exc.exchange,
        routing_key=exc.routing_key,
        message_id=message_id,
    )
    error.__cause__ = exc
    return error


def check_bus_name(what: str, name: str) -> None:
    """Refuse a reserved exchange or queue name before the broker does, with the reason."""
    for prefix in RESERVED_PREFIXES:
        if name.startswith(prefix):
            owner = "RabbitMQ's own names" if prefix == "amq." else "the job layer's names"
            raise amqp.UsageError(
                f"the event bus cannot use {what} {name!r}: the {prefix!r} prefix is reserved for {owner}"
            )


#: Recovery for every connection of the bus, unless ``recovery=`` says otherwise.
DEFAULT_RECOVERY = amqp.RecoveryPolicy()


class EventBus:
    """Publish events to a topic exchange and subscribe queues to it.  Use :func:`connect`."""

    def __init__(
        self,
        url: str | None = None,
        *,
        exchange: str = "events",
        queue_tag: str = "",
        mandatory: bool = True,
        publisher_pool_size: int = 4,
        max_subscriptions_per_connection: int = 100,
        redelivery: RedeliveryPolicy | None = None,
        recovery: amqp.RecoveryPolicy | None = None,
        connection_name: str = "ojs-events",
        republish: amqp.RepublishPolicy = amqp.DEFAULT_REPUBLISH_POLICY,
        publish_timeout: float | None = amqp.DEFAULT_PUBLISH_TIMEOUT,
        confirm_timeout: float | None = amqp.DEFAULT_CONFIRM_TIMEOUT,
        metrics: bool = True,
        meter_provider: otel_metrics.MeterProvider | None = None,
        middleware: Sequence[Middleware] | None = None,
        **connect_options: Any,
    ) -> None:
        if publisher_pool_size < 1:
            raise UsageError("publisher_pool_size must be >= 1")
        if max_subscriptions_per_connection < 1:
            raise UsageError("max_subscriptions_per_connection must be >= 1")
        if not exchange:
            raise UsageError("the exchange needs a name (the default exchange is not a topic exchange)")
        check_bus_name("exchange", exchange)
        self.url = url or os.environ.get("OJS_AMQP_URL") or DEVELOPMENT_URL
        self.exchange = exchange
        self.queue_tag = queue_tag
        self.mandatory = mandatory
        self.publisher_pool_size = publisher_pool_size
        self.max_subscriptions_per_connection = max_subscriptions_per_connection
        self.redelivery = redelivery or RedeliveryPolicy()
        self.recovery = recovery or DEFAULT_RECOVERY
        #: How redeliveries and dead-letter copies ride out transient refusals (see amqp.republish).
        self.republish = republish
        self.connection_name = connection_name
        #: The publisher connection's bound on waiting for recovery (subscribers wait as long
        #: as recovery takes), and a publish's bound on waiting for its confirm.
        self.publish_timeout = publish_timeout
        self.confirm_timeout = confirm_timeout
        #: Where each subscription's instruments go (see ``_metrics.py``): ``meter_provider``,
        #: else the global one when an OpenTelemetry SDK is installed; None: no metrics.
        if meter_provider is None and metrics and amqp.sdk_meter_provider_installed():
            meter_provider = otel_metrics.get_meter_provider()
        self.meter_provider = meter_provider if metrics else None
        #: Around every publish and every subscription's handler (first = outermost).
        self.middleware = check_middleware(middleware)
        self._publish_hooks = publish_hooks(self.middleware)
        #: Every connection of the bus, each held by a task of its task group (``_pool.py``).
        self._pool = ConnectionPool(
            self.url,
            recovery=self.recovery,
            connection_name=connection_name,
            max_subscriptions_per_connection=max_subscriptions_per_connection,
            connect_options=connect_options,
        )
        self._publisher: Slot | None = None
        self._channels: list[amqp.Channel] = []
        self._next = 0
        self._reopen_lock = anyio.Lock()
        self._publisher_lock = anyio.Lock()
        self._publish_listeners: list[PublishListener] = []

    def __repr__(self) -> str:
        return f"<EventBus exchange={self.exchange!r} queue_tag={self.queue_tag!r}>"

    def add_publish_listener(self, callback: PublishListener) -> Callable[[], None]:
        """Call ``callback(routing_key, message_id, body, content_type, headers)`` for each
        event this bus publishes: after its confirm for :meth:`publish`, when it is sent for
        a window's.  For tests (``ojs_anyio.testing.bus_tester``); keep it short, and don't
        raise.  Returns a remover."""
        self._publish_listeners.append(callback)
        return lambda: self._publish_listeners.remove(callback)

    def _published(
        self,
        routing_key: str,
        message_id: str,
        body: bytes,
        content_type: str,
        headers: dict[str, Any] | None,
    ) -> None:
        for callback in self._publish_listeners:
            callback(routing_key, message_id, body, content_type, headers)

    def queue_name(self, name: str) -> str:
        """The AMQP queue of a subscription: ``{queue_tag}{name}`` (``prod_rec.read``)."""
        return f"{self.queue_tag}{name}"

    @property
    def publisher_connection(self) -> amqp.Connection:
        """The publisher connection: it opens with the first publish (a subscriber-only bus
        has none), so this raises ``amqp.UsageError`` before that."""
        if self._publisher is None:
            raise amqp.UsageError("the bus has no publisher connection yet: it opens with the first publish")
        return self._publisher.conn

    async def admin_connection(self) -> amqp.Connection:
        """The connection administration uses (dead letters): the publisher's, opened if
        it is not yet."""
        if not self._channels:
            await self._open_publisher()
        return self.publisher_connection

    def dead_letters(self, name: str) -> EventDeadLetters:
        """The dead-letter queue of subscription ``name``: peek, requeue, purge, prune."""
        check_bus_name("queue", self.queue_name(name))
        return EventDeadLetters(self, name)

    @property
    def subscriber_connections(self) -> list[amqp.Connection]:
        """The connections opened for subscriptions so far (the subscriber pool)."""
        return [slot.conn for slot in self._pool.subscriber_slots]

    # ------------------------------------------------------------------ lifecycle

    async def _start(self, tg: anyio.abc.TaskGroup) -> None:
        # Connections open on first use: the publisher's with the first publish (a
        # subscriber-only bus never opens one), the subscribers' with the subscriptions.
        self._pool.start(tg)

    async def _open_publisher(self) -> None:
        """The publisher connection and its channel pool, once (concurrent first publishes
        wait for the same opening); the exchange is declared before anything is published."""
        async with self._publisher_lock:
            if self._channels:
                return
            if self._pool.closed:
                raise amqp.UsageError("the event bus is closed")
            slot = await self._pool.open(f"{self.connection_name}-pub", publish_timeout=self.publish_timeout)
            channels: list[amqp.Channel] = []
            try:
                for _ in range(self.publisher_pool_size):
                    ch = slot.conn.channel(confirms=True)
                    await ch.open()
                    channels.append(ch)
                await channels[0].exchange_declare(self.exchange, "topic", durable=True)
            except BaseException:
                slot.stop.set()
                raise
            self._publisher = slot
            self._channels = channels

    async def aclose(self) -> None:
        """Close the publisher channels and every connection (idempotent)."""
        if self._pool.closed:
            return
        self._pool.closed = True
        with anyio.CancelScope(shield=True):
            for ch in self._channels:
                await ch.aclose()
        self._pool.close(self._publisher)

    # ------------------------------------------------------------------ publishing

    async def _channel(self) -> amqp.Channel:
        if not self._channels:
            await self._open_publisher()
        i = self._next = (self._next + 1) % len(self._channels)
        ch = self._channels[i]
        if ch.closed_error is not None:
            ch = await self._reopen(i)
        return ch

    async def _reopen(self, i: int) -> amqp.Channel:
        """Replace a pool channel the broker closed (a 404 on a publish, say)."""
        async with self._reopen_lock:
            ch = self._channels[i]
            if ch.closed_error is None:
                return ch
            if self._publisher is None or self._pool.closed:
                raise amqp.ChannelClosedError("the event bus is closed")
            fresh = self._publisher.conn.channel(confirms=True)
            await fresh.open()
            self._channels[i] = fresh
            return fresh

    def _headers(self, extra: dict[str, Any] | None) -> dict[str, Any] | None:
        traced = trace_headers()
        if traced is None:
            return dict(extra) if extra else None
        if extra:
            traced.update(extra)
        return traced

    async def publish(
        self,
        routing_key: str,
        payload: object,
        *,
        headers: dict[str, Any] | None = None,
        message_id: str | None = None,
        mandatory: bool | None = None,
        timeout: float | None = None,
    ) -> str:
        """Publish one event and wait for the broker's confirm; return its message id.

        ``payload``: a msgspec Struct or a dict (JSON), or bytes.  Persistent, with
        ``message_id``, ``timestamp``, ``content_type`` and the current trace context.
        Raises ``amqp.UnroutableError`` when no queue is bound to the key (``mandatory``,
        on by default), ``amqp.PublishNackedError``, ``amqp.PublishOutcomeUnknownError``
        (sent, then the connection died or no confirm came within the bus's
        ``confirm_timeout``: publish again, with the same ``message_id``, if a duplicate is
        acceptable) or ``amqp.PublishTimeoutError`` (not sent: the connection was not usable
        within ``timeout``, by default the bus's ``publish_timeout``).
        """
        mid = message_id or new_message_id()
        event = OutgoingEvent(routing_key=routing_key, payload=payload, message_id=mid, headers=headers)
        if not self._publish_hooks:
            await self._send(event, mandatory, timeout)
            return mid
        send = functools.partial(self._send, mandatory=mandatory, timeout=timeout)
        return (await build_publish_chain(self._publish_hooks, send)(event)).message_id

    async def _send(
        self, event: OutgoingEvent, mandatory: bool | None, timeout: float | None
    ) -> OutgoingEvent:
        """Encode and publish one event (the innermost ``around_publish``); wait for its confirm."""
        routing_key, mid, headers = event.routing_key, event.message_id, event.headers
        body, content_type = encode_payload(event.payload)
        ch = await self._channel()
        with producer_span(self.exchange, routing_key, mid):
            props = event_properties(content_type, mid, self._headers(headers))
            try:
                await ch.publish(
                    body,
                    exchange=self.exchange,
                    routing_key=routing_key,
                    properties=props,
                    mandatory=self.mandatory if mandatory is None else mandatory,
                    timeout=timeout,
                    confirm_timeout=self.confirm_timeout,
                )
            except amqp.PublishNackedError as exc:
                raise queue_full(exc, mid) from exc
        if self._publish_listeners:
            self._published(routing_key, mid, body, content_type, headers)
        return event

    def publish_window(self, max_in_flight: int = 1024) -> EventWindow:
        """The bulk path: many events in flight from one task, no task per event.  The
        window takes a pool channel with its first publish."""
        if not self._pool.usable:
            raise amqp.UsageError("the bus is not connected")
        return EventWindow(self, max_in_flight)

    async def publish_many(
        self, events: Iterable[tuple[str, object]], *, max_in_flight: int = 1024
    ) -> list[str]:
        """Publish ``(routing_key, payload)`` pairs through a window; return their ids.

        Every event is sent; then, if any failed, the first failure is raised (its note
        says how many failed).
        """
        window = self.publish_window(max_in_flight)
        ids = [(await window.publish(key, payload)).message_id for key, payload in events]
        failed = await window.wait_all(self.confirm_timeout)
        if failed:
            error = failed[0].error
            assert error is not None  # EventHandle.error: a nack is already a QueueFullError
            error.add_note(f"{len(failed)} of {len(ids)} events failed")
            raise error
        return ids

    # ------------------------------------------------------------------ subscribing

    @asynccontextmanager
    async def subscribe(
        self,
        name: str,
        handler: Handler,
        *,
        bindings: Iterable[str] | None = None,
        payload_type: Any = None,
        concurrency: int = 1,
        prefetch: int | None = None,
        consumers: int = 1,
        redelivery: RedeliveryPolicy | None = None,
        grace_period: float = 10.0,
        queue: QueueOptions | None = None,
        timeout: float | None = None,
        middleware: Sequence[Middleware] | None = None,
    ) -> AsyncIterator[Subscription]:
        """Consume queue ``{queue_tag}{name}`` with ``handler`` for the duration of the block.

        On entry the queue, its dead-letter queue and its bindings (``bindings``, by
        default ``[name]``: the routing key the queue is named after; ``*`` and ``#``
        wildcards allowed) are declared and the consumers registered: the queue's presence
        means "ready".  Instances that subscribe with the same name share the queue, and
        each event goes to one of them.

        ``handler(payload)`` or ``handler(payload, ctx: EventContext)``: a coroutine
        function, or a plain function, which then runs in a worker thread (as many at once
        as ``concurrency`` x ``consumers``); anything else is refused with
        ``ArgumentTypeError``.  ``payload_type`` (or the annotation of the handler's first
        parameter: a msgspec Struct, a dataclass, a TypedDict, a pydantic model,
        ``list[int]``…) decodes and validates the JSON body into that type (an event that
        does not fit is dead-lettered as ``invalid_payload`` with a reason naming the
        field); ``bytes`` gives the body as it is; ``None`` (or ``Any``) gives JSON events
        decoded (dicts) and other events as bytes.

        ``consumers`` AMQP consumers, each on its own channel (Orb's subscriber pool),
        each running ``concurrency`` handlers at once with ``prefetch`` deliveries
        buffered (default ``max(2 * concurrency, 8)``).  Each consumer counts against the
        bus's ``max_subscriptions_per_connection``; past it, a new connection opens.

        A handler that raises rejects the event (redelivery with backoff, then the
        dead-letter queue); ``raise DeadLetter(reason)`` dead-letters it at once; a body
        that does not decode is dead-lettered as ``invalid_payload``.

        ``timeout``: seconds an attempt may take; past it the attempt fails with
        :class:`HandlerTimeoutError` (redelivery with backoff, then the dead-letter queue).

        ``middleware``: :class:`~ojs_anyio.events.Middleware` whose ``around_handler`` wraps
        this subscription's handler, inside the bus's middleware (``around_publish``: the bus's).

        ``queue``: a :class:`~ojs_anyio.QueueOptions` for the queue (length and byte limits
        with an overflow policy, message TTL, ``QueueOptions.quorum()`` for a cluster; its
        DLQ bounds apply to ``{queue}.dlq``, and with a quorum queue the DLQ and wait queues
        are quorum too; ``max_priority`` does not apply: events have no priorities).  With
        ``overflow="reject-publish"`` a full queue makes :meth:`publish` raise
        :class:`QueueFullError`.  Options must match the queue's existing arguments
        (RabbitMQ refuses a redeclare with others: 406).

        Leaving the block normally stops the consumers (events buffered but not started go
        back to the queue) and lets the running handlers finish within ``grace_period``
        seconds; then, or when the block fails or is cancelled, the handlers still running
        are cancelled: their events were not acked and come again.
        """
        if concurrency < 1 or consumers < 1:
            raise UsageError("concurrency and consumers must be >= 1")
        if prefetch is None:
            prefetch = max(2 * concurrency, 8)
        if prefetch < concurrency:
            raise UsageError(f"prefetch ({prefetch}) must be >= concurrency ({concurrency})")
        if isinstance(bindings, str):
            raise ArgumentTypeError("bindings is a list of patterns, not one string")
        check_bus_name("queue", self.queue_name(name))
        patterns = [name] if bindings is None else list(bindings)
        sub = Subscription(
            self,
            name,
            handler,
            bindings=patterns,
            payload_type=payload_type,
            concurrency=concurrency,
            prefetch=prefetch,
            consumers=consumers,
            redelivery=redelivery or self.redelivery,
            queue_options=queue,
            timeout=timeout,
            middleware=self.middleware + check_middleware(middleware),
        )
        async with AsyncExitStack() as stack:
            declared: set[int] = set()
            stoppers: list[ConsumerStopper] = []
            pool = ConsumePool(grace_period=grace_period, stop_fetching=functools.partial(stop_all, stoppers))
            for _ in range(consumers):
                slot = await self._pool.acquire()
                stack.callback(self._pool.release, slot)
                ch = await stack.enter_async_context(slot.conn.channel(confirms=True))
                if id(slot) not in declared:
                    # On every connection it uses, so each one's recovery restores it.
                    await sub.declare(ch)
                    declared.add(id(slot))
                    sub.connections.append(slot.conn)
                stopper = ConsumerStopper(ch.consume(sub.queue, prefetch=prefetch))
                deliveries = await stopper.start()
                stack.push_async_callback(stopper.stop)
                stoppers.append(stopper)
                pool.add(concurrency, functools.partial(sub.pull, ch, deliveries))
            try:
                async with pool:
                    yield sub
            except BaseExceptionGroup as eg:
                # A consumer that ended for good (its queue could not be restored, recovery
                # gave up) or the block's own error: raise that one error, not a group.
                single = single_error(eg)
                if single is None:
                    raise
                raise single from single.__cause__

    async def serve(self, name: str, handler: Handler, **options: Any) -> NoReturn:
        """``subscribe(name, handler, **options)`` until cancelled."""
        async with self.subscribe(name, handler, **options):
            await anyio.sleep_forever()
        raise AssertionError("unreachable")  # pragma: no cover


class EventWindow:
    """Keep up to ``max_in_flight`` events unconfirmed from one task (``bus.publish_window()``).

    ``await window.publish(key, payload)`` waits only when the window is full and returns
    an ``amqp.PublishHandle`` (with ``message_id`` added); ``await window.wait_all()``
    returns the handles that failed (unroutable, nacked, outcome unknown).
    """

    __slots__ = ("_bus", "_max_in_flight", "_window", "channel")

    def __init__(self, bus: EventBus, max_in_flight: int) -> None:
        self._bus = bus
        self._max_in_flight = max_in_flight
        #: The pool channel the window publishes on (None until its first publish).
        self.channel: amqp.Channel | None = None
        self._window: amqp.PublishWindow | None = None

    async def _open(self) -> amqp.PublishWindow:
        self.channel = await self._bus._channel()
        self._window = self.channel.publish_window(self._max_in_flight)
        return self._window

    async def publish(
        self,
        routing_key: str,
        payload: object,
        *,
        headers: dict[str, Any] | None = None,
        message_id: str | None = None,
        mandatory: bool | None = None,
    ) -> EventHandle:
        bus = self._bus
        mid = message_id or new_message_id()
        if not bus._publish_hooks:
            return await self._send(routing_key, payload, headers, mid, mandatory)
        handles: list[EventHandle] = []

        async def send(event: OutgoingEvent) -> OutgoingEvent:
            handles.append(
                await self._send(event.routing_key, event.payload, event.headers, event.message_id, mandatory)
            )
            return event

        event = OutgoingEvent(routing_key=routing_key, payload=payload, message_id=mid, headers=headers)
        await build_publish_chain(bus._publish_hooks, send)(event)
        if not handles:
            raise UsageError(
                "an around_publish middleware returned without calling call_next: nothing was sent"
            )
        return handles[-1]

    async def _send(
        self,
        routing_key: str,
        payload: object,
        headers: dict[str, Any] | None,
        mid: str,
        mandatory: bool | None,
    ) -> EventHandle:
        bus = self._bus
        body, content_type = encode_payload(payload)
        window = self._window or await self._open()
        handle = await window.publish(
            body,
            exchange=bus.exchange,
            routing_key=routing_key,
            properties=event_properties(content_type, mid, bus._headers(headers)),
            mandatory=bus.mandatory if mandatory is None else mandatory,
        )
        if bus._publish_listeners:
            bus._published(routing_key, mid, body, content_type, headers)
        return EventHandle(handle, mid)

    @property
    def in_flight(self) -> int:
        return 0 if self._window is None else self._window.in_flight

    async def wait_all(self, timeout: float | None = None) -> list[EventHandle]:
        """Flush, wait for every confirm; return the failed events (``[]``: all confirmed).

        ``timeout`` bounds the wait (default: the bus's ``confirm_timeout``); events still
        unconfirmed then fail with ``amqp.PublishOutcomeUnknownError``.  A returned
        (unroutable) event's ``message_id`` is known from the broker's return; for other
        failures it is ``""``: keep the handles ``publish`` gave if you need it.
        """
        if self._window is None:
            return []
        failed = await self._window.wait_all(self._bus.confirm_timeout if timeout is None else timeout)
        out = []
        for h in failed:
            props = getattr(h.error, "properties", None)
            mid = getattr(props, "message_id", None) or ""
            out.append(EventHandle(h, mid))
        return out


class EventHandle:
    """A published event's :class:`amqp.PublishHandle` and message id."""

    __slots__ = ("handle", "message_id")

    def __init__(self, handle: amqp.PublishHandle, message_id: str) -> None:
        self.handle = handle
        self.message_id = message_id

    @property
    def done(self) -> bool:
        return self.handle.done

    @property
    def error(self) -> BaseException | None:
        error = self.handle.error
        if isinstance(error, amqp.PublishNackedError) and not isinstance(error, QueueFullError):
            return queue_full(error, self.message_id)
        return error

    @property
    def routing_key(self) -> str:
        return self.handle.routing_key

    async def wait(self) -> None:
        await self.handle.wait()

    def __repr__(self) -> str:
        return f"<EventHandle {self.message_id!r} {self.handle!r}>"


@asynccontextmanager
async def connect(url: str | None = None, **options: Any) -> AsyncIterator[EventBus]:
    """Open an :class:`EventBus` for the block.

    ``url``: the broker; without one, ``$OJS_AMQP_URL``; without that, the in-process
    ``memory://`` broker, with a WARNING that it is for development only (seed 004's rule;
    the job layer's ``ojs_anyio.connect()`` defaults to RabbitMQ on localhost instead).

    Options: ``exchange`` (default ``"events"``), ``queue_tag`` (``""``), ``mandatory``
    (True), ``publisher_pool_size`` (4), ``max_subscriptions_per_connection`` (100),
    ``redelivery`` (:class:`RedeliveryPolicy`), ``recovery`` (``amqp.RecoveryPolicy``, on
    by default), ``connection_name``, ``publish_timeout`` (5 s: how long a publish waits for
    the recovering publisher connection; ``None``: without bound), ``confirm_timeout`` (5 s:
    how long a publish waits for its confirm once sent), ``middleware`` (a list of
    :class:`~ojs_anyio.events.Middleware`, around every publish and handler); anything else
    goes to ``amqp.connect``.
    """
    bus = EventBus(url, **options)
    if bus.url == DEVELOPMENT_URL and not url:
        log.warning(
            "events.connect(): no URL and no $OJS_AMQP_URL, so the bus uses the in-process "
            "memory:// broker: events stay in this process and are lost when it exits "
            "(for development and tests only; pass a URL or set OJS_AMQP_URL for RabbitMQ)"
        )
    try:
        async with anyio.create_task_group() as tg:
            try:
                await bus._start(tg)
                yield bus
            finally:
                await bus.aclose()
    except BaseExceptionGroup as eg:
        single = single_error(eg)
        if single is None:
            raise
        raise single from single.__cause__
