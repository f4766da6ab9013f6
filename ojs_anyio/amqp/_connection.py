"""The AnyIO connection: one task group, one reader task, one heartbeat task, one writer at a time.

Reading a publish from ``Channel.publish()`` to the socket: ``_channel.py`` (encode via
``ojs_codec.AMQPConnection.publish``) → this file's :meth:`Connection._flush` (drains the
codec's outbound buffer to the stream).  Reading a delivery: :meth:`Connection._reader`
feeds bytes to the codec and hands each event to :meth:`Connection._dispatch`, which
calls the owning channel synchronously; user code never runs in the reader task.

Writes use "group commit": the task that finds the writer idle becomes the writer and
sends everything queued, including bytes other tasks queued while it was sending.  A
message's frames are queued in one synchronous step, so frames of two messages never
interleave.  Sends are shielded from cancellation: a half-written frame would corrupt
the stream for every channel.
"""

from __future__ import annotations

import logging
import random
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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
    ConnectionLevelError,
    ConnectionOpened,
    ConnectionParameters,
    ConnectionState,
    ConnectionUnblocked,
    ConsumerCancelled,
    Credentials,
    Delivery,
    GetOk,
    MethodReply,
    ProtocolError,
    Returned,
)

from . import _metrics
from ._errors import (
    BlockedTimeoutError,
    ConnectionClosedError,
    ConnectionLostError,
    PublishTimeoutError,
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
from ._url import AMQPURL, parse_url

if TYPE_CHECKING:
    from ._channel import Channel
    from ._topology import TopologyRecorder

__all__ = ["Connection", "RecoveryPolicy", "connect"]

log = logging.getLogger("ojs_anyio.amqp")

_READ_SIZE = 256 * 1024
#: Longest a batched ack waits for a write (see IncomingMessage._send_settle).
_DEFERRED_FLUSH_DELAY = 0.002


@dataclass(frozen=True, slots=True, kw_only=True)
class RecoveryPolicy:
    """Automatic reconnection.  Delay before attempt N: ``min(initial * multiplier**(N-1), max)``
    seconds, with ±``jitter`` (a fraction) randomisation.
    """

    enabled: bool = True
    initial_delay: float = 1.0
    multiplier: float = 2.0
    max_delay: float = 60.0
    jitter: float = 0.25
    #: Give up after this many failed attempts in a row (None: never).
    max_attempts: int | None = None
    #: Give up when the connection has been down this many seconds (None: never).
    deadline: float | None = None
    #: Delay before re-registering a consumer the broker cancelled.
    consumer_resubscribe_delay: float = 1.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        base = min(self.initial_delay * self.multiplier ** (attempt - 1), self.max_delay)
        if self.jitter:
            base *= 1 + rng.uniform(-self.jitter, self.jitter)
        return max(0.0, base)


NO_RECOVERY = RecoveryPolicy(enabled=False)


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
        # transport state
        self._proto: AMQPConnection = AMQPConnection(self._parameters())
        self._stream: anyio.abc.ByteStream | None = None
        self._writing = False
        self._deferred_flush = False
        self._flush_soon = anyio.Event()
        self._connected = anyio.Event()
        self._opened: ConnectionOpened | None = None
        self._handshake_done = anyio.Event()
        self._close_ok = anyio.Event()
        self._transport_error: BaseException | None = None
        self._transport_down = anyio.Event()
        self._generation = 0
        self._host_index = 0
        #: This transport counts in ``ojs_amqp_connections_active`` (handshake done, not closed).
        self._counted = False
        #: Generation of the last transport whose failure was handled (_transport_failed).
        self._lost_generation = 0
        #: When the connection last went from up to down (None: not since the supervisor looked).
        self._went_down_at: float | None = None
        # lifecycle
        self._tg: anyio.abc.TaskGroup | None = None
        #: Shields the supervisor (reader, heartbeats, recovery) from the caller's cancellation,
        #: so close handshakes still get their replies; only aclose() cancels it.
        self._service_scope: anyio.CancelScope | None = None
        self._closing = False
        self._closed = False
        self._fatal: BaseException | None = None
        self._unblocked = anyio.Event()
        self._unblocked.set()
        self.blocked_reason: str | None = None
        # channels by current wire id, and every logical channel
        self._by_id: dict[int, Channel] = {}
        self._channels: set[Channel] = set()
        self._events = EventHub()
        self.reconnections = 0
        from ._topology import TopologyRecorder

        self.topology: TopologyRecorder = TopologyRecorder()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("open" if self._connected.is_set() else "connecting")
        return f"<Connection {self.url.redacted()} {state}>"

    # ------------------------------------------------------------------ public

    @property
    def is_open(self) -> bool:
        return self._connected.is_set() and not self._closing

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
        from ._channel import Channel

        return Channel(self, confirms=confirms, prefetch=prefetch)

    def add_listener(self, callback: Callable[[RecoveryEvent], None]) -> Callable[[], None]:
        """Call ``callback`` (synchronously, from the reader or supervisor task) on each
        connection event.  Returns a function that removes the listener."""
        return self._events.add_listener(callback)

    def subscribe(self, max_buffer: int = 256) -> AsyncIterator[RecoveryEvent]:
        """``async with conn.subscribe() as events: async for ev in events: …``"""
        return self._events.subscribe(max_buffer)  # type: ignore[return-value]

    async def wait_unblocked(self, timeout: float | None = None) -> None:
        """Wait until the broker is not blocking publishers (immediately if it isn't).

        Raises :class:`ConnectionClosedError` if the connection is closed meanwhile."""
        if not self._unblocked.is_set():
            with anyio.move_on_after(timeout) as scope:
                await self._unblocked.wait()
            if scope.cancelled_caught:
                raise BlockedTimeoutError(
                    f"broker kept publishers blocked for over {timeout}s (reason: {self.blocked_reason})"
                )
        if self._closed:
            raise ConnectionClosedError("connection is closed")

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
            raise PublishTimeoutError(f"connection not re-established within {timeout}s")
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
                    if self._connected.is_set() and self._stream is not None:
                        for ch in list(self._channels):
                            await ch.aclose()
                        self._proto.close()
                        await self._flush_quietly()
                        # The reader ends on Close-Ok, or as soon as the transport fails.
                        await self._transport_down.wait()
            finally:
                self._closed = True
                # Not connected any more; wake the waiters of the old event so they see _closed.
                connected, self._connected = self._connected, anyio.Event()
                connected.set()
                self._unblocked.set()  # publishers waiting for Connection.Unblocked see the close
                await self._force_close_transport()
                err = ConnectionClosedError("connection closed")
                for ch in list(self._channels):
                    ch._on_connection_gone(err, final=True)
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
        self._stream = stream
        self._proto = AMQPConnection(self._parameters())
        self._handshake_done = anyio.Event()
        self._close_ok = anyio.Event()
        self._transport_down = anyio.Event()
        self._transport_error = None
        self._writing = False
        self._generation += 1
        self._proto.initiate()
        try:
            await self._flush()
            # Read until the handshake completes (the reader task isn't running yet).
            while not self._handshake_done.is_set():
                data = await self._receive()
                self._feed(data)
                await self._flush()
                if self._transport_error is not None:
                    raise self._transport_error
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._force_close_transport()
            raise
        self._counted = True
        _metrics.stats.connections_active += 1

    async def _receive(self) -> bytes:
        stream = self._stream
        if stream is None:  # closed by aclose(), a failed send or the heartbeat check
            raise ConnectionLostError("connection closed")
        try:
            return await stream.receive(_READ_SIZE)
        except anyio.EndOfStream:
            raise ConnectionLostError("broker closed the socket") from None
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError, ssl.SSLError) as exc:
            raise ConnectionLostError(f"socket error: {exc!r}") from exc

    def _feed(self, data: bytes) -> None:
        try:
            events = self._proto.receive_data(data)
        except ProtocolError as exc:
            self._transport_error = exc
            log.error("protocol error from broker: %s", exc)
            return
        dispatch = self._dispatch
        for ev in events:
            dispatch(ev)

    def _dispatch(self, ev: object) -> None:
        # Hottest first; every handler is synchronous.
        tp = type(ev)
        if tp is Delivery:
            ch = self._by_id.get(ev.channel_id)  # type: ignore[attr-defined]
            if ch is not None:
                ch._on_delivery(ev)  # type: ignore[arg-type]
        elif tp is Confirmed:
            ch = self._by_id.get(ev.channel_id)  # type: ignore[attr-defined]
            if ch is not None:
                ch._on_confirmed(ev)  # type: ignore[arg-type]
        elif tp is MethodReply or tp is GetOk or tp is ChannelOpened:
            ch = self._by_id.get(ev.channel_id)  # type: ignore[attr-defined]
            if ch is not None:
                ch._on_reply(ev)
        elif tp is ChannelClosed or tp is ChannelCloseOk:
            ch = self._by_id.pop(ev.channel_id, None)  # type: ignore[attr-defined]
            if ch is not None:
                ch._on_closed(ev)
        elif tp is ConsumerCancelled:
            ch = self._by_id.get(ev.channel_id)  # type: ignore[attr-defined]
            if ch is not None:
                ch._on_consumer_cancelled(ev.consumer_tag)  # type: ignore[attr-defined]
        elif tp is Returned:
            ch = self._by_id.get(ev.channel_id)  # type: ignore[attr-defined]
            if ch is not None:
                ch._on_returned(ev)  # type: ignore[arg-type]
        elif tp is ChannelFlow:
            pass  # RabbitMQ never sends Channel.Flow; the codec already answered Flow-Ok
        elif tp is ConnectionOpened:
            self._opened = ev  # type: ignore[assignment]
            self._handshake_done.set()
        elif tp is ConnectionBlocked:
            self.blocked_reason = ev.reason  # type: ignore[attr-defined]
            if self._unblocked.is_set():
                self._unblocked = anyio.Event()
            log.warning("broker blocked publishing: %s", self.blocked_reason)
            self._events.emit(ConnectionBlockedEvent(reason=self.blocked_reason or ""))
        elif tp is ConnectionUnblocked:
            self.blocked_reason = None
            self._unblocked.set()
            log.info("broker unblocked publishing")
            self._events.emit(ConnectionUnblockedEvent())
        elif tp is ConnectionClosed:
            err: ConnectionLevelError = ev.error  # type: ignore[attr-defined]
            self._transport_error = err
        elif tp is ConnectionCloseOk:
            self._close_ok.set()

    async def _flush(self) -> None:
        """Send everything the codec has queued.  Group commit: if another task is already
        writing, it will send our bytes too, so return at once."""
        if self._writing:
            return
        stream = self._stream
        if stream is None:
            raise ConnectionLostError("not connected")
        proto = self._proto
        self._writing = True
        self._deferred_flush = False
        try:
            while True:
                data = proto.data_to_send()
                if not data:
                    return
                with anyio.CancelScope(shield=True):
                    await stream.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError, ssl.SSLError) as exc:
            err = ConnectionLostError(f"socket error while sending: {exc!r}")
            if self._transport_error is None:
                self._transport_error = err
            if self._stream is stream:
                # Wake the reader too: the transport is unusable in both directions.
                await self._force_close_transport()
            raise err from exc
        finally:
            self._writing = False

    async def _flush_quietly(self) -> None:
        try:
            await self._flush()
        except AMQPError:
            pass  # the transport's failure is recorded in _transport_error and reported there

    async def _force_close_transport(self) -> None:
        if self._counted:
            self._counted = False
            _metrics.stats.connections_active -= 1
        stream, self._stream = self._stream, None
        if stream is not None:
            with anyio.CancelScope(shield=True):
                try:
                    await anyio.aclose_forcefully(stream)
                except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                    pass  # already broken; nothing else to release

    async def _run_transport(
        self, restore: bool, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> BaseException:
        """Run reader and heartbeat until the transport dies; return why.

        With ``restore``, topology and channels are re-established first (while the
        reader runs), and the connection counts as connected only once that is done.
        """
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._reader, tg.cancel_scope, name="ojs-amqp-reader")
            tg.start_soon(self._heartbeat_loop, name="ojs-amqp-heartbeat")
            tg.start_soon(self._deferred_flusher, name="ojs-amqp-flusher")
            if restore:
                tg.start_soon(self._restore, name="ojs-amqp-restore")
            else:
                self._connected.set()
            task_status.started()
        return self._transport_error or ConnectionLostError("connection lost")

    def _defer_flush(self) -> None:
        """Bytes were queued without writing them (batched acks): the flusher task sends
        them within ``_DEFERRED_FLUSH_DELAY`` unless someone writes first."""
        if not self._deferred_flush:
            self._deferred_flush = True
            self._flush_soon.set()

    async def _deferred_flusher(self) -> None:
        while True:
            await self._flush_soon.wait()
            self._flush_soon = anyio.Event()
            await anyio.sleep(_DEFERRED_FLUSH_DELAY)
            if self._deferred_flush:
                await self._flush_quietly()

    async def _reader(self, scope: anyio.CancelScope) -> None:
        proto = self._proto
        try:
            while True:
                data = await self._receive()
                queued = len(proto._out)
                self._feed(data)
                # Send what the frames themselves made us queue (Close-Ok, rejects of late
                # deliveries…).  Acks queued by consumers are theirs to send, batched.
                if len(proto._out) > queued:
                    await self._flush()
                if self._transport_error is not None or self._proto.state in (
                    ConnectionState.CLOSED,
                    ConnectionState.ERROR,
                ):
                    self._transport_failed(
                        self._transport_error or ConnectionClosedError("connection closed")
                    )
                    if self._proto.has_data_to_send:
                        await self._flush_quietly()  # Close-Ok, or our Close after a protocol error
                    if self._transport_error is None:
                        self._transport_error = ConnectionClosedError("connection closed")
                    return
        except ConnectionLostError as exc:
            if self._transport_error is None:
                self._transport_error = exc
            self._transport_failed(self._transport_error)
        finally:
            self._transport_down.set()
            scope.cancel()

    async def _heartbeat_loop(self) -> None:
        proto = self._proto
        while True:
            try:
                deadline = proto.heartbeat_tick(anyio.current_time())
            except ConnectionLevelError as exc:
                log.error("connection to %s is dead: %s", self.url.redacted(), exc)
                self._transport_error = ConnectionLostError(f"broker unresponsive: {exc.reply_text}")
                self._transport_failed(self._transport_error)
                # Closing the socket ends the reader and wakes a writer stuck on a stalled peer.
                await self._force_close_transport()
                return
            if deadline is None:
                await anyio.sleep_forever()
                return
            if proto.has_data_to_send:
                await self._flush_quietly()
            await anyio.sleep(max(0.0, deadline - anyio.current_time()))

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
            await self._force_close_transport()
            self._writing = False  # a writer stuck on the old socket has been woken by now
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
            _metrics.reconnections.add(1)
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
        TopologyRecorder.replay and Channel._recover).  Any other error means this
        transport is unusable: close it, and the supervisor tries again.
        """
        try:
            await self.topology.replay(self)
            for ch in list(self._channels):
                await ch._recover()
        except AMQPError as exc:
            log.warning("recovery of %s interrupted: %s", self.url.redacted(), exc)
            if self._transport_error is None:
                self._transport_error = exc
            await self._force_close_transport()  # ends the reader, so _run_transport returns
            return
        self._connected.set()
        log.info("connection to %s recovered", self.url.redacted())
        self._events.emit(ConnectionRecovered(reconnections=self.reconnections))

    def _transport_failed(self, err: BaseException) -> None:
        """The current transport just failed: from this moment publishes and calls wait for
        recovery, pending confirms fail (outcome unknown) and earlier deliveries are stale,
        instead of anyone writing into a dead codec.  Once per transport; not while closing."""
        if self._lost_generation == self._generation or self._closing or self._closed:
            return
        self._lost_generation = self._generation
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
            ch._on_connection_gone(err, final=False)
        if not self._unblocked.is_set():
            self.blocked_reason = None
            self._unblocked.set()

    def _fail_everything(self, err: BaseException) -> None:
        self._fatal = err
        self._closing = True
        for ch in list(self._channels):
            ch._on_connection_gone(err, final=True)
        # Wake the waiters of the old event so they see the failure; not connected any more.
        connected, self._connected = self._connected, anyio.Event()
        connected.set()
        self._events.close()

    def _register(self, channel: Channel) -> None:
        self._channels.add(channel)

    def _unregister(self, channel: Channel) -> None:
        self._channels.discard(channel)


async def _open_byte_stream(url: AMQPURL, host: str, port: int) -> anyio.abc.ByteStream:
    """The transport for one host of ``url``: TCP, or for ``memory://NAME`` an in-process
    stream to the memory broker NAME (ojs_anyio.memory), which speaks the same frames."""
    if url.memory:
        from ojs_anyio.memory import open_stream

        return await open_stream(host)
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
    conn = Connection(parsed, **options)
    try:
        async with anyio.create_task_group() as tg:
            try:
                await conn._start(tg)
                yield conn
            finally:
                await conn.aclose()
    except BaseExceptionGroup as eg:
        err = _unwrap(eg, conn._fatal)
        raise err from err.__cause__  # not the group; keep why (RecoveryFailedError: the last error)
    if conn._fatal is not None:
        raise conn._fatal


