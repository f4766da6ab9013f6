"""The publish/ack hot path, side by side, in one process against one broker.

Workloads (N messages of 256 bytes, no properties, default exchange, a fresh
exclusive server-named queue per scenario, deleted afterwards):

* **publish+confirm**: publish N with publisher confirms on, until all N are confirmed;
* **consume+ack**: consume the N just published at prefetch 512, each client acking every
  delivery its own way (ours folds the acks queued together into ``multiple=True``
  frames), until N are acked.

Clients:

* ``raw-socket``: the ceiling.  A blocking stdlib socket; the handshake is done with
  ``ojs_codec.AMQPConnection``, then N pre-encoded publishes go out in 64 KiB writes (no
  in-flight limit) and confirms are parsed in bulk between writes; deliveries are
  parsed in bulk and, after each read, one Basic.Ack of the last delivery with
  ``multiple=True`` is written (every delivery is acked in order, so that frame settles
  them all: the broker reads one ack frame per read, the least it can be sent).
* ``ojs-anyio/asyncio`` and ``ojs-anyio/trio``: ``ch.publish_window()`` and
  ``ch.consume()`` + ``await m.ack()``.
* peers, each with its fastest documented way to keep publishes in flight:
  ``aio-pika`` (``asyncio.gather`` over batches of ``exchange.publish``), ``aiormq``
  (``asyncio.gather`` over batches of ``channel.basic_publish``), ``pika`` (blocking,
  ``confirm_delivery()``, synchronous publish) and ``pika-select`` (SelectConnection,
  a sliding window of unconfirmed publishes).  A peer that isn't installed is skipped.
* ``amqplib``: the physical anchor outside Python, Node's most used AMQP client, in its
  own ``node`` process (``benchmarks/amqplib/bench.js``; ``npm ci`` from its lockfile on
  first use, skipped without Node): a confirm channel with at most ``--window``
  unconfirmed publishes (each confirm callback frees a slot), then a consumer at the same
  prefetch acking each delivery.  Timed inside Node, start-up excluded.  Targets: ours
  at least as fast on both paths.

Each round runs every scenario once (rounds interleave scenarios, so drift hits all
alike); the best of ``--repeat`` rounds is reported, every sample is printed.  A
scenario that fails (say, another process restarted the broker) is re-run, at most
twice, and the output says so.

``--memory`` (part of the default run unless ``--no-memory``; skipped with ``--smoke``):
peak RSS (``ru_maxrss``) of a child process of this script consuming 200,000 vs 20,000
messages with ojs-anyio at prefetch 512 (queue pre-filled by the parent with the raw
publisher; the child is forked from a small trampoline process because Linux carries
``ru_maxrss`` across ``execve``).

Usage::

    python3 benchmarks/hotpath.py [--n 20000] [--repeat 5] [--smoke] [--json]
                                  [--memory | --no-memory] [--backend asyncio|trio]
                                  [--url amqp://...] [--window 1024] [--only NAME]
    python3 benchmarks/hotpath.py --profile asyncio|trio   # cProfile of our hot paths

Targets are printed as PASS/MISS, never asserted.  Exit status is 1 only when the
ceiling, one of our scenarios or the memory run failed to run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import importlib.util
import json
import os
import platform
import pstats
import resource
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import anyio
from pamqp import commands

import ojs_codec
from ojs_anyio import amqp

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"
BODY = bytes(range(256))
PREFETCH = 512
DEFAULT_WINDOW = 1024
PEER_BATCH = 1024
PIKA_SELECT_WINDOW = 4096
RAW_WRITE_BYTES = 64 * 1024
#: What one read asks of the socket: ours (ojs_anyio.amqp._socket_io.READ_SIZE), so the
#: ceiling pays no more per read than we do (a recv of 256 KiB maps fresh memory each time).
READ_SIZE = 64 * 1024
SCENARIO_TIMEOUT = 120.0
BROKER_WAIT = 90.0
ATTEMPTS = 3
MEMORY_COUNTS = (20_000, 200_000)
MEMORY_TARGET_MB = 20.0

TARGETS = (
    # (scenario, workload, minimum fraction of the ceiling)
    ("ojs-anyio/asyncio", "publish", 0.60),
    ("ojs-anyio/asyncio", "consume", 0.60),
    ("ojs-anyio/trio", "publish", 0.45),
    ("ojs-anyio/trio", "consume", 0.45),
)
OURS = ("ojs-anyio/asyncio", "ojs-anyio/trio")
CEILING = "raw-socket"
PEERS = ("aio-pika", "aiormq", "pika", "pika-select", "amqplib")
#: The physical anchor beside the Python peers: Node's amqplib (the most used event-loop AMQP
#: client outside Python), run from ``benchmarks/amqplib`` (package-lock.json pins it).
AMQPLIB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "amqplib")
#: Ours against amqplib, per workload: ours must be at least this fast (PASS/MISS lines).
AMQPLIB_TARGET = 1.0
WORKLOADS = (("publish", "publish+confirm"), ("consume", "consume+ack"))


class Skipped(Exception):
    """A scenario that cannot run here (a peer that isn't installed)."""


def _have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


# =====================================================================================
# Raw-socket ceiling
# =====================================================================================

_FRAME_HDR = struct.Struct(">BHI")
_U32 = struct.Struct(">I")
_TAG_BITS = struct.Struct(">QB")
_Q = struct.Struct(">Q")
_BASIC_ACK = ojs_codec.BASIC_ACK
_BASIC_NACK = ojs_codec.BASIC_NACK
_BASIC_DELIVER = ojs_codec.BASIC_DELIVER
_CHANNEL_CLOSE = ojs_codec.CHANNEL_CLOSE
_CONNECTION_CLOSE = ojs_codec.CONNECTION_CLOSE


def _closed_error(payload: bytes) -> ConnectionError:
    m = ojs_codec.decode_method(bytes(payload))
    return ConnectionError(f"broker sent {m.name}: {m.reply_code} {m.reply_text}")


def _url_parts(url: str) -> tuple[str, int, str, str, str]:
    parts = urlsplit(url)
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    return (
        parts.hostname or "127.0.0.1",
        parts.port or 5672,
        unquote(parts.username or "guest"),
        unquote(parts.password or "guest"),
        vhost,
    )


def _large_writes(one: bytes, n: int) -> list[bytes]:
    """``n`` copies of an encoded message, grouped into writes of about RAW_WRITE_BYTES."""
    per_write = max(1, RAW_WRITE_BYTES // len(one))
    chunks = [one * per_write] * (n // per_write)
    if n % per_write:
        chunks.append(one * (n % per_write))
    return chunks


def _busy(seconds: float) -> None:
    """Spin the CPU for ``seconds`` (a stand-in for work, not a sleep)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class DeliveryScanner:
    """The consume side of the raw client: counts the deliveries whose body is complete in
    each chunk read, and gives the ack bytes to write for them (hand-rolled framing: no
    events, no objects per frame).  ``fold``: one ``multiple=True`` ack of the chunk's last
    delivery, the least any client can send; else one ack frame per delivery."""

    def __init__(self, cid: int, fold: bool, rest: bytes = b"") -> None:
        self.cid, self.fold, self.rest = cid, fold, rest
        self._pending_tag = 0
        self._body_left = -1

    def start(self, queue: str, prefetch: int) -> bytes:
        """Basic.Qos and Basic.Consume."""
        return ojs_codec.encode_method_frame(
            self.cid, commands.Basic.Qos(prefetch_count=prefetch)
        ) + ojs_codec.encode_method_frame(self.cid, commands.Basic.Consume(queue=queue, consumer_tag="raw"))

    def feed(self, data: bytes) -> tuple[int, bytes]:
        """(deliveries completed by ``data``, the acks to write for them)."""
        cid, fold = self.cid, self.fold
        encode_ack = ojs_codec.encode_ack
        unpack_hdr, unpack_u32, unpack_q = _FRAME_HDR.unpack_from, _U32.unpack_from, _Q.unpack_from
        pending_tag, body_left = self._pending_tag, self._body_left
        buf = self.rest + data if self.rest else data
        acks: list[bytes] = []
        done = 0
        done_tag = 0
        pos = 0
        end = len(buf)
        while end - pos >= 8:
            ftype, _ch, size = unpack_hdr(buf, pos)
            fend = pos + 7 + size
            if fend >= end:
                break
            if ftype == 3:
                body_left -= size
                if body_left == 0:
                    done += 1
                    done_tag = pending_tag
                    if not fold:
                        acks.append(encode_ack(cid, pending_tag))
            elif ftype == 1:
                key = unpack_u32(buf, pos + 7)[0]
                if key == _BASIC_DELIVER:
                    pending_tag = unpack_q(buf, pos + 12 + buf[pos + 11])[0]
                elif key in (_CHANNEL_CLOSE, _CONNECTION_CLOSE):
                    raise _closed_error(buf[pos + 7 : fend])
            elif ftype == 2:
                body_left = unpack_q(buf, pos + 11)[0]
                if body_left == 0:
                    done += 1
                    done_tag = pending_tag
                    if not fold:
                        acks.append(encode_ack(cid, pending_tag))
            pos = fend + 1
        self.rest = buf[pos:]
        self._pending_tag, self._body_left = pending_tag, body_left
        if not done:
            return 0, b""
        return done, encode_ack(cid, done_tag, True) if fold else b"".join(acks)


class RawConnection:
    """A blocking-socket AMQP connection: the handshake through ``ojs_codec.AMQPConnection``,
    then hand-rolled frame parsing for the hot paths (no events, no objects per frame)."""

    def __init__(self, url: str, *, confirms: bool = True) -> None:
        host, port, user, password, vhost = _url_parts(url)
        sock = socket.create_connection((host, port), timeout=SCENARIO_TIMEOUT)
        # Blocking mode (a Python-level timeout would poll before every call and turn
        # MSG_DONTWAIT reads into waits); the kernel bounds each call instead.
        sock.settimeout(None)
        timeval = struct.pack("ll", int(SCENARIO_TIMEOUT), 0)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.proto = ojs_codec.AMQPConnection(
            ojs_codec.ConnectionParameters(
                credentials=ojs_codec.Credentials(username=user, password=password),
                virtual_host=vhost,
                heartbeat=0,
            )
        )
        self._rest = b""
        #: Publishes confirmed so far on this channel (delivery tags continue across calls).
        self._confirmed = 0
        self.proto.initiate()
        self._flush_proto()
        opened = self._until(ojs_codec.ConnectionOpened)
        self.frame_max: int = opened.frame_max
        self.cid = self.proto.open_channel()
        self._flush_proto()
        self._until(ojs_codec.ChannelOpened)
        if confirms:
            self.proto.send_method(self.cid, commands.Confirm.Select())
            self._flush_proto()
            self._until(ojs_codec.MethodReply)

    # --- the handshake, through the sans-IO protocol

    def _flush_proto(self) -> None:
        data = self.proto.data_to_send()
        if data:
            self.sock.sendall(data)

    def _until(self, kind: type) -> Any:
        while True:
            data = self.sock.recv(READ_SIZE)
            if not data:
                raise ConnectionError("broker closed the socket during the handshake")
            events = self.proto.receive_data(data)
            self._flush_proto()
            for ev in events:
                if type(ev) is kind:
                    return ev
                if isinstance(ev, ojs_codec.ChannelClosed | ojs_codec.ConnectionClosed):
                    raise ev.error

    def declare(
        self, queue: str = "", *, exclusive: bool = True, arguments: dict[str, Any] | None = None
    ) -> str:
        """Queue.Declare through the sans-IO protocol (call before any raw operation)."""
        method = commands.Queue.Declare(queue=queue, exclusive=exclusive, arguments=arguments)
        self.proto.send_method(self.cid, method)
        self._flush_proto()
        reply = self._until(ojs_codec.MethodReply)
        return str(reply.method.queue)

    # --- raw mode: our own frame loop from here on

    def _rpc(self, method: Any, reply: type) -> Any:
        """Send a method raw and read frames until its reply (skipping anything else)."""
        self.sock.sendall(ojs_codec.encode_method_frame(self.cid if method.index >> 16 != 10 else 0, method))
        buf = self._rest
        while True:
            pos = 0
            end = len(buf)
            while end - pos >= 8:
                ftype, _ch, size = _FRAME_HDR.unpack_from(buf, pos)
                fend = pos + 7 + size
                if fend >= end:
                    break
                if ftype == 1:
                    m = ojs_codec.decode_method(bytes(buf[pos + 7 : fend]))
                    if type(m) is reply:
                        self._rest = buf[fend + 1 :]
                        return m
                    if m.index in (_CHANNEL_CLOSE, _CONNECTION_CLOSE):
                        raise _closed_error(buf[pos + 7 : fend])
                pos = fend + 1
            data = self.sock.recv(READ_SIZE)
            if not data:
                raise ConnectionError("broker closed the socket")
            buf = buf[pos:] + data

    def publish(
        self,
        queue: str,
        n: int,
        *,
        exchange: str = "",
        properties: ojs_codec.BasicProperties | None = None,
        body: bytes = BODY,
        mandatory: bool = False,
        window: int | None = None,
    ) -> float:
        """Publish N pre-encoded messages in large writes; return seconds until all acked.

        ``queue`` is the routing key (the queue itself through the default exchange).  With
        ``window``, at most that many publishes are unconfirmed at any time (what ``window``
        callers each awaiting their own confirm can reach at best)."""
        one = ojs_codec.encode_publish(self.cid, exchange, queue, properties, body, self.frame_max, mandatory)
        chunks = [] if window else _large_writes(one, n)
        sock = self.sock
        recv = sock.recv
        dontwait = socket.MSG_DONTWAIT
        base = self._confirmed
        state = [base, 0, self._rest]  # confirmed up to (contiguous), nacks, leftover bytes
        early: set[int] = set()

        def parse(data: bytes) -> None:
            buf = state[2] + data if state[2] else data
            upto = state[0]
            pos = 0
            end = len(buf)
            unpack_hdr = _FRAME_HDR.unpack_from
            unpack_u32 = _U32.unpack_from
            unpack_tag = _TAG_BITS.unpack_from
            while end - pos >= 8:
                ftype, _ch, size = unpack_hdr(buf, pos)
                fend = pos + 7 + size
                if fend >= end:
                    break
                if ftype == 1:
                    key = unpack_u32(buf, pos + 7)[0]
                    if key in (_BASIC_ACK, _BASIC_NACK):
                        tag, bits = unpack_tag(buf, pos + 11)
                        if key == _BASIC_NACK:
                            state[1] += 1
                        if bits & 1:
                            if tag > upto:
                                upto = tag
                        elif tag == upto + 1:
                            upto = tag
                        else:
                            early.add(tag)
                        while early and upto + 1 in early:
                            upto += 1
                            early.discard(upto)
                    elif key in (_CHANNEL_CLOSE, _CONNECTION_CLOSE):
                        raise _closed_error(buf[pos + 7 : fend])
                pos = fend + 1
            state[0] = upto
            state[2] = buf[pos:]

        t0 = time.perf_counter()
        for chunk in chunks:
            sock.sendall(chunk)
            while True:
                try:
                    data = recv(READ_SIZE, dontwait)
                except BlockingIOError:
                    break
                if not data:
                    raise ConnectionError("broker closed the socket")
                parse(data)
        if window:
            sent = 0
            while sent < n:
                room = min(window - (sent - (state[0] - base)), n - sent)
                if room > 0:
                    sock.sendall(one * room)
                    sent += room
                data = recv(READ_SIZE)
                if not data:
                    raise ConnectionError("broker closed the socket")
                parse(data)
        while state[0] < base + n:
            data = recv(READ_SIZE)
            if not data:
                raise ConnectionError("broker closed the socket")
            parse(data)
        elapsed = time.perf_counter() - t0
        self._rest = state[2]
        self._confirmed = base + n
        if state[1]:
            raise RuntimeError(f"{state[1]} publishes were nacked")
        return elapsed

    def purge(self, queue: str) -> int:
        """Queue.Purge; the number of messages it removed."""
        return int(self._rpc(commands.Queue.Purge(queue=queue), commands.Queue.PurgeOk).message_count)

    def publish_unconfirmed(
        self,
        exchange: str,
        routing_key: str,
        queue: str,
        n: int,
        *,
        properties: ojs_codec.BasicProperties | None = None,
        body: bytes = BODY,
    ) -> float:
        """On a channel without confirms: write N pre-encoded messages in large batches,
        then ask for ``queue``'s message count until it holds them; seconds until then
        (the broker's own ingest rate, with nothing waited for per message)."""
        one = ojs_codec.encode_publish(self.cid, exchange, routing_key, properties, body, self.frame_max)
        chunks = _large_writes(one, n)
        t0 = time.perf_counter()
        for chunk in chunks:
            self.sock.sendall(chunk)
        while True:
            reply = self._rpc(commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk)
            if reply.message_count >= n:
                return time.perf_counter() - t0

    def consume(self, queue: str, n: int, prefetch: int = PREFETCH, *, fold: bool = True) -> float:
        """Basic.Qos + Basic.Consume, then the acks of each read's deliveries in one write;
        seconds until N acked.  With ``fold`` (the ceiling), that write is one Basic.Ack of
        the read's last delivery with ``multiple=True``; without, one Basic.Ack per delivery."""
        sock = self.sock
        recv = sock.recv
        scan = DeliveryScanner(self.cid, fold, self._rest)
        acked = 0
        t0 = time.perf_counter()
        sock.sendall(scan.start(queue, prefetch))
        while acked < n:
            data = recv(READ_SIZE)
            if not data:
                raise ConnectionError("broker closed the socket")
            done, acks = scan.feed(data)
            if done:
                acked += done
                sock.sendall(acks)
        elapsed = time.perf_counter() - t0
        self._rest = scan.rest
        self._rpc(commands.Basic.Cancel(consumer_tag="raw"), commands.Basic.CancelOk)
        return elapsed

    def consume_on_asyncio(
        self, queue: str, n: int, prefetch: int = PREFETCH, *, busy_us: tuple[float, float] = (0.0, 0.0)
    ) -> float:
        """:meth:`consume` (acks folded) on an asyncio event loop: a bare ``asyncio.BufferedProtocol``
        that scans each chunk as it is read and writes its ack there, with nothing
        else on the loop.  The least any asyncio client can spend per read: what the event
        loop itself (a wake-up, a read, a write) costs beside the blocking socket.  Seconds
        until N acked; the connection is closed after (its socket belongs to the loop).

        ``busy_us``: µs of busy-waiting (before, after) each ack's write, a stand-in for a
        client's own work per read (``_cpu_cost_probe.py``); none for the ceiling."""
        return asyncio.run(self._consume_on_asyncio(queue, n, prefetch, busy_us))

    async def _consume_on_asyncio(
        self, queue: str, n: int, prefetch: int, busy_us: tuple[float, float]
    ) -> float:
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[None] = loop.create_future()
        scan = DeliveryScanner(self.cid, True, self._rest)
        before, after = busy_us[0] / 1e6, busy_us[1] / 1e6
        close = ojs_codec.encode_method_frame(
            0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
        )

        class Drain(asyncio.BufferedProtocol):
            # Read into one buffer, as ours does (asyncio's own reads allocate 256 KiB each).
            transport: asyncio.Transport
            acked = 0
            buffer = memoryview(bytearray(READ_SIZE))

            def get_buffer(self, sizehint: int) -> memoryview:
                return self.buffer

            def buffer_updated(self, nbytes: int) -> None:
                self.data_received(self.buffer[:nbytes].tobytes())

            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                assert isinstance(transport, asyncio.Transport)
                self.transport = transport

            def data_received(self, data: bytes) -> None:
                try:
                    done, acks = scan.feed(data)
                except ConnectionError as exc:
                    if not finished.done():
                        finished.set_exception(exc)
                    return
                if done:
                    if before:
                        _busy(before)
                    self.transport.write(acks)
                    if after:
                        _busy(after)
                    self.acked += done
                    if self.acked >= n and not finished.done():
                        finished.set_result(None)

            def connection_lost(self, exc: Exception | None) -> None:
                if not finished.done():
                    finished.set_exception(exc or ConnectionError("broker closed the socket"))

        self.sock.setblocking(False)
        transport, _ = await loop.create_connection(Drain, sock=self.sock)
        try:
            t0 = time.perf_counter()
            transport.write(scan.start(queue, prefetch))
            await asyncio.wait_for(finished, SCENARIO_TIMEOUT)
            elapsed = time.perf_counter() - t0
            transport.write(close)  # a clean end for the broker; its Close-Ok is not awaited
        finally:
            transport.close()
        return elapsed

    def delete(self, queue: str) -> None:
        self._rpc(commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk)

    def close(self) -> None:
        """Connection.Close/Close-Ok, best effort (the socket may already be broken)."""
        try:
            self._rpc(
                commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0),
                commands.Connection.CloseOk,
            )
        except (OSError, ConnectionError):
            pass
        finally:
            self.sock.close()


def run_raw(url: str, n: int, window: int) -> tuple[float, float]:
    conn = RawConnection(url)
    try:
        queue = conn.declare()
        pub = conn.publish(queue, n)
        cons = conn.consume(queue, n)
        conn.delete(queue)
    finally:
        conn.close()
    return pub, cons


# =====================================================================================
# ojs-anyio
# =====================================================================================


async def _ours(url: str, n: int, window: int) -> tuple[float, float]:
    async with amqp.connect(url) as conn, conn.channel(confirms=True) as ch:
        info = await ch.queue_declare("", exclusive=True)
        w = ch.publish_window(max_in_flight=window)
        t0 = time.perf_counter()
        for _ in range(n):
            await w.publish(BODY, routing_key=info.name)
        failed = await w.wait_all()
        pub = time.perf_counter() - t0
        if failed:
            raise RuntimeError(f"{len(failed)} publishes failed: {failed[0].error!r}")
        count = 0
        t0 = time.perf_counter()
        async with ch.consume(info.name, prefetch=PREFETCH) as messages:
            async for m in messages:
                await m.ack()
                count += 1
                if count >= n:
                    break
            cons = time.perf_counter() - t0
        await ch.queue_delete(info.name)
    return pub, cons


def _ours_on(backend: str) -> Callable[[str, int, int], tuple[float, float]]:
    def run(url: str, n: int, window: int) -> tuple[float, float]:
        async def main() -> tuple[float, float]:
            with anyio.fail_after(SCENARIO_TIMEOUT):
                return await _ours(url, n, window)

        return anyio.run(main, backend=backend)

    return run


# =====================================================================================
# Peers
# =====================================================================================


def run_aio_pika(url: str, n: int, window: int) -> tuple[float, float]:
    if not _have("aio_pika"):
        raise Skipped("aio-pika is not installed")
    import aio_pika

    async def main() -> tuple[float, float]:
        conn = await aio_pika.connect(url)
        async with conn:
            ch = await conn.channel(publisher_confirms=True)
            q = await ch.declare_queue(exclusive=True)
            ex = ch.default_exchange
            name = q.name
            message = aio_pika.Message
            t0 = time.perf_counter()
            for first in range(0, n, PEER_BATCH):
                await asyncio.gather(
                    *(
                        ex.publish(message(BODY), routing_key=name, mandatory=False)
                        for _ in range(min(PEER_BATCH, n - first))
                    )
                )
            pub = time.perf_counter() - t0
            await ch.set_qos(prefetch_count=PREFETCH)
            count = 0
            t0 = time.perf_counter()
            async with q.iterator() as it:
                async for m in it:
                    await m.ack()
                    count += 1
                    if count >= n:
                        break
                cons = time.perf_counter() - t0
            await q.delete(if_unused=False, if_empty=False)
        return pub, cons

    return asyncio.run(asyncio.wait_for(main(), SCENARIO_TIMEOUT))


def run_aiormq(url: str, n: int, window: int) -> tuple[float, float]:
    if not _have("aiormq"):
        raise Skipped("aiormq is not installed")
    import aiormq

    async def main() -> tuple[float, float]:
        conn = await aiormq.connect(url)
        try:
            ch = await conn.channel(publisher_confirms=True)
            declared = await ch.queue_declare(exclusive=True)
            name = declared.queue
            publish = ch.basic_publish
            t0 = time.perf_counter()
            for first in range(0, n, PEER_BATCH):
                confirms = await asyncio.gather(
                    *(publish(BODY, routing_key=name) for _ in range(min(PEER_BATCH, n - first)))
                )
                if not all(isinstance(c, commands.Basic.Ack) for c in confirms):
                    raise RuntimeError("aiormq: a publish was not acked")
            pub = time.perf_counter() - t0
            await ch.basic_qos(prefetch_count=PREFETCH)
            done = asyncio.Event()
            count = 0

            async def on_message(message: Any) -> None:
                nonlocal count
                await message.channel.basic_ack(message.delivery.delivery_tag)
                count += 1
                if count >= n:
                    done.set()

            t0 = time.perf_counter()
            ok = await ch.basic_consume(name, on_message)
            await done.wait()
            cons = time.perf_counter() - t0
            await ch.basic_cancel(ok.consumer_tag)
            await ch.queue_delete(name)
        finally:
            await conn.close()
        return pub, cons

    return asyncio.run(asyncio.wait_for(main(), SCENARIO_TIMEOUT))


def run_pika(url: str, n: int, window: int) -> tuple[float, float]:
    if not _have("pika"):
        raise Skipped("pika is not installed")
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        name = ch.queue_declare("", exclusive=True).method.queue
        publish = ch.basic_publish
        t0 = time.perf_counter()
        for _ in range(n):
            publish(exchange="", routing_key=name, body=BODY)  # raises if nacked/returned
        pub = time.perf_counter() - t0
        ch.basic_qos(prefetch_count=PREFETCH)
        t0 = time.perf_counter()
        for count, (method, _props, _body) in enumerate(
            ch.consume(name, inactivity_timeout=SCENARIO_TIMEOUT), 1
        ):
            if method is None:
                raise TimeoutError("pika: no delivery within the scenario timeout")
            ch.basic_ack(method.delivery_tag)
            if count >= n:
                break
        cons = time.perf_counter() - t0
        ch.cancel()
        ch.queue_delete(name)
    finally:
        if conn.is_open:
            conn.close()
    return pub, cons


def run_pika_select(url: str, n: int, window: int) -> tuple[float, float]:
    """pika's asynchronous adapter: a sliding window of PIKA_SELECT_WINDOW unconfirmed
    publishes refilled from the confirm callback (pika's asynchronous publisher example)."""
    if not _have("pika"):
        raise Skipped("pika is not installed")
    import pika
    from pika.adapters.select_connection import SelectConnection

    st: dict[str, Any] = {"sent": 0, "upto": 0, "nacks": 0, "acked": 0, "error": None}
    times: dict[str, float] = {}

    def fail(msg: str) -> None:
        if st["error"] is None and "cons" not in times:
            st["error"] = msg
        conn.ioloop.stop()

    def on_open(c: Any) -> None:
        c.channel(on_open_callback=on_channel)

    def on_channel(ch: Any) -> None:
        st["ch"] = ch
        ch.add_on_close_callback(lambda _ch, reason: fail(f"channel closed: {reason}"))
        ch.confirm_delivery(ack_nack_callback=on_confirm, callback=lambda _f: declare(ch))

    def declare(ch: Any) -> None:
        ch.queue_declare("", exclusive=True, callback=on_declared)

    def on_declared(frame: Any) -> None:
        st["queue"] = frame.method.queue
        times["t0"] = time.perf_counter()
        fill()

    def fill() -> None:
        ch = st["ch"]
        q = st["queue"]
        limit = min(n, st["upto"] + PIKA_SELECT_WINDOW)
        while st["sent"] < limit:
            ch.basic_publish("", q, BODY)
            st["sent"] += 1

    def on_confirm(frame: Any) -> None:
        m = frame.method
        if isinstance(m, pika.spec.Basic.Nack):
            st["nacks"] += 1
        if m.multiple or m.delivery_tag == st["upto"] + 1:
            st["upto"] = max(st["upto"], m.delivery_tag)
        else:
            st["upto"] = m.delivery_tag  # RabbitMQ confirms in order on one queue
        if st["upto"] >= n:
            times["pub"] = time.perf_counter() - times["t0"]
            st["ch"].basic_qos(prefetch_count=PREFETCH, callback=start_consume)
        else:
            fill()

    def start_consume(_frame: Any) -> None:
        times["t1"] = time.perf_counter()
        st["ch"].basic_consume(st["queue"], on_message)

    def on_message(ch: Any, method: Any, _props: Any, _body: bytes) -> None:
        ch.basic_ack(method.delivery_tag)
        st["acked"] += 1
        if st["acked"] == n:
            times["cons"] = time.perf_counter() - times["t1"]
            ch.queue_delete(st["queue"], callback=lambda _f: conn.close())

    conn = SelectConnection(
        pika.URLParameters(url),
        on_open_callback=on_open,
        on_open_error_callback=lambda _c, err: fail(f"cannot open: {err}"),
        on_close_callback=lambda _c, _reason: conn.ioloop.stop(),
    )
    deadline = conn.ioloop.call_later(SCENARIO_TIMEOUT, lambda: fail("timed out"))
    conn.ioloop.start()
    conn.ioloop.remove_timeout(deadline)
    if st["error"] is not None:
        raise RuntimeError(st["error"])
    if st["nacks"]:
        raise RuntimeError(f"{st['nacks']} publishes were nacked")
    return times["pub"], times["cons"]


def _amqplib_ready() -> str:
    """The ``node`` to run amqplib with, after ``npm ci`` if its modules are not there yet
    (the lockfile pins them); :class:`Skipped` when Node or the package cannot be had."""
    node = shutil.which("node")
    npm = shutil.which("npm")
    if node is None or npm is None:
        raise Skipped("Node.js (node and npm) is not installed")
    if not os.path.isdir(os.path.join(AMQPLIB_DIR, "node_modules", "amqplib")):
        proc = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--silent"],
            cwd=AMQPLIB_DIR, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            raise Skipped(f"npm ci in benchmarks/amqplib failed: {proc.stderr.strip()[-300:]}")
    return node


def run_amqplib(url: str, n: int, window: int) -> tuple[float, float]:
    """amqplib in its own Node process: the same body, publish window and prefetch; the
    times are taken inside it (process start-up excluded, as for the others)."""
    node = _amqplib_ready()
    proc = subprocess.run(
        [node, os.path.join(AMQPLIB_DIR, "bench.js"), url, str(n), str(window), str(PREFETCH)],
        capture_output=True, text=True, timeout=SCENARIO_TIMEOUT, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"amqplib: {proc.stderr.strip()[-500:]}")
    times = json.loads(proc.stdout)
    return float(times["publish_s"]), float(times["consume_s"])


SCENARIOS: dict[str, Callable[[str, int, int], tuple[float, float]]] = {
    CEILING: run_raw,
    "ojs-anyio/asyncio": _ours_on("asyncio"),
    "ojs-anyio/trio": _ours_on("trio"),
    "aio-pika": run_aio_pika,
    "aiormq": run_aiormq,
    "pika": run_pika,
    "pika-select": run_pika_select,
    "amqplib": run_amqplib,
}


# =====================================================================================
# Runner
# =====================================================================================


@dataclass
class Result:
    name: str
    publish: list[float] = field(default_factory=list)  # msgs/s per round
    consume: list[float] = field(default_factory=list)
    skipped: str | None = None
    error: str | None = None
    retries: list[str] = field(default_factory=list)
    #: "best" (the fastest round) or "median" (of the rounds): what :meth:`rate` reports.
    stat: str = "best"
    #: Other per-round figures a scenario returned (e.g. CPU per message), by name.
    extra: dict[str, list[float]] = field(default_factory=dict)

    def rate(self, workload: str) -> float | None:
        samples = self.publish if workload == "publish" else self.consume
        if not samples:
            return None
        return statistics.median(samples) if self.stat == "median" else max(samples)


def wait_for_broker(url: str, timeout: float = BROKER_WAIT) -> None:
    """Block until the broker accepts TCP connections (other test suites may restart it)."""
    host, port = _url_parts(url)[:2]
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, port), timeout=2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def run_all(url: str, n: int, repeat: int, window: int, only: list[str] | None) -> dict[str, Result]:
    names = [s for s in SCENARIOS if only is None or s in only]
    with contextlib.suppress(Exception):  # untimed warm-up of the broker; failures show up below
        wait_for_broker(url)
        run_raw(url, min(n, 2000), window)
    scenarios = {name: (lambda url, n, run=SCENARIOS[name]: run(url, n, window)) for name in names}
    return run_rounds("hotpath", scenarios, url, n, repeat, ATTEMPTS)


def run_rounds(
    label: str,
    scenarios: dict[str, Callable[[str, int], tuple[Any, ...]]],
    url: str,
    n: int,
    repeat: int,
    attempts: int,
    stat: str = "best",
) -> dict[str, Result]:
    """``repeat`` rounds of every scenario (``scenario(url, n)`` returns the publish and
    consume seconds, and optionally a dict of other figures for :attr:`Result.extra`); a
    scenario that raises :class:`Skipped` or fails ``attempts`` times in a row is left out
    of the later rounds.  Also used by ``benchmarks/events.py``."""
    results = {name: Result(name, stat=stat) for name in scenarios}
    for _ in range(repeat):
        for name, scenario in scenarios.items():
            res = results[name]
            if res.skipped or res.error:
                continue
            for attempt in range(1, attempts + 1):
                try:
                    wait_for_broker(url)
                    pub, cons, *more = scenario(url, n)
                except Skipped as exc:
                    res.skipped = str(exc)
                    print(f"{label}: skipping {name}: {exc}", file=sys.stderr)
                    break
                except Exception as exc:
                    # A broker restart (or memory alarm) by another process fails a run
                    # without saying anything about the client: try again, say so.
                    msg = f"{type(exc).__name__}: {exc}"
                    if attempt < attempts:
                        res.retries.append(msg)
                        print(f"{label}: {name} failed ({msg}); retrying", file=sys.stderr)
                        traceback.print_exc(file=sys.stderr)
                        continue
                    res.error = msg
                    traceback.print_exc(file=sys.stderr)
                    break
                res.publish.append(n / pub)
                res.consume.append(n / cons)
                for key, value in (more[0] if more else {}).items():
                    res.extra.setdefault(key, []).append(value)
                break
    return results


def peer_ratios(
    results: dict[str, Result],
    ours: tuple[str, ...],
    peers: tuple[str, ...],
    ceiling: str,
    workloads: tuple[tuple[str, str], ...],
) -> dict[str, Any]:
    """Each of ``ours`` as a fraction of the ceiling and of each peer, per workload:
    ``{"to_ceiling": {"ours:wl": x}, "to_peers": {"ours/peer:wl": x}, "targets": []}``."""
    out: dict[str, Any] = {"to_ceiling": {}, "to_peers": {}, "targets": []}
    top_result = results.get(ceiling)
    for name in ours:
        r = results.get(name)
        if r is None:
            continue
        for wl, _label in workloads:
            mine = r.rate(wl)
            if mine is None:
                continue
            if top_result is not None and (top := top_result.rate(wl)):
                out["to_ceiling"][f"{name}:{wl}"] = mine / top
            for peer in peers:
                p = results.get(peer)
                if p is not None and (theirs := p.rate(wl)):
                    out["to_peers"][f"{name}/{peer}:{wl}"] = mine / theirs
    return out


def ratios(results: dict[str, Result]) -> dict[str, Any]:
    out = peer_ratios(results, OURS, PEERS, CEILING, WORKLOADS)
    for ours, wl, minimum in TARGETS:
        got = out["to_ceiling"].get(f"{ours}:{wl}")
        out["targets"].append(
            {
                "scenario": ours,
                "workload": wl,
                "minimum": minimum,
                "got": got,
                "status": "n/a" if got is None else ("PASS" if got >= minimum else "MISS"),
            }
        )
    for ours in OURS:
        for wl, _label in WORKLOADS:
            got = out["to_peers"].get(f"{ours}/amqplib:{wl}")
            out["targets"].append(
                {
                    "scenario": ours,
                    "workload": wl,
                    "peer": "amqplib",
                    "minimum": AMQPLIB_TARGET,
                    "got": got,
                    "status": "n/a" if got is None else ("PASS" if got >= AMQPLIB_TARGET else "MISS"),
                }
            )
    return out


# =====================================================================================
# Memory: consume 200,000 vs 20,000 in a child process
# =====================================================================================


def _maxrss_kb() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss // 1024 if sys.platform == "darwin" else rss  # bytes on macOS, KiB elsewhere


def memory_child(url: str, queue: str, n: int, backend: str) -> None:
    async def main() -> dict[str, Any]:
        async with amqp.connect(url) as conn, conn.channel(confirms=False) as ch:
            before = _maxrss_kb()
            count = 0
            t0 = time.perf_counter()
            async with ch.consume(queue, prefetch=PREFETCH) as messages:
                async for m in messages:
                    await m.ack()
                    count += 1
                    if count >= n:
                        break
            elapsed = time.perf_counter() - t0
        return {
            "n": count,
            "maxrss_kb": _maxrss_kb(),
            "maxrss_before_kb": before,
            "vm_hwm_kb": _vm_hwm_kb(),
            "rate": count / elapsed,
        }

    print(json.dumps(anyio.run(main, backend=backend)))


# Linux carries ru_maxrss across execve: a child exec'd straight from this (large)
# process would report at least our own RSS.  A small interpreter forks the child
# instead, so the child's ru_maxrss starts from that small process, not from us.
_FORK_TRAMPOLINE = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


def _vm_hwm_kb() -> int | None:
    """Peak RSS of the current process image (Linux /proc), as a cross-check."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _memory_once(url: str, backend: str, count: int) -> dict[str, Any]:
    queue = f"ojs-bench-hotpath-mem-{os.getpid()}-{count}"
    wait_for_broker(url)
    raw = RawConnection(url)
    try:
        # Not exclusive (the child consumes it); x-expires removes it if we die midway.
        raw.declare(queue, exclusive=False, arguments={"x-expires": 600_000})
        raw.publish(queue, count)
    finally:
        raw.close()
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-S",
                "-c",
                _FORK_TRAMPOLINE,
                sys.executable,
                os.path.abspath(__file__),
                "--memory-child",
                queue,
                "--n",
                str(count),
                "--backend",
                backend,
                "--url",
                url,
            ],
            capture_output=True,
            text=True,
            timeout=SCENARIO_TIMEOUT * 2,
            check=False,
        )
    finally:
        with contextlib.suppress(Exception):
            wait_for_broker(url)
            raw = RawConnection(url)
            try:
                raw.delete(queue)
            finally:
                raw.close()
    if proc.returncode != 0:
        raise RuntimeError(f"memory child for {count} messages failed:\n{proc.stderr}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def run_memory(url: str, backend: str) -> dict[str, Any]:
    out: dict[str, Any] = {"backend": backend, "runs": {}, "retries": [], "error": None, "status": "error"}
    for count in MEMORY_COUNTS:
        for attempt in range(1, ATTEMPTS + 1):
            try:
                out["runs"][str(count)] = _memory_once(url, backend, count)
            except Exception as exc:
                msg = f"{type(exc).__name__}: {exc}"
                if attempt < ATTEMPTS:
                    out["retries"].append(msg)
                    print(f"hotpath: memory run of {count} failed ({msg}); retrying", file=sys.stderr)
                    continue
                out["error"] = msg
                traceback.print_exc(file=sys.stderr)
                return out
            break
    small, big = (out["runs"][str(c)]["maxrss_kb"] for c in MEMORY_COUNTS)
    out["diff_mb"] = (big - small) / 1024
    out["status"] = "PASS" if out["diff_mb"] <= MEMORY_TARGET_MB else "MISS"
    return out


# =====================================================================================
# Profiling our hot path
# =====================================================================================


async def _profiled(prof: cProfile.Profile, url: str, n: int, window: int, workload: str) -> None:
    """Our two workloads, with the profiler on only around the one asked for."""
    async with amqp.connect(url) as conn, conn.channel(confirms=True) as ch:
        info = await ch.queue_declare("", exclusive=True)
        w = ch.publish_window(max_in_flight=window)
        if workload == "publish":
            prof.enable()
        for _ in range(n):
            await w.publish(BODY, routing_key=info.name)
        await w.wait_all()
        prof.disable()
        if workload == "consume":
            prof.enable()
            count = 0
            async with ch.consume(info.name, prefetch=PREFETCH) as messages:
                async for m in messages:
                    await m.ack()
                    count += 1
                    if count >= n:
                        break
            prof.disable()
        await ch.queue_delete(info.name)


def profile(url: str, n: int, window: int, backend: str, top: int = 30) -> None:
    for wl, label in WORKLOADS:
        prof = cProfile.Profile()
        anyio.run(_profiled, prof, url, n, window, wl, backend=backend)
        entries: dict[tuple[str, int, str], tuple[int, int, float, float, Any]]
        entries = pstats.Stats(prof).stats  # type: ignore[attr-defined]
        total = sum(v[2] for v in entries.values()) or 1e-9
        rows = sorted(entries.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
        print(
            f"\n== cProfile, ojs-anyio/{backend}, {label}, N={n}: top {top} by own time "
            f"(total {total:.3f}s profiled CPU) =="
        )
        print(f"{'own%':>6} {'cum%':>6} {'calls':>9}  function")
        for (filename, line, func), (_cc, nc, tt, ct, _callers) in rows:
            where = f"{_short_path(filename)}:{line}:{func}"
            print(f"{100 * tt / total:6.1f} {100 * ct / total:6.1f} {nc:9d}  {where}")


def _short_path(filename: str) -> str:
    for marker in ("/ojs_anyio/", "/codec/", "/anyio/", "/asyncio/", "/trio/", "/pamqp/"):
        i = filename.rfind(marker)
        if i >= 0:
            return filename[i + 1 :]
    return os.path.basename(filename) if filename.startswith("/") else filename


# =====================================================================================
# Output
# =====================================================================================


def _broker_label(url: str) -> str:
    host, port = _url_parts(url)[:2]
    return f"{host}:{port}"


def _fmt_rate(r: Result, wl: str) -> str:
    if r.skipped:
        return "skipped"
    if r.error:
        return "error"
    rate = r.rate(wl)
    return f"{rate:>10,.0f}" if rate is not None else "-"


def print_rates(
    results: dict[str, Result],
    ceiling: str,
    workloads: tuple[tuple[str, str], ...],
    repeat: int,
    *,
    unit: str,
    width: int,
    error_chars: int | None = None,
) -> None:
    """One table a workload: each scenario's rate (best or median of the rounds, as the
    results say), its share of the ceiling, every round's rate, and why it was skipped,
    failed or re-run.  Also used by events.py."""
    top_result = results.get(ceiling)
    for wl, label in workloads:
        stat = top_result.stat if top_result else "best"
        print(f"\n{label} ({unit}, {'median' if stat == 'median' else 'best'} of {repeat}):")
        top = top_result.rate(wl) if top_result else None
        for name, r in results.items():
            line = f"  {name:<{width}} {_fmt_rate(r, wl):>10}"
            rate = r.rate(wl)
            if top and rate and name != ceiling:
                line += f"   {100 * rate / top:5.1f}% of ceiling"
            samples = r.publish if wl == "publish" else r.consume
            if len(samples) > 1:
                line += "   [" + " ".join(f"{s:,.0f}" for s in samples) + "]"
            if r.skipped:
                line += f"   ({r.skipped})"
            elif r.error:
                line += f"   ({r.error[:error_chars]})"
            elif r.retries and wl == "publish":
                line += f"   (re-run {len(r.retries)}x after: {r.retries[-1][:70]})"
            print(line)


def print_shares(
    title: str,
    shares: dict[str, float | None],
    ours: tuple[str, ...],
    workloads: tuple[tuple[str, str], ...],
    *,
    width: int,
) -> None:
    """A line per client of ours: its share (``shares["ours:workload"]``) of each workload,
    as a percentage.  Also used by events.py."""
    print(f"\n{title}")
    for name in ours:
        cells = []
        for wl, label in workloads:
            v = shares.get(f"{name}:{wl}")
            cells.append(f"{label} {'n/a' if v is None else f'{100 * v:.1f}%'}")
        print(f"  {name:<{width}} " + ", ".join(cells))


def print_report(
    args: argparse.Namespace, results: dict[str, Result], rat: dict[str, Any], memory: dict[str, Any] | None
) -> None:
    print(
        f"hotpath: N={args.n} body={len(BODY)}B prefetch={PREFETCH} window={args.window} "
        f"peer-batch={PEER_BATCH} pika-select-window={PIKA_SELECT_WINDOW}; best of {args.repeat} round(s); "
        f"broker {_broker_label(args.url)}; Python {platform.python_version()}, {os.cpu_count()} CPUs"
    )
    if args.smoke:
        print("(smoke run: tiny N, the rates below measure start-up more than throughput)")
    print_rates(results, CEILING, WORKLOADS, args.repeat, unit="msgs/s", width=20)
    print_shares("ours / ceiling:", rat["to_ceiling"], OURS, WORKLOADS, width=20)
    print("\nours / peers (x = ours is that many times faster):")
    for ours in OURS:
        for peer in PEERS:
            parts = []
            for wl, label in WORKLOADS:
                v = rat["to_peers"].get(f"{ours}/{peer}:{wl}")
                if v is not None:
                    parts.append(f"{label} {v:.2f}x")
            if parts:
                print(f"  {ours:<20} vs {peer:<12} " + ", ".join(parts))
    print("\ntargets (context, not asserted):")
    for t in rat["targets"]:
        wl_label = dict(WORKLOADS)[t["workload"]]
        if "peer" in t:
            got = "n/a" if t["got"] is None else f"{t['got']:.2f}x"
            target = f"target >= {t['minimum']:.2f}x"
            print(f"  [{t['status']}] {t['scenario']} {wl_label}: {got} of {t['peer']} ({target})")
            continue
        got = "n/a" if t["got"] is None else f"{100 * t['got']:.1f}%"
        target = f"target >= {100 * t['minimum']:.0f}%"
        print(f"  [{t['status']}] {t['scenario']} {wl_label}: {got} of ceiling ({target})")
    if memory is not None:
        print_memory(memory)


def print_memory(memory: dict[str, Any]) -> None:
    print(
        f"\nmemory: peak RSS (ru_maxrss) of a child process consuming with ojs-anyio/{memory['backend']}, "
        f"prefetch {PREFETCH}:"
    )
    for count, run in memory["runs"].items():
        print(
            f"  {int(count):>7,} messages: peak {run['maxrss_kb'] / 1024:7.1f} MB "
            f"(before consuming {run['maxrss_before_kb'] / 1024:.1f} MB; "
            f"VmHWM {(run['vm_hwm_kb'] or 0) / 1024:.1f} MB; {run['rate']:,.0f} msgs/s)"
        )
    if memory["retries"]:
        print(f"  (re-run {len(memory['retries'])}x after: {memory['retries'][-1][:70]})")
    if memory["error"] is not None:
        print(f"  [ERROR] {memory['error']}")
        return
    target = f"target: within {MEMORY_TARGET_MB:.0f} MB"
    print(f"  [{memory['status']}] difference {memory['diff_mb']:+.1f} MB ({target})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--n", type=int, help="messages per workload (default 20000; 300 with --smoke)")
    ap.add_argument("--repeat", type=int, help="rounds, best reported (default 5; 1 with --smoke)")
    ap.add_argument("--url", default=DEFAULT_URL)
    ap.add_argument("--window", type=int, default=DEFAULT_WINDOW, help="our publish_window max_in_flight")
    ap.add_argument("--smoke", action="store_true", help="tiny N, one round, no memory run")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--memory", action="store_true", help="only the memory comparison")
    ap.add_argument("--no-memory", action="store_true", help="skip the memory comparison")
    ap.add_argument("--only", action="append", choices=list(SCENARIOS), help="run only these scenarios")
    ap.add_argument("--profile", choices=["asyncio", "trio"], help="cProfile our client's hot paths")
    ap.add_argument(
        "--backend",
        default="asyncio",
        choices=["asyncio", "trio"],
        help="our backend for --memory (default asyncio)",
    )
    ap.add_argument("--memory-child", metavar="QUEUE", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.n is None:
        args.n = 300 if args.smoke else 20_000
    if args.repeat is None:
        args.repeat = 1 if args.smoke else 5

    if args.memory_child:
        memory_child(args.url, args.memory_child, args.n, args.backend)
        return 0
    if args.profile:
        profile(args.url, args.n, args.window, args.profile)
        return 0

    results: dict[str, Result] = {}
    rat: dict[str, Any] = {"to_ceiling": {}, "to_peers": {}, "targets": []}
    if not args.memory:
        stdout = sys.stdout
        with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext(stdout):
            results = run_all(args.url, args.n, args.repeat, args.window, args.only)
        rat = ratios(results)
    memory = None
    if (args.memory or not (args.no_memory or args.smoke)) and not args.only:
        memory = run_memory(args.url, args.backend)

    if args.json:
        print(
            json.dumps(
                {
                    "n": args.n,
                    "smoke": args.smoke,
                    "broker": _broker_label(args.url),
                    "body_bytes": len(BODY),
                    "prefetch": PREFETCH,
                    "window": args.window,
                    "peer_batch": PEER_BATCH,
                    "pika_select_window": PIKA_SELECT_WINDOW,
                    "repeat": args.repeat,
                    "python": platform.python_version(),
                    "results": {
                        name: {
                            "publish_msgs_per_s": r.rate("publish"),
                            "consume_msgs_per_s": r.rate("consume"),
                            "publish_samples": r.publish,
                            "consume_samples": r.consume,
                            "skipped": r.skipped,
                            "error": r.error,
                            "retries": r.retries,
                        }
                        for name, r in results.items()
                    },
                    **rat,
                    "memory": memory,
                }
            )
        )
    elif args.memory:
        assert memory is not None
        print_memory(memory)
    else:
        print_report(args, results, rat, memory)
    failed = [name for name in (CEILING, *OURS) if name in results and results[name].error]
    if memory is not None and memory["error"] is not None:
        failed.append("memory")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
