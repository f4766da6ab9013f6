"""A fault-injecting TCP proxy for tests, written on anyio (runs on asyncio and Trio).

``FaultProxy`` listens on ``127.0.0.1`` port 0 and forwards every accepted connection to a
target (by default the RabbitMQ broker on ``127.0.0.1:5672``).  While the ``async with`` block
runs, the test can cut, stall, slow down or refuse connections.  Everything the proxy starts
lives in a task group owned by that block; leaving the block closes every socket.

Each proxied connection has two directions, ``upstream`` (client -> target) and ``downstream``
(target -> client).  A direction is one reader task and one writer task joined by a bounded
memory stream of chunks stamped with their delivery time, so latency delays each chunk without
throttling throughput.  A stalled direction stops reading from its source (the kernel buffers
fill up and TCP flow control pushes back on the sender) and holds back the chunks already read.
When either side of a connection closes, or any error occurs, both sides are closed.
"""

from __future__ import annotations

import math
import socket
import struct
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal, NamedTuple, Self
from urllib.parse import quote, urlencode

import anyio
import anyio.abc
from anyio import (
    BrokenResourceError,
    CancelScope,
    ClosedResourceError,
    EndOfStream,
    aclose_forcefully,
    create_memory_object_stream,
    create_task_group,
)
from anyio.abc import ByteStream, SocketAttribute, SocketStream
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from support.brokers import RABBITMQ_HOST, RABBITMQ_PORT

__all__ = ["Direction", "FaultProxy", "ProxyStatistics", "build_amqp_url", "unwrap_single_exception"]

Direction = Literal["upstream", "downstream"]
StallDirection = Literal["both", "upstream", "downstream"]

#: Errors that mean "this proxied connection is over" (not a bug in the proxy).
_TRANSPORT_ERRORS = (BrokenResourceError, ClosedResourceError, EndOfStream, OSError)


def build_amqp_url(
    scheme: str,
    host: str,
    port: int,
    *,
    user: str,
    password: str,
    vhost: str,
    query: dict[str, object],
) -> str:
    """``scheme://user:password@host:port/vhost?query`` with every part percent-encoded."""
    userinfo = f"{quote(user, safe='')}:{quote(password, safe='')}"
    url = f"{scheme}://{userinfo}@{host}:{port}/{quote(vhost, safe='')}"
    params = {key: _query_value(value) for key, value in query.items() if value is not None}
    if params:
        url += "?" + urlencode(params)
    return url


def _query_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class ProxyStatistics(NamedTuple):
    active_connections: int
    connections_total: int
    connections_cut: int
    connections_refused: int
    connections_failed: int
    bytes_up: int
    bytes_down: int


class _Gate:
    """Open unless closed; ``wait_open()`` blocks while closed.  Sync open/close."""

    __slots__ = ("_closed_event",)

    def __init__(self) -> None:
        self._closed_event: anyio.Event | None = None

    @property
    def is_open(self) -> bool:
        return self._closed_event is None

    def close(self) -> None:
        if self._closed_event is None:
            self._closed_event = anyio.Event()

    def open(self) -> None:
        event, self._closed_event = self._closed_event, None
        if event is not None:
            event.set()

    async def wait_open(self) -> None:
        while (event := self._closed_event) is not None:
            await event.wait()


@dataclass(eq=False, slots=True)
class _Connection:
    """One accepted client connection, from accept to close."""

    client_tcp: SocketStream
    scope: CancelScope = field(default_factory=CancelScope)
    client: ByteStream | None = None
    upstream: SocketStream | None = None
    established: bool = False
    reset: bool = False
    #: One side closed cleanly and everything it sent was delivered (not a cut, not an error).
    graceful: bool = False

    def raw_sockets(self) -> list[socket.socket]:
        streams: list[SocketStream] = [self.client_tcp]
        if self.upstream is not None:
            streams.append(self.upstream)
        sockets: list[socket.socket] = []
        for stream in streams:
            try:
                sockets.append(stream.extra(SocketAttribute.raw_socket))
            except (anyio.TypedAttributeLookupError, OSError):
                pass
        return sockets


