"""The AnyIO connection: owns the task group, the current transport, channels by id, recovery.

Reading a publish from ``Channel.publish()`` to the socket: ``_publish.py`` (encode via
``ojs_codec.AMQPConnection.publish``) → ``_transport.py``'s :meth:`Transport.flush`
(drains the codec's outbound buffer to the stream).  Reading a delivery: the transport's
reader feeds bytes to the codec and hands each event to the connection's handler of its type,
which calls the owning channel synchronously; user code never runs in the reader task.

Each successful connect makes a new :class:`~._transport.Transport` (socket, codec,
writer, reader, heartbeat); the connection keeps what outlives it: channels, topology,
events, the blocked state and the recovery loop.
"""

from __future__ import annotations

import logging
import random
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypeVar

import anyio
import anyio.abc
from anyio.streams.tls import TLSStream

from ojs_codec import (
    AMQPConnection,
    AMQPError,
    ChannelClosed,
    ChannelCloseOk,
    ChannelFlow,
    ChannelOpened,
    Confirmed,
    ConnectionBlocked,
    ConnectionClosed,
    ConnectionCloseOk,
    ConnectionOpened,
    ConnectionParameters,
    ConnectionUnblocked,
    ConsumerCancelled,
    Credentials,
    Delivery,
    GetOk,
    MethodReply,
    Returned,
)

from .._schemes import is_plugin_scheme, stream_factory
from . import _metrics
from ._channel import Channel
from ._errors import (
    BlockedTimeoutError,
    ConnectionClosedError,
    ConnectionLostError,
    OperationTimeoutError,
    RecoveryFailedError,
)
from ._events import (
    ConnectionBlockedEvent,
    ConnectionLost,
    ConnectionRecovered,
    ConnectionUnblockedEvent,
    EventHub,
    Reconnecting,
    RecoveryEvent,
)
from ._interfaces import ChannelEndpoint
from ._link import ChannelLink
from ._policy import NO_RECOVERY, RecoveryPolicy
from ._recovery import replay_topology
from ._topology import TopologyRecorder
from ._transport import Transport
from ._url import AMQPURL, parse_url

__all__ = ["Connection", "RecoveryPolicy", "connect"]

log = logging.getLogger("ojs_anyio.amqp")