class FaultProxy:
    """TCP proxy with fault injection; ``async with FaultProxy(...) as proxy:``.

    :param target_host: where to forward connections
    :param target_port: where to forward connections
    :param connect_timeout: bound on connecting to the target (and on the TLS handshake in
        subclasses); a connection that exceeds it is closed and counted as failed
    :param chunk_size: the most bytes read from a socket at once
    :param max_buffered_chunks: per direction and connection, the most chunks read but not yet
        delivered (only matters with latency); the reader waits when it is reached

    ``graceful_close_timeout`` (attribute, 2 s) bounds the polite close of a TLS client stream
    (close_notify exchange) after the other side closed cleanly.
    """

    scheme = "amqp"

    def __init__(
        self,
        target_host: str = RABBITMQ_HOST,
        target_port: int = RABBITMQ_PORT,
        *,
        connect_timeout: float = 10.0,
        chunk_size: int = 65536,
        max_buffered_chunks: int = 64,
    ) -> None:
        if chunk_size < 1 or max_buffered_chunks < 1:
            raise ValueError("chunk_size and max_buffered_chunks must be positive")
        self.target_host = target_host
        self.target_port = target_port
        self.connect_timeout = connect_timeout
        self.graceful_close_timeout = 2.0
        self._chunk_size = chunk_size
        self._max_buffered_chunks = max_buffered_chunks
        self._port: int | None = None
        self._lifetime: AbstractAsyncContextManager[None] | None = None
        self._task_group: anyio.abc.TaskGroup | None = None
        self._connections: set[_Connection] = set()
        self._gates: dict[Direction, _Gate] = {}
        self._changed: anyio.Event | None = None
        self._latency = 0.0
        self._refusing = False
        self._connections_total = 0
        self._connections_cut = 0
        self._connections_refused = 0
        self._connections_failed = 0
        self._bytes_up = 0
        self._bytes_down = 0

    # ------------------------------------------------------------------ lifetime

    async def __aenter__(self) -> Self:
        if self._lifetime is not None:
            raise RuntimeError("this proxy has already been started")
        lifetime = self._run()
        self._lifetime = lifetime
        await lifetime.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        assert self._lifetime is not None
        return await self._lifetime.__aexit__(exc_type, exc_value, traceback)

    @asynccontextmanager
    async def _run(self) -> AsyncIterator[None]:
        self._gates = {"upstream": _Gate(), "downstream": _Gate()}
        self._changed = anyio.Event()
        multi = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        try:
            self._port = multi.extra(SocketAttribute.local_port)
            with unwrap_single_exception():
                async with create_task_group() as task_group:
                    self._task_group = task_group
                    for listener in multi.listeners:
                        task_group.start_soon(self._accept_loop, listener)
                    try:
                        yield
                    finally:
                        task_group.cancel_scope.cancel()
        finally:
            self._task_group = None
            with CancelScope(shield=True):
                await multi.aclose()
                # Sockets accepted or connected whose handler never got to run its cleanup.
                for conn in list(self._connections):
                    await self._close_connection(conn)
                self._connections.clear()

    @property
    def port(self) -> int:
        """The local port the proxy listens on (``127.0.0.1``)."""
        if self._port is None:
            raise RuntimeError("the proxy is not running")
        return self._port

    @property
    def host(self) -> str:
        return "127.0.0.1"

    def url(
        self,
        user: str = "guest",
        password: str = "guest",
        vhost: str = "/",
        **query: object,
    ) -> str:
        """``amqp://user:password@127.0.0.1:{port}/{vhost}?{query}``; None values are left out."""
        return build_amqp_url(
            self.scheme, self.host, self.port, user=user, password=password, vhost=vhost, query=query
        )

    # ------------------------------------------------------------------ controls

    def cut_all(self, *, reset: bool = False) -> int:
        """Close every proxied connection now, both sides; return how many were cut.

        With ``reset=True`` both sockets get ``SO_LINGER`` 0, so closing them sends a TCP RST
        (peers see ``ECONNRESET``, i.e. ``BrokenResourceError``) instead of a FIN.  Connections
        still connecting are cut too.  The sockets close as soon as the event loop runs the
        connections' cleanup; ``active_connections`` drops at once.
        """
        cut = 0
        for conn in list(self._connections):
            if conn.scope.cancel_called:
                continue
            if reset:
                conn.reset = True
                _set_linger_zero(conn.raw_sockets())
            conn.scope.cancel()
            cut += 1
        self._connections_cut += cut
        if cut:
            self._notify()
        return cut

    def stall(self, direction: StallDirection = "both") -> None:
        """Stop forwarding in ``direction`` (sockets stay open; the proxy stops reading)."""
        for name in _directions(direction):
            self._require_gate(name).close()

    def unstall(self, direction: StallDirection = "both") -> None:
        """Resume forwarding in ``direction``; held-back chunks go first."""
        for name in _directions(direction):
            self._require_gate(name).open()

    def is_stalled(self, direction: Direction) -> bool:
        return not self._require_gate(direction).is_open

    def set_latency(self, seconds: float) -> None:
        """Delay every chunk read from now on by ``seconds`` before forwarding it."""
        if not (seconds >= 0 and math.isfinite(seconds)):
            raise ValueError("latency must be a finite number >= 0")
        self._latency = float(seconds)

    @property
    def latency(self) -> float:
        return self._latency

    def refuse_new(self, refuse: bool = True) -> None:
        """While set, accept new connections and close them at once (no target connection)."""
        self._refusing = refuse

    @property
    def refusing(self) -> bool:
        return self._refusing

    @asynccontextmanager
    async def cutting_every(self, interval: float, *, reset: bool = False) -> AsyncIterator[None]:
        """``cut_all()`` about every ``interval`` seconds until the block exits (soak tests).

        The cutting task belongs to this block's own task group, so it cannot outlive it.
        """
        if not interval > 0:
            raise ValueError("interval must be positive")

        async def cut_periodically() -> None:
            while True:
                await anyio.sleep(interval)
                self.cut_all(reset=reset)

        with unwrap_single_exception():
            async with create_task_group() as task_group:
                task_group.start_soon(cut_periodically)
                try:
                    yield
                finally:
                    task_group.cancel_scope.cancel()

    # ------------------------------------------------------------------ waits and counters

    async def wait_for_connections(self, n: int, timeout: float = 10.0) -> None:
        """Wait until at least ``n`` proxied connections are established at once.

        "Established" means the target connection is up (and, for TLS, the handshake is done).
        Raises ``TimeoutError`` after ``timeout`` seconds.
        """
        with anyio.fail_after(timeout):
            await self._wait_until(lambda: self.active_connections >= n)

    async def wait_for_total_connections(self, n: int, timeout: float = 10.0) -> None:
        """Wait until ``connections_total`` (established since start) reaches ``n``."""
        with anyio.fail_after(timeout):
            await self._wait_until(lambda: self._connections_total >= n)

    @property
    def active_connections(self) -> int:
        """Established connections not yet closed or cut."""
        return sum(1 for conn in self._connections if conn.established and not conn.scope.cancel_called)

    @property
    def connections_total(self) -> int:
        """Connections established (target connected) since the proxy started."""
        return self._connections_total

    @property
    def connections_cut(self) -> int:
        return self._connections_cut

    @property
    def connections_refused(self) -> int:
        """Connections closed at once because ``refuse_new`` was set."""
        return self._connections_refused

    @property
    def connections_failed(self) -> int:
        """Connections closed because the target (or the TLS handshake) failed."""
        return self._connections_failed

    @property
    def bytes_up(self) -> int:
        """Bytes delivered to the target."""
        return self._bytes_up

    @property
    def bytes_down(self) -> int:
        """Bytes delivered to clients."""
        return self._bytes_down

    def statistics(self) -> ProxyStatistics:
        return ProxyStatistics(
            active_connections=self.active_connections,
            connections_total=self._connections_total,
            connections_cut=self._connections_cut,
            connections_refused=self._connections_refused,
            connections_failed=self._connections_failed,
            bytes_up=self._bytes_up,
            bytes_down=self._bytes_down,
        )

    # ------------------------------------------------------------------ subclass hooks

    async def _wrap_client(self, stream: SocketStream, conn: _Connection) -> ByteStream:
        """Turn the accepted TCP stream into the client byte stream (TLS proxies override)."""
        return stream

    def _count_failure(self, stage: Literal["client", "target"]) -> None:
        self._connections_failed += 1

    # ------------------------------------------------------------------ internals

    def _require_gate(self, direction: Direction) -> _Gate:
        try:
            return self._gates[direction]
        except KeyError:
            raise RuntimeError("the proxy is not running") from None

    def _notify(self) -> None:
        event = self._changed
        if event is not None:
            self._changed = anyio.Event()
            event.set()

    async def _wait_until(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            event = self._changed
            if event is None:
                raise RuntimeError("the proxy is not running")
            await event.wait()

    async def _accept_loop(self, listener: anyio.abc.Listener[SocketStream]) -> None:
        assert isinstance(listener, anyio.abc.SocketListener)
        task_group = self._task_group
        assert task_group is not None
        while True:
            stream = await listener.accept()
            if self._refusing:
                self._connections_refused += 1
                await aclose_forcefully(stream)
                continue
            conn = _Connection(client_tcp=stream)
            # Registered before any checkpoint, so shutdown closes it even if its task never runs.
            self._connections.add(conn)
            task_group.start_soon(self._handle, conn)

    async def _handle(self, conn: _Connection) -> None:
        try:
            with conn.scope:
                if not await self._connect(conn):
                    return
                assert conn.client is not None and conn.upstream is not None
                conn.established = True
                self._connections_total += 1
                self._notify()
                async with create_task_group() as task_group:
                    for direction, source, sink in (
                        ("upstream", conn.client, conn.upstream),
                        ("downstream", conn.upstream, conn.client),
                    ):
                        send, receive = create_memory_object_stream[tuple[float, bytes]](
                            self._max_buffered_chunks
                        )
                        task_group.start_soon(self._read_side, conn, direction, source, send)
                        task_group.start_soon(self._write_side, conn, direction, receive, sink)
        finally:
            with CancelScope(shield=True):
                await self._close_connection(conn)

    async def _connect(self, conn: _Connection) -> bool:
        try:
            with anyio.fail_after(self.connect_timeout):
                conn.client = await self._wrap_client(conn.client_tcp, conn)
        except (*_TRANSPORT_ERRORS, TimeoutError):
            self._count_failure("client")
            return False
        try:
            with anyio.fail_after(self.connect_timeout):
                conn.upstream = await anyio.connect_tcp(self.target_host, self.target_port)
        except (OSError, TimeoutError):
            self._count_failure("target")
            return False
        return True

    async def _read_side(
        self,
        conn: _Connection,
        direction: Direction,
        source: ByteStream,
        chunks: MemoryObjectSendStream[tuple[float, bytes]],
    ) -> None:
        gate = self._gates[direction]
        async with chunks:
            try:
                while True:
                    await gate.wait_open()
                    data = await source.receive(self._chunk_size)
                    await chunks.send((anyio.current_time() + self._latency, data))
            except EndOfStream:
                return  # closing `chunks` lets the writer deliver the rest, then end
            except _TRANSPORT_ERRORS:
                conn.scope.cancel()

    async def _write_side(
        self,
        conn: _Connection,
        direction: Direction,
        chunks: MemoryObjectReceiveStream[tuple[float, bytes]],
        sink: ByteStream,
    ) -> None:
        gate = self._gates[direction]
        with chunks:
            try:
                async for deliver_at, data in chunks:
                    await gate.wait_open()
                    delay = deliver_at - anyio.current_time()
                    if delay > 0:
                        await anyio.sleep(delay)
                        await gate.wait_open()  # stalled while this chunk was in flight
                    await sink.send(data)
                    if direction == "upstream":
                        self._bytes_up += len(data)
                    else:
                        self._bytes_down += len(data)
                if not conn.scope.cancel_called:
                    conn.graceful = True
            except _TRANSPORT_ERRORS:
                pass
        # This direction is over (its source closed, or the sink broke): close both sides.
        conn.scope.cancel()

    async def _close_connection(self, conn: _Connection) -> None:
        """Close both sides of ``conn`` (idempotent; call it shielded).

        After a graceful end, a wrapped client stream (TLS) is closed politely first, bounded by
        ``graceful_close_timeout`` (TLS: send close_notify, wait for the peer's); otherwise, and
        then in any case, every socket is closed at once.
        """
        self._connections.discard(conn)
        if conn.reset:
            _set_linger_zero(conn.raw_sockets())
        if conn.upstream is not None:
            await aclose_forcefully(conn.upstream)
        if conn.client is not None and conn.client is not conn.client_tcp:
            if conn.graceful and not conn.reset:
                with anyio.move_on_after(self.graceful_close_timeout):
                    try:
                        await conn.client.aclose()
                    except _TRANSPORT_ERRORS:
                        pass
            await aclose_forcefully(conn.client)
        await aclose_forcefully(conn.client_tcp)
        if conn.established:
            self._notify()


@contextmanager
def unwrap_single_exception() -> Iterator[None]:
    """Re-raise an exception group holding a single exception as that exception.

    So that a failing assertion in the body of ``async with FaultProxy()`` (whose task group
    wraps it) reaches the test as itself, not as an ``ExceptionGroup``.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        if len(leaves) != 1:
            raise
        leaf = leaves[0]
        raise leaf from leaf.__cause__


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    leaves: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            leaves.extend(_leaves(exc))
        else:
            leaves.append(exc)
    return leaves


def _directions(direction: StallDirection) -> tuple[Direction, ...]:
    if direction == "both":
        return ("upstream", "downstream")
    if direction in ("upstream", "downstream"):
        return (direction,)
    raise ValueError(f"direction must be 'both', 'upstream' or 'downstream', not {direction!r}")


_LINGER_ZERO = struct.pack("ii", 1, 0)


def _set_linger_zero(sockets: list[socket.socket]) -> None:
    """Make closing these sockets send RST (discarding unsent data) instead of FIN."""
    for sock in sockets:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ZERO)
        except OSError:
            pass  # already closed