class Connection:
    """An AMQP connection owned by the ``async with connect(...)`` block that made it."""

    def __init__(
        self,
        url: AMQPURL,
        *,
        heartbeat: int | None = None,
        frame_max: int | None = None,
        channel_max: int | None = None,
        connection_timeout: float | None = None,
        close_timeout: float = 5.0,
        publish_timeout: float | None = None,
        recovery: RecoveryPolicy | None = None,
        client_properties: dict[str, Any] | None = None,
        max_message_size: int = 128 * 1024 * 1024,
        ssl_context: ssl.SSLContext | None = None,
        name: str | None = None,
    ) -> None:
        self.url = url
        if heartbeat is None:
            heartbeat = url.heartbeat if url.heartbeat is not None else 60
        self._heartbeat = heartbeat
        self._frame_max = frame_max if frame_max is not None else (url.frame_max or 131072)
        self._channel_max = channel_max if channel_max is not None else (url.channel_max or 2047)
        self.connection_timeout = (
            connection_timeout if connection_timeout is not None else (url.connection_timeout or 10.0)
        )
        self.close_timeout = close_timeout
        #: Default bound on how long a publish waits for a blocked or disconnected connection.
        self.publish_timeout = publish_timeout
        self.recovery = recovery or NO_RECOVERY
        self._client_properties = dict(client_properties or {})
        if name:
            self._client_properties["connection_name"] = name
        self._max_message_size = max_message_size
        self._ssl_context = ssl_context if ssl_context is not None else url.ssl_context()
        self._rng = random.Random()
        _metrics.register()
        #: The reader's event type -> its handler (the transport calls it for each event).
        self._event_handlers: dict[type[Any], Callable[[Any], None]] = dict(
            (
                _route(Delivery, self._ev_delivery),
                _route(Confirmed, self._ev_confirmed),
                _route(MethodReply, self._ev_reply),
                _route(GetOk, self._ev_reply),
                _route(ChannelOpened, self._ev_reply),
                _route(ChannelClosed, self._ev_channel_closed),
                _route(ChannelCloseOk, self._ev_channel_closed),
                _route(ConsumerCancelled, self._ev_consumer_cancelled),
                _route(Returned, self._ev_returned),
                _route(ChannelFlow, self._ev_channel_flow),
                _route(ConnectionOpened, self._ev_opened),
                _route(ConnectionBlocked, self._ev_blocked),
                _route(ConnectionUnblocked, self._ev_unblocked),
                _route(ConnectionClosed, self._ev_closed),
                _route(ConnectionCloseOk, self._ev_close_ok),
            )
        )
        #: What the channels share with the connection, and the verbs they use it by: the
        #: current transport, the "usable" and "unblocked" events, the event hub, the task
        #: group and the channel registry live there (see _link.py).  Its transport is a
        #: placeholder without a socket until the first connect.
        self._link = ChannelLink(
            self,
            Transport(
                AMQPConnection(self._parameters()),
                None,
                generation=0,
                label=url.redacted(),
                handlers=self._event_handlers,
                on_lost=self._transport_failed,
            ),
        )
        self._opened: ConnectionOpened | None = None
        self._host_index = 0
        #: When the connection last went from up to down (None: not since the supervisor looked).
        self._went_down_at: float | None = None
        # lifecycle
        #: Shields the supervisor (reader, heartbeats, recovery) from the caller's cancellation,
        #: so close handshakes still get their replies; only aclose() cancels it.
        self._service_scope: anyio.CancelScope | None = None
        self._closing = False
        self._closed = False
        self._fatal: BaseException | None = None
        self.blocked_reason: str | None = None
        self.reconnections = 0
        self.topology = TopologyRecorder()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("open" if self._connected.is_set() else "connecting")
        return f"<Connection {self.url.redacted()} {state}>"

    # ------------------------------------------------ state kept in the link

    @property
    def _transport(self) -> Transport:
        """The current connection generation: codec, socket, writer (replaced on reconnect)."""
        return self._link.transport

    @_transport.setter
    def _transport(self, transport: Transport) -> None:
        self._link.use(transport)

    @property
    def _connected(self) -> anyio.Event:
        """Set while the connection is usable (replaced by a fresh event when it goes down)."""
        return self._link.connected

    @_connected.setter
    def _connected(self, event: anyio.Event) -> None:
        self._link.connected = event

    @property
    def _unblocked(self) -> anyio.Event:
        """Set unless the broker blocks publishers (connection.blocked)."""
        return self._link.unblocked

    @_unblocked.setter
    def _unblocked(self, event: anyio.Event) -> None:
        self._link.unblocked = event

    @property
    def _tg(self) -> anyio.abc.TaskGroup | None:
        return self._link.tg

    @_tg.setter
    def _tg(self, tg: anyio.abc.TaskGroup | None) -> None:
        self._link.tg = tg

    @property
    def _events(self) -> EventHub:
        return self._link.events

    @property
    def _by_id(self) -> dict[int, ChannelEndpoint]:
        return self._link.by_id

    @property
    def _channels(self) -> set[ChannelEndpoint]:
        return self._link.channels

    # ------------------------------------------------------------------ public

    @property
    def is_open(self) -> bool:
        return self._link.connected.is_set() and not self._closing  # (not via _connected: hot)

    @property
    def is_blocked(self) -> bool:
        return self.blocked_reason is not None

    @property
    def negotiated(self) -> ConnectionOpened | None:
        """channel_max, frame_max, heartbeat and server properties of the current transport."""
        return self._opened

    @property
    def server_properties(self) -> dict[str, Any]:
        return self._opened.server_properties if self._opened else {}

    def channel(self, *, confirms: bool = True, prefetch: int | None = None) -> Channel:
        """A new channel; use ``async with conn.channel() as ch:``.

        ``confirms`` puts it in publisher-confirm mode (``publish()`` then returns once
        the broker took responsibility for the message).
        """
        return Channel(self._link, confirms=confirms, prefetch=prefetch)

    def add_listener(self, callback: Callable[[RecoveryEvent], None]) -> Callable[[], None]:
        """Call ``callback`` (synchronously, from the reader or supervisor task) on each
        connection event.  Returns a function that removes the listener."""
        return self._events.add_listener(callback)

    def subscribe(self, max_buffer: int = 256) -> AbstractAsyncContextManager[AsyncIterator[RecoveryEvent]]:
        """``async with conn.subscribe() as events: async for ev in events: …``"""
        return self._events.subscribe(max_buffer)

    async def wait_unblocked(self, timeout: float | None = None) -> None:
        """Wait until the broker is not blocking publishers (immediately if it isn't).

        Raises :class:`ConnectionClosedError` if the connection is closed meanwhile."""
        if not self._unblocked.is_set():
            with anyio.move_on_after(timeout) as scope:
                await self._unblocked.wait()
            if scope.cancelled_caught:
                raise BlockedTimeoutError(
                    f"broker kept publishers blocked for over {timeout:.3g}s (reason: {self.blocked_reason})"
                )
        if self._closed:
            raise ConnectionClosedError("connection is closed")

    async def flush(self) -> None:
        """Write every frame queued so far, acks batched for later included, before
        returning (they are in the socket's hands then).  For a settlement that must
        reach the broker before what comes next, such as an ack before running a job that
        may end the process.  Raises :class:`ConnectionLostError` if the socket failed."""
        await self._transport.flushed()

    async def wait_connected(self, timeout: float | None = None) -> None:
        """Wait until the connection is usable (at once, unless it is recovering)."""
        self._raise_if_closed()
        if self._connected.is_set():
            return
        with anyio.move_on_after(timeout) as scope:
            while not self._connected.is_set():
                self._raise_if_closed()
                await self._connected.wait()
        if scope.cancelled_caught:
            raise OperationTimeoutError(f"connection not re-established within {timeout:.3g}s")
        self._raise_if_closed()

    async def aclose(self) -> None:
        """Close channels, exchange Connection.Close/Close-Ok (bounded by ``close_timeout``),
        then close the socket.  Idempotent; safe to call from any task."""
        if self._closed:
            return
        self._closing = True
        with anyio.CancelScope(shield=True):
            try:
                with anyio.move_on_after(self.close_timeout):
                    t = self._transport
                    if self._connected.is_set() and t.stream is not None:
                        for ch in list(self._channels):
                            await ch.aclose()
                        t.proto.close()
                        await t.flush_quietly()
                        # The reader ends on Close-Ok, or as soon as the transport fails.
                        await t.down.wait()
            finally:
                self._closed = True
                # Not connected any more; wake the waiters of the old event so they see _closed.
                connected, self._connected = self._connected, anyio.Event()
                connected.set()
                self._unblocked.set()  # publishers waiting for Connection.Unblocked see the close
                await self._transport.force_close()
                err = ConnectionClosedError("connection closed")
                for ch in list(self._channels):
                    ch.on_connection_gone(err, final=True)
                self._events.close()
                # Stops reader, heartbeats and recovery; the caller's block carries on.
                if self._service_scope is not None:
                    self._service_scope.cancel()

    # --------------------------------------------------------------- internals

    def _parameters(self) -> ConnectionParameters:
        return ConnectionParameters(
            credentials=Credentials(
                username=self.url.username, password=self.url.password, mechanism=self.url.auth_mechanism
            ),
            virtual_host=self.url.virtual_host,
            channel_max=self._channel_max,
            frame_max=self._frame_max,
            heartbeat=self._heartbeat,
            client_properties=self._client_properties,
            max_message_size=self._max_message_size,
        )

    def _raise_if_closed(self) -> None:
        if self._fatal is not None:
            if isinstance(self._fatal, RecoveryFailedError):
                # Every waiter gets its own copy of the one clear error.
                raise RecoveryFailedError(str(self._fatal)) from self._fatal
            raise ConnectionClosedError(f"connection failed: {self._fatal}") from self._fatal
        if self._closed or self._closing:
            raise ConnectionClosedError("connection is closed")

    @asynccontextmanager
    async def _running(self) -> AsyncIterator[Connection]:
        """Connected for the duration of the block, in a task group of its own (see
        :func:`connect`); a failure for good cancels the block and exits with that error."""
        try:
            async with anyio.create_task_group() as tg:
                try:
                    await self._start(tg)
                    yield self
                finally:
                    await self.aclose()
        except BaseExceptionGroup as eg:
            err = _unwrap(eg, self._fatal)
            raise err from err.__cause__  # not the group; keep why (RecoveryFailedError: the last error)
        if self._fatal is not None:
            raise self._fatal

    async def _start(self, tg: anyio.abc.TaskGroup) -> None:
        self._tg = tg
        self._service_scope = anyio.CancelScope(shield=True)
        # Try each host of the URL in turn; an answer that is not a network failure
        # (a refused login, an unknown vhost) is final and raised at once.
        last: ConnectionLostError | None = None
        for _ in range(len(self.url.hosts)):
            host, port = self.url.hosts[self._host_index % len(self.url.hosts)]
            try:
                with anyio.fail_after(self.connection_timeout):
                    await self._open_transport()
                break
            except TimeoutError:
                last = ConnectionLostError(
                    f"connecting to {host}:{port} timed out after {self.connection_timeout}s"
                )
            except ConnectionLostError as exc:
                last = exc
            self._host_index += 1
        else:
            assert last is not None
            raise last
        # Returns once the reader runs, so even an immediate aclose() gets its Close-Ok.
        await tg.start(self._supervise, name="ojs-amqp-supervisor")

    async def _open_transport(self) -> None:
        """Connect the socket and complete the AMQP handshake (caller bounds the time)."""
        host, port = self.url.hosts[self._host_index % len(self.url.hosts)]
        try:
            stream: anyio.abc.ByteStream = await _open_byte_stream(self.url, host, port)
        except OSError as exc:
            raise ConnectionLostError(f"cannot connect to {host}:{port}: {exc}") from exc
        try:
            if self._ssl_context is not None:
                stream = await TLSStream.wrap(
                    stream,
                    hostname=self.url.server_name_indication or host,
                    ssl_context=self._ssl_context,
                    standard_compatible=False,
                )
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await stream.aclose()
            if isinstance(exc, ssl.SSLError | OSError | anyio.BrokenResourceError):
                raise ConnectionLostError(f"TLS handshake with {host}:{port} failed: {exc}") from exc
            raise
        self._transport = Transport(
            AMQPConnection(self._parameters()),
            stream,
            generation=self._transport.generation + 1,
            label=self.url.redacted(),
            handlers=self._event_handlers,
            on_lost=self._transport_failed,
        )
        await self._transport.handshake()

    # The reader's events, one handler per type (the table is made in __init__).

    def _ev_delivery(self, ev: Delivery) -> None:
        try:
            ch = self._link.by_id[ev.channel_id]  # one a message: no call for the lookup
        except KeyError:
            return
        ch.on_delivery(ev)

    def _ev_confirmed(self, ev: Confirmed) -> None:
        ch = self._link.by_id.get(ev.channel_id)
        if ch is not None:
            ch.on_confirmed(ev)

    def _ev_reply(self, ev: MethodReply | GetOk | ChannelOpened) -> None:
        ch = self._link.by_id.get(ev.channel_id)
        if ch is not None:
            ch.on_reply(ev)

    def _ev_channel_closed(self, ev: ChannelClosed | ChannelCloseOk) -> None:
        ch = self._link.by_id.pop(ev.channel_id, None)
        if ch is not None:
            ch.on_closed(ev)

    def _ev_consumer_cancelled(self, ev: ConsumerCancelled) -> None:
        ch = self._link.by_id.get(ev.channel_id)
        if ch is not None:
            ch.on_consumer_cancelled(ev.consumer_tag)

    def _ev_returned(self, ev: Returned) -> None:
        ch = self._link.by_id.get(ev.channel_id)
        if ch is not None:
            ch.on_returned(ev)

    def _ev_channel_flow(self, ev: ChannelFlow) -> None:
        pass  # RabbitMQ never sends Channel.Flow; the codec already answered Flow-Ok

    def _ev_opened(self, ev: ConnectionOpened) -> None:
        self._opened = ev
        self._transport.handshake_done.set()

    def _ev_blocked(self, ev: ConnectionBlocked) -> None:
        self.blocked_reason = ev.reason
        if self._unblocked.is_set():
            self._unblocked = anyio.Event()
        log.warning("broker blocked publishing: %s", self.blocked_reason)
        self._events.emit(ConnectionBlockedEvent(reason=self.blocked_reason or ""))

    def _ev_unblocked(self, ev: ConnectionUnblocked) -> None:
        self.blocked_reason = None
        self._unblocked.set()
        log.info("broker unblocked publishing")
        self._events.emit(ConnectionUnblockedEvent())

    def _ev_closed(self, ev: ConnectionClosed) -> None:
        self._transport.error = ev.error

    def _ev_close_ok(self, ev: ConnectionCloseOk) -> None:
        self._transport.close_ok.set()

    @property
    def _proto(self) -> AMQPConnection:
        """The current transport's codec (for tests and debugging; channels go through
        ``_transport``)."""
        return self._transport.proto

    @property
    def _stream(self) -> anyio.abc.ByteStream | None:
        return self._transport.stream

    async def _run_transport(
        self, restore: bool, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> BaseException:
        """Run reader, heartbeat, flusher and confirm-deadline watcher until the transport dies; return why.

        With ``restore``, topology and channels are re-established first (while the
        reader runs), and the connection counts as connected only once that is done.
        """
        t = self._transport
        async with anyio.create_task_group() as tg:
            tg.start_soon(t.reader, tg.cancel_scope, name="ojs-amqp-reader")
            tg.start_soon(t.heartbeat_loop, name="ojs-amqp-heartbeat")
            tg.start_soon(t.deferred_flusher, name="ojs-amqp-flusher")
            tg.start_soon(self._link.deadlines.run, name="ojs-amqp-confirm-deadlines")
            if restore:
                tg.start_soon(self._restore, name="ojs-amqp-restore")
            else:
                self._connected.set()
            task_status.started()
        return t.error or ConnectionLostError("connection lost")

    async def _supervise(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Own the transport for the connection's lifetime; recover it when allowed.

        Runs in ``_service_scope``: cancelling the ``connect()`` block does not stop the
        reader before aclose() has exchanged Close/Close-Ok; aclose() then cancels it.
        """
        assert self._service_scope is not None
        with self._service_scope:
            await self._supervise_transports(task_status)

    async def _supervise_transports(self, task_status: anyio.abc.TaskStatus[None]) -> None:
        restore = False
        attempt = 0
        down_since = 0.0
        while True:
            err = await self._run_transport(restore, task_status)
            task_status = anyio.TASK_STATUS_IGNORED
            if self._closing or self._closed:
                return
            self._transport_failed(err)  # if the reader or the heartbeat check didn't already
            if self._went_down_at is not None:  # it was up: a new outage starts
                attempt = 0
                down_since, self._went_down_at = self._went_down_at, None
            await self._transport.force_close()
            if not self.recovery.enabled:
                self._fail_everything(err)
                raise err
            attempt = await self._reconnect(err, attempt, down_since)
            restore = True

    async def _reconnect(self, err: BaseException, attempt: int, down_since: float) -> int:
        """Back off and open a new transport; return the attempt count so far."""
        policy = self.recovery
        last = err
        while True:
            attempt += 1
            if policy.max_attempts is not None and attempt > policy.max_attempts:
                self._give_up(
                    RecoveryFailedError(f"gave up reconnecting after {attempt - 1} attempts: {last}"), last
                )
            delay = policy.delay(attempt, self._rng)
            if policy.deadline is not None:
                remaining = policy.deadline - (anyio.current_time() - down_since)
                if remaining <= 0:
                    self._give_up(
                        RecoveryFailedError(f"gave up reconnecting after {policy.deadline}s: {last}"), last
                    )
                delay = min(delay, remaining)
            self._events.emit(Reconnecting(attempt=attempt, delay=delay, error=last))
            await anyio.sleep(delay)
            if len(self.url.hosts) > 1:
                self._host_index += 1
            self.reconnections += 1
            _metrics.instruments.reconnections.add(1)
            try:
                with anyio.fail_after(self.connection_timeout):
                    await self._open_transport()
            except (AMQPError, OSError, TimeoutError) as exc:
                last = exc
                log.warning("reconnect attempt %d to %s failed: %s", attempt, self.url.redacted(), exc)
                continue
            return attempt

    def _give_up(self, exc: RecoveryFailedError, cause: BaseException) -> None:
        exc.__cause__ = cause
        self._fail_everything(exc)
        raise exc

    async def _restore(self) -> None:
        """Re-declare topology, re-open channels and consumers, then mark connected.

        What the broker refuses is confined to its entity, channel or consumer (see
        TopologyRecorder.replay and Lifecycle.recover).  Any other error means this
        transport is unusable: close it, and the supervisor tries again.
        """
        t = self._transport
        try:
            await replay_topology(self._link)
            for ch in list(self._channels):
                await ch.recover()
        except AMQPError as exc:
            log.warning("recovery of %s interrupted: %s", self.url.redacted(), exc)
            if t.error is None:
                t.error = exc
            await t.force_close()  # ends the reader, so _run_transport returns
            return
        self._connected.set()
        log.info("connection to %s recovered", self.url.redacted())
        self._events.emit(ConnectionRecovered(reconnections=self.reconnections))

    def _transport_failed(self, err: BaseException) -> None:
        """The current transport just failed: from this moment publishes and calls wait for
        recovery, pending confirms fail (outcome unknown) and earlier deliveries are stale,
        instead of anyone writing into a dead codec.  Once per transport; not while closing."""
        t = self._transport
        if t.lost or self._closing or self._closed:
            return
        t.lost = True
        if not self.recovery.enabled:
            self._fatal = err  # nothing brings it back: the connection's one error from now on
        was_up = self._connected.is_set()
        if was_up:
            self._connected = anyio.Event()
            self._went_down_at = anyio.current_time()
        self._on_transport_lost(err, emit=was_up)

    def _on_transport_lost(self, err: BaseException, *, emit: bool) -> None:
        if emit:
            log.warning("connection to %s lost: %s", self.url.redacted(), err)
            self._events.emit(ConnectionLost(error=err))
        self._by_id.clear()
        for ch in list(self._channels):
            ch.on_connection_gone(err, final=False)
        if not self._unblocked.is_set():
            self.blocked_reason = None
            self._unblocked.set()

    def _fail_everything(self, err: BaseException) -> None:
        self._fatal = err
        self._closing = True
        for ch in list(self._channels):
            ch.on_connection_gone(err, final=True)
        # Wake the waiters of the old event so they see the failure; not connected any more.
        connected, self._connected = self._connected, anyio.Event()
        connected.set()
        self._events.close()

_Event = TypeVar("_Event")


def _route(
    event_type: type[_Event], handler: Callable[[_Event], None]
) -> tuple[type[Any], Callable[[Any], None]]:
    """One entry of a connection's event table; mypy checks the handler takes that event type."""
    return event_type, handler


async def _open_byte_stream(url: AMQPURL, host: str, port: int) -> anyio.abc.ByteStream:
    """The transport for one host of ``url``: TCP, or the stream of the plug-in that serves
    the URL's scheme (``memory://NAME``: an in-process stream to the memory broker NAME,
    which speaks the same frames; see ojs_anyio._schemes)."""
    if is_plugin_scheme(url.scheme):
        return await stream_factory(url.scheme)(host, port)
    return await anyio.connect_tcp(host, port)


def _unwrap(eg: BaseExceptionGroup[BaseException], preferred: BaseException | None) -> BaseException:
    if preferred is not None:
        return preferred
    leaves: list[BaseException] = []

    def walk(e: BaseException) -> None:
        if isinstance(e, BaseExceptionGroup):
            for sub in e.exceptions:
                walk(sub)
        else:
            leaves.append(e)

    walk(eg)
    cancelled = anyio.get_cancelled_exc_class()
    real = [e for e in leaves if not isinstance(e, cancelled)]
    return (real or leaves)[0]


@asynccontextmanager
async def connect(
    url: str | AMQPURL = "amqp://guest:guest@localhost:5672/",
    **options: Any,
) -> AsyncIterator[Connection]:
    """Open an AMQP connection for the duration of the block.

    ``async with connect("amqp://guest:guest@localhost/") as conn:``

    The connection owns a task group (reader, heartbeats, recovery).  Leaving the block
    closes channels, exchanges Connection.Close/Close-Ok (bounded by ``close_timeout``)
    and closes the socket, even when the block is cancelled.  If the connection fails for
    good (recovery off, or recovery gave up), the block is cancelled and exits with that
    error.  Options: ``heartbeat``, ``frame_max``, ``channel_max``, ``connection_timeout``
    (s), ``close_timeout`` (s), ``publish_timeout`` (s), ``recovery``
    (:class:`RecoveryPolicy`, off by default at this layer), ``client_properties``,
    ``max_message_size``, ``ssl_context``, ``name``.
    """
    parsed = url if isinstance(url, AMQPURL) else parse_url(url)
    async with Connection(parsed, **options)._running() as conn:
        yield conn


