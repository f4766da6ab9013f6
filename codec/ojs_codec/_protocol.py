"""The sans-IO AMQP 0-9-1 client protocol: bytes in, events out; commands in, bytes out.

:class:`AMQPConnection` never touches a socket or a clock.  The I/O layer:

1. calls :meth:`~AMQPConnection.initiate` and writes :meth:`~AMQPConnection.data_to_send`;
2. feeds every chunk it reads to :meth:`~AMQPConnection.receive_data`, which returns a
   list of :mod:`ojs_codec._events` values and may queue automatic replies (Start-Ok,
   Tune-Ok, Close-Ok…) for ``data_to_send()``;
3. issues commands (:meth:`open_channel`, :meth:`send_method`, :meth:`publish`,
   :meth:`ack`…) that queue bytes for ``data_to_send()``;
4. calls :meth:`~AMQPConnection.heartbeat_tick` with the current time, when it says.

State machines are tables (``_CONNECTION_TRANSITIONS``, ``_CHANNEL_TRANSITIONS``): an
input the table does not list for the current state moves the machine to ``ERROR`` and
raises a :class:`~ojs_codec.ProtocolError` carrying the reply code to close with.
"""

from __future__ import annotations

import enum
import struct
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from pamqp import commands

from . import _fast, _hot
from ._errors import (
    AuthenticationError,
    ChannelProtocolError,
    CommandInvalid,
    ConnectionLevelError,
    FrameError,
    NotImplementedByPeer,
    UnexpectedFrame,
    UsageError,
    channel_error_for,
    connection_error_for,
)
from ._events import (
    ChannelClosed,
    ChannelCloseOk,
    ChannelFlow,
    ChannelOpened,
    Confirmed,
    ConnectionBlocked,
    ConnectionClosed,
    ConnectionCloseOk,
    ConnectionOpened,
    ConnectionUnblocked,
    ConsumerCancelled,
    Delivery,
    Event,
    GetOk,
    MethodReply,
    Returned,
)
from ._frames import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_OVERHEAD,
    HEARTBEAT_FRAME,
    MAX_INCOMING_CONTENT_HEADER,
    PROTOCOL_HEADER,
    FrameReader,
    decode_method,
    encode_method_frame,
)
from ._methods import (
    BASIC_ACK,
    BASIC_CANCEL,
    BASIC_CANCEL_OK,
    BASIC_CONSUME,
    BASIC_CONSUME_OK,
    BASIC_DELIVER,
    BASIC_GET,
    BASIC_GET_EMPTY,
    BASIC_GET_OK,
    BASIC_NACK,
    BASIC_PUBLISH,
    BASIC_QOS,
    BASIC_QOS_OK,
    BASIC_RECOVER,
    BASIC_RECOVER_ASYNC,
    BASIC_RECOVER_OK,
    BASIC_REJECT,
    BASIC_RETURN,
    CHANNEL_CLOSE,
    CHANNEL_CLOSE_OK,
    CHANNEL_FLOW,
    CHANNEL_FLOW_OK,
    CHANNEL_OPEN_OK,
    CONFIRM_SELECT,
    CONFIRM_SELECT_OK,
    CONNECTION_BLOCKED,
    CONNECTION_CLOSE,
    CONNECTION_CLOSE_OK,
    CONNECTION_OPEN_OK,
    CONNECTION_SECURE,
    CONNECTION_START,
    CONNECTION_TUNE,
    CONNECTION_UNBLOCKED,
    EXCHANGE_BIND,
    EXCHANGE_BIND_OK,
    EXCHANGE_DECLARE,
    EXCHANGE_DECLARE_OK,
    EXCHANGE_DELETE,
    EXCHANGE_DELETE_OK,
    EXCHANGE_UNBIND,
    EXCHANGE_UNBIND_OK,
    QUEUE_BIND,
    QUEUE_BIND_OK,
    QUEUE_DECLARE,
    QUEUE_DECLARE_OK,
    QUEUE_DELETE,
    QUEUE_DELETE_OK,
    QUEUE_PURGE,
    QUEUE_PURGE_OK,
    QUEUE_UNBIND,
    QUEUE_UNBIND_OK,
    TX_COMMIT,
    TX_COMMIT_OK,
    TX_ROLLBACK,
    TX_ROLLBACK_OK,
    TX_SELECT,
    TX_SELECT_OK,
    method_name,
)
from ._properties import EMPTY_PROPERTIES, BasicProperties
from ._table import encode_table

__all__ = [
    "AMQPConnection",
    "ChannelState",
    "ConnectionParameters",
    "ConnectionState",
    "Credentials",
    "negotiate",
]

_U32 = struct.Struct(">I")
_DELIVER_ID = _U32.pack(BASIC_DELIVER)
#: A Basic.Ack frame's size, whatever its channel, tag and flag.
ACK_FRAME_SIZE = len(_fast.encode_ack(1, 1, False))

#: Synchronous requests and the replies that complete them.
_SYNC_REPLIES: dict[int, frozenset[int]] = {
    CHANNEL_FLOW: frozenset({CHANNEL_FLOW_OK}),
    EXCHANGE_DECLARE: frozenset({EXCHANGE_DECLARE_OK}),
    EXCHANGE_DELETE: frozenset({EXCHANGE_DELETE_OK}),
    EXCHANGE_BIND: frozenset({EXCHANGE_BIND_OK}),
    EXCHANGE_UNBIND: frozenset({EXCHANGE_UNBIND_OK}),
    QUEUE_DECLARE: frozenset({QUEUE_DECLARE_OK}),
    QUEUE_BIND: frozenset({QUEUE_BIND_OK}),
    QUEUE_PURGE: frozenset({QUEUE_PURGE_OK}),
    QUEUE_DELETE: frozenset({QUEUE_DELETE_OK}),
    QUEUE_UNBIND: frozenset({QUEUE_UNBIND_OK}),
    BASIC_QOS: frozenset({BASIC_QOS_OK}),
    BASIC_CONSUME: frozenset({BASIC_CONSUME_OK}),
    BASIC_CANCEL: frozenset({BASIC_CANCEL_OK}),
    BASIC_GET: frozenset({BASIC_GET_OK, BASIC_GET_EMPTY}),
    BASIC_RECOVER: frozenset({BASIC_RECOVER_OK}),
    CONFIRM_SELECT: frozenset({CONFIRM_SELECT_OK}),
    TX_SELECT: frozenset({TX_SELECT_OK}),
    TX_COMMIT: frozenset({TX_COMMIT_OK}),
    TX_ROLLBACK: frozenset({TX_ROLLBACK_OK}),
}
_ALL_SYNC_REPLIES = frozenset().union(*_SYNC_REPLIES.values())

#: Methods the client may send on an open channel without waiting for a reply.
_ASYNC_CLIENT_METHODS = frozenset({BASIC_PUBLISH, BASIC_ACK, BASIC_REJECT, BASIC_RECOVER_ASYNC, BASIC_NACK})

CAPABILITIES: dict[str, Any] = {
    "publisher_confirms": True,
    "consumer_cancel_notify": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "connection.blocked": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
}


# ---------------------------------------------------------------------------
# Parameters


@dataclass(frozen=True, slots=True, kw_only=True)
class Credentials:
    """Login for the handshake.  The password never appears in ``repr``."""

    username: str = "guest"
    password: str = field(default="guest", repr=False)
    mechanism: str = "PLAIN"

    def __post_init__(self) -> None:
        if self.mechanism not in ("PLAIN", "AMQPLAIN", "EXTERNAL"):
            raise UsageError(
                f"unsupported auth mechanism {self.mechanism!r}: use PLAIN, AMQPLAIN or EXTERNAL"
            )

    def response(self) -> bytes:
        """The Start-Ok response bytes for this mechanism."""
        if self.mechanism == "PLAIN":
            return b"\x00" + self.username.encode() + b"\x00" + self.password.encode()
        if self.mechanism == "AMQPLAIN":
            # A field table without its length prefix (RabbitMQ's AMQPLAIN).
            return encode_table({"LOGIN": self.username, "PASSWORD": self.password})[4:]
        return b""  # EXTERNAL: the identity comes from the TLS client certificate


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionParameters:
    """What the client proposes in the handshake.  0 means "no limit" (heartbeat: off)."""

    credentials: Credentials = field(default_factory=Credentials)
    virtual_host: str = "/"
    channel_max: int = 2047
    frame_max: int = 131072
    heartbeat: int = 60
    locale: str = "en_US"
    client_properties: Mapping[str, Any] = field(default_factory=dict)
    #: Largest message body accepted from the broker; a larger one is a FRAME_ERROR.
    max_message_size: int = 128 * 1024 * 1024

    def __post_init__(self) -> None:
        if not 0 <= self.channel_max <= 65535:
            raise UsageError(f"channel_max must be 0..65535, got {self.channel_max}")
        if self.frame_max != 0 and self.frame_max < 4096:
            raise UsageError(f"frame_max must be 0 or >= 4096, got {self.frame_max}")
        if not 0 <= self.heartbeat <= 65535:
            raise UsageError(f"heartbeat must be 0..65535 seconds, got {self.heartbeat}")


def negotiate(client: int, server: int) -> int:
    """RabbitMQ's tuning rule: if either side offers 0, the larger value wins, else the smaller."""
    if client == 0 or server == 0:
        return max(client, server)
    return min(client, server)


# ---------------------------------------------------------------------------
# States and transition tables


class ConnectionState(enum.Enum):
    INITIAL = "initial"  # nothing sent yet
    AWAIT_START = "await-start"  # protocol header sent
    AWAIT_TUNE = "await-tune"  # Start-Ok sent
    AWAIT_OPEN_OK = "await-open-ok"  # Tune-Ok + Open sent
    OPEN = "open"
    CLOSING = "closing"  # we sent Close, waiting for Close-Ok
    CLOSED = "closed"
    ERROR = "error"


class ChannelState(enum.Enum):
    OPENING = "opening"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


# Content assembly kinds
_NO_CONTENT, _DELIVER, _RETURN, _GET_OK = 0, 1, 2, 3
#: The content of a method dropped while the channel closes: its frames are read, then dropped.
_DISCARD = 4


class _Channel:
    __slots__ = (
        "awaiting",
        "body_parts",
        "body_received",
        "body_size",
        "confirm_mode",
        "confirm_select_pending",
        "content_fields",
        "content_kind",
        "crossed",
        "early_acked",
        "id",
        "malformed",
        "mandatory_pending",
        "next_publish_tag",
        "properties",
        "returned",
        "state",
        "unconfirmed",
    )

    def __init__(self, channel_id: int) -> None:
        self.id = channel_id
        self.state = ChannelState.OPENING
        self.crossed = False  # both sides sent Channel.Close; the broker's Close-Ok is still due
        self.awaiting: frozenset[int] | None = None  # replies that would complete the sync method
        # content assembly
        self.content_kind = _NO_CONTENT
        self.content_fields: tuple[Any, ...] = ()
        self.properties: BasicProperties | None = None
        self.malformed: str | None = None
        self.body_size = 0
        self.body_received = 0
        self.body_parts: list[bytes] = []
        # publisher confirms
        self.confirm_mode = False
        self.confirm_select_pending = False
        self.next_publish_tag = 1
        self.unconfirmed: deque[int] = deque()
        self.early_acked: set[int] = set()
        #: tag -> (exchange, routing_key, body, properties) of mandatory publishes not yet
        #: confirmed: what a Basic.Return is matched against
        self.mandatory_pending: dict[int, tuple[str, str, bytes, BasicProperties | None]] = {}
        self.returned: dict[int, Returned] = {}


class AMQPConnection:
    """A sans-IO AMQP 0-9-1 client connection (see the module docstring)."""

    def __init__(self, parameters: ConnectionParameters | None = None) -> None:
        self.parameters = parameters or ConnectionParameters()
        self.state = ConnectionState.INITIAL
        self._reader = FrameReader(
            frame_max=max(self.parameters.frame_max, 4096) or 131072,
            content_header_max=MAX_INCOMING_CONTENT_HEADER,
        )
        self._out = bytearray()
        #: The bytes queued for the peer, the same buffer ``data_to_send()`` drains.  Read
        #: ``len(outbound)`` to size a batch; never modify it (the codec appends to it).
        self.outbound: bytearray = self._out
        self._channels: dict[int, _Channel] = {}
        self.channel_max = self.parameters.channel_max or 65535
        self.frame_max = self.parameters.frame_max or 131072
        self.heartbeat = 0
        self.server_properties: dict[str, Any] = {}
        self.blocked_reason: str | None = None
        #: The error that moved the machine to ERROR or CLOSED, if any.
        self.error: ConnectionLevelError | None = None
        self._max_message = self.parameters.max_message_size
        # heartbeat bookkeeping: counters, so the hot path never reads a clock
        self._bytes_out = 0
        self._frames_in = 0
        self._hb_seen_out = -1
        self._hb_seen_in = -1
        self._hb_last_in_time: float | None = None
        self._hb_last_out_time: float | None = None
        # The frame queued last, when it is a Basic.Ack that a later ack may fold into
        # (see ``ack``): where the queue ended after it, its channel and its tag.
        self._ack_end = -1
        self._ack_channel = 0
        self._ack_tag = 0

    # ------------------------------------------------------------------ I/O

    def initiate(self) -> None:
        """Queue the protocol header.  First call after construction."""
        self._require(ConnectionState.INITIAL, "initiate")
        self._out += PROTOCOL_HEADER
        self.state = ConnectionState.AWAIT_START

    def data_to_send(self) -> bytes:
        """Drain the bytes queued for the peer (b"" when there are none)."""
        if not self._out:
            return b""
        data = bytes(self._out)
        self._out.clear()
        self._ack_end = -1  # the queued ack went out: nothing to fold into
        self._bytes_out += len(data)
        return data

    @property
    def has_data_to_send(self) -> bool:
        return bool(self._out)

    def receive_data(self, data: bytes) -> list[Event]:
        """Feed bytes read from the socket; return the events they complete.

        Raises a :class:`~ojs_codec.ProtocolError` on a protocol violation (or another
        :class:`~ojs_codec.ConnectionLevelError` it detects, such as
        :class:`~ojs_codec.AuthenticationError`), after which the machine is in ``ERROR`` and a
        Connection.Close with the error's reply code is queued for the peer.
        """
        if self.state in (ConnectionState.CLOSED, ConnectionState.ERROR):
            return []
        events: list[Event] = []
        reader = self._reader
        frames: list[tuple[int, int, bytes]] = []
        tail: bytes | None = None  # the bytes after ``frames``, fed to the reader once they are handled
        i = count = 0
        try:
            if self.state is ConnectionState.OPEN and type(data) is bytes:
                # The common case: the whole frames of ``data`` sliced out in one call (the C
                # split when ojs_codec._speedups is loaded); a frame left incomplete by the
                # previous read is finished first.  Before the connection is open, frames
                # are read one at a time: Tune changes the reader's frame_max.
                if not reader.drained:
                    reader.feed(data)
                    first = reader.next_frame()
                    if first is None:
                        return events
                    frames.append(first)
                    data = reader.detach()
                tail = data[reader.split(frames, data) :]
                count = len(frames)
            else:
                reader.feed(data)
            while True:
                if i < count:
                    ftype, channel_id, payload = frames[i]
                    i += 1
                else:
                    if tail is not None:
                        rest, tail = tail, None
                        reader.feed(rest)
                    frame = reader.next_frame()
                    if frame is None:
                        break
                    ftype, channel_id, payload = frame
                self._frames_in += 1
                if channel_id == 0:
                    self._on_channel0_frame(ftype, payload, events)
                    if self.state in (ConnectionState.CLOSED, ConnectionState.ERROR):
                        break  # the rest stays unread
                    continue
                if ftype == FRAME_METHOD and i + 1 < count and payload[:4] == _DELIVER_ID:
                    # A delivery whose header and body frame came in the same read: the
                    # channel's content state machine takes the three in one step.
                    head = frames[i]
                    body = frames[i + 1]
                    if (
                        head[0] == FRAME_HEADER
                        and head[1] == channel_id
                        and body[0] == FRAME_BODY
                        and body[1] == channel_id
                        and self._on_whole_delivery(channel_id, payload, head[2], body[2], events)
                    ):
                        i += 2
                        self._frames_in += 2
                        continue
                self._on_channel_frame(ftype, channel_id, payload, events)
        except BaseException as exc:
            if i < count:
                # Frames not handled stay unread, in front of the tail.
                assert tail is not None
                unread = sum(len(f[2]) + FRAME_OVERHEAD for f in frames[i:])
                reader.feed(data[len(data) - len(tail) - unread :])
            elif tail is not None:
                reader.feed(tail)
            if isinstance(exc, ConnectionLevelError):
                # ProtocolError and the other locally detected connection-level faults
                # (e.g. no acceptable auth mechanism): close with the error's reply code.
                self._fail(exc)
            raise
        if tail:
            reader.feed(tail)
        return events

    def heartbeat_tick(self, now: float) -> float | None:
        """Run heartbeat bookkeeping at time ``now`` (seconds, any monotonic clock).

        Queues a heartbeat frame when nothing was sent for half the interval.  Raises
        :class:`~ojs_codec.ConnectionLevelError` (501-style "missed heartbeats") when
        nothing arrived for two intervals.  Returns the time of the next tick, or
        ``None`` when heartbeats are off.
        """
        if self.heartbeat == 0 or self.state not in (ConnectionState.OPEN, ConnectionState.CLOSING):
            return None
        interval = float(self.heartbeat)
        if self._frames_in != self._hb_seen_in or self._hb_last_in_time is None:
            self._hb_seen_in = self._frames_in
            self._hb_last_in_time = now
        elif now - self._hb_last_in_time >= 2 * interval:
            err = ConnectionLevelError(
                f"missed heartbeats: nothing received for {now - self._hb_last_in_time:.1f}s "
                f"(heartbeat {self.heartbeat}s)",
                reply_code=501,
                remote=False,
            )
            self.state = ConnectionState.ERROR
            self.error = err
            raise err
        sent_total = self._bytes_out + len(self._out)
        if sent_total != self._hb_seen_out or self._hb_last_out_time is None:
            self._hb_seen_out = sent_total
            self._hb_last_out_time = now
        elif now - self._hb_last_out_time >= interval / 2:
            self._out += HEARTBEAT_FRAME
            self._hb_seen_out = sent_total + len(HEARTBEAT_FRAME)
            self._hb_last_out_time = now
        return now + interval / 2

    # ------------------------------------------------------------- commands

    def close(self, reply_code: int = 200, reply_text: str = "Normal shutdown") -> None:
        """Start the close handshake (idempotent)."""
        if self.state in (ConnectionState.CLOSING, ConnectionState.CLOSED, ConnectionState.ERROR):
            return
        if self.state in (ConnectionState.INITIAL, ConnectionState.AWAIT_START):
            # Nothing to shake hands with yet.
            self.state = ConnectionState.CLOSED
            return
        self._out += encode_method_frame(
            0,
            commands.Connection.Close(reply_code=reply_code, reply_text=reply_text, class_id=0, method_id=0),
        )
        self.state = ConnectionState.CLOSING

    def open_channel(self) -> int:
        """Allocate the lowest free channel id, queue Channel.Open, and return the id."""
        self._require(ConnectionState.OPEN, "open a channel")
        channel_id = self._allocate_channel_id()
        ch = _Channel(channel_id)
        self._channels[channel_id] = ch
        self._out += encode_method_frame(channel_id, commands.Channel.Open())
        return channel_id

    def close_channel(
        self, channel_id: int, reply_code: int = 200, reply_text: str = "Normal shutdown"
    ) -> None:
        """Queue Channel.Close.  ``ChannelCloseOk`` follows; idempotent while closing."""
        ch = self._channels.get(channel_id)
        if ch is None or ch.state in (ChannelState.CLOSING, ChannelState.CLOSED):
            return
        if self.state is not ConnectionState.OPEN:
            return
        self._out += encode_method_frame(
            channel_id,
            commands.Channel.Close(reply_code=reply_code, reply_text=reply_text, class_id=0, method_id=0),
        )
        ch.state = ChannelState.CLOSING
        ch.awaiting = None

    def channel_state(self, channel_id: int) -> ChannelState:
        ch = self._channels.get(channel_id)
        return ch.state if ch is not None else ChannelState.CLOSED

    def is_confirm_mode(self, channel_id: int) -> bool:
        ch = self._channels.get(channel_id)
        return ch is not None and ch.confirm_mode

    def send_method(self, channel_id: int, method: Any) -> bool:
        """Queue any method (a pamqp command) on an open channel.

        Returns ``True`` when a reply is expected (a synchronous method without
        ``nowait``).  Raises :class:`~ojs_codec.UsageError` if another synchronous method is
        still outstanding on the channel: AMQP allows only one at a time.
        """
        self._require(ConnectionState.OPEN, "send a method")
        ch = self._open_channel_or_raise(channel_id)
        mid = method.index
        replies = _SYNC_REPLIES.get(mid)
        expects_reply = replies is not None and not getattr(method, "nowait", False)
        if replies is None and mid not in _ASYNC_CLIENT_METHODS:
            raise UsageError(f"{method.name} cannot be sent on a channel by a client")
        if expects_reply and ch.awaiting is not None:
            raise UsageError(
                f"channel {channel_id} already waits for a reply; one synchronous method at a time"
            )
        if mid == CONFIRM_SELECT:
            if ch.confirm_mode or ch.confirm_select_pending:
                return expects_reply
            ch.confirm_select_pending = True
            if not expects_reply:
                ch.confirm_mode = True
        self._out += encode_method_frame(channel_id, method)
        if expects_reply:
            assert replies is not None
            ch.awaiting = replies
        return expects_reply

    def publish(
        self,
        channel_id: int,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: BasicProperties | None = None,
        *,
        mandatory: bool = False,
        immediate: bool = False,
    ) -> int:
        """Queue Basic.Publish with its content.  Returns the publish sequence number
        (the confirm tag) on a channel in confirm mode, else 0.
        """
        ch = self._channels.get(channel_id)
        if ch is None or ch.state is not ChannelState.OPEN or self.state is not ConnectionState.OPEN:
            self._require(ConnectionState.OPEN, "publish")
            self._open_channel_or_raise(channel_id)
        assert ch is not None
        body_len = len(body)
        if body_len > self._max_message:
            raise UsageError(f"message body of {body_len} bytes exceeds max_message_size={self._max_message}")
        self._out += _hot.encode_publish(
            channel_id, exchange, routing_key, properties, body, self.frame_max, mandatory, immediate
        )
        if not ch.confirm_mode:
            return 0
        tag = ch.next_publish_tag
        ch.next_publish_tag = tag + 1
        ch.unconfirmed.append(tag)
        if mandatory:
            ch.mandatory_pending[tag] = (exchange, routing_key, body, properties)
        return tag

    def ack(self, channel_id: int, delivery_tag: int, multiple: bool = False, fold: bool = False) -> None:
        """Queue Basic.Ack.

        ``fold=True`` says that every delivery of the channel with a tag up to
        ``delivery_tag`` is settled by a frame already queued or sent.  Then, if the frame
        queued last is an ack of this channel with a lower tag, this ack replaces it as one
        ``multiple=True`` ack: the broker reads one frame where it would read several, and
        settles the same deliveries (those two, the only ones it still holds up to this tag).
        """
        ch = self._channels.get(channel_id)
        if ch is None or ch.state is not ChannelState.OPEN:  # one ack a message: no call
            self._open_channel_or_raise(channel_id)  # raises
        out = self._out
        if (
            fold
            and self._ack_end == len(out)
            and self._ack_channel == channel_id
            and delivery_tag > self._ack_tag
        ):
            del out[-ACK_FRAME_SIZE:]
            multiple = True
        out += _fast.encode_ack(channel_id, delivery_tag, multiple)
        self._ack_end = len(out)
        self._ack_channel = channel_id
        self._ack_tag = delivery_tag

    def nack(self, channel_id: int, delivery_tag: int, multiple: bool = False, requeue: bool = True) -> None:
        self._open_channel_or_raise(channel_id)
        self._out += _fast.encode_nack(channel_id, delivery_tag, multiple, requeue)

    def reject(self, channel_id: int, delivery_tag: int, requeue: bool = True) -> None:
        self._open_channel_or_raise(channel_id)
        self._out += _fast.encode_reject(channel_id, delivery_tag, requeue)

    def unconfirmed_tags(self, channel_id: int) -> list[int]:
        """Publish tags on the channel whose confirm has not arrived, ascending."""
        ch = self._channels.get(channel_id)
        if ch is None:
            return []
        return [t for t in ch.unconfirmed if t not in ch.early_acked]

    @property
    def open_channel_ids(self) -> list[int]:
        return [cid for cid, ch in self._channels.items() if ch.state is not ChannelState.CLOSED]

    # ------------------------------------------------------------- internals

    def _require(self, state: ConnectionState, what: str) -> None:
        if self.state is not state:
            if self.error is not None and self.state in (ConnectionState.CLOSED, ConnectionState.ERROR):
                raise UsageError(f"cannot {what}: connection is {self.state.value} ({self.error})")
            raise UsageError(f"cannot {what}: connection is {self.state.value}")

    def _open_channel_or_raise(self, channel_id: int) -> _Channel:
        ch = self._channels.get(channel_id)
        if ch is None or ch.state is not ChannelState.OPEN:
            state = "closed" if ch is None else ch.state.value
            raise UsageError(f"channel {channel_id} is {state}")
        return ch

    def _allocate_channel_id(self) -> int:
        for cid in range(1, self.channel_max + 1):
            if cid not in self._channels:
                return cid
        raise UsageError(f"all {self.channel_max} channels are in use (channel_max)")

    def _fail(self, exc: ConnectionLevelError) -> None:
        """Move to ERROR and queue a Close carrying the error's reply code."""
        if self.state in (ConnectionState.OPEN, ConnectionState.AWAIT_OPEN_OK, ConnectionState.AWAIT_TUNE):
            self._out += encode_method_frame(
                0,
                commands.Connection.Close(
                    reply_code=exc.code, reply_text=exc.reply_text[:255], class_id=0, method_id=0
                ),
            )
        self.state = ConnectionState.ERROR
        self.error = exc

    # --- channel 0

    def _on_channel0_frame(self, ftype: int, payload: bytes, events: list[Event]) -> None:
        if ftype == FRAME_HEARTBEAT:
            return
        if ftype != FRAME_METHOD:
            raise UnexpectedFrame(f"frame type {ftype} on channel 0", remote=False)
        mid = _U32.unpack_from(payload)[0]
        handler = _CONNECTION_TRANSITIONS.get((self.state, mid))
        if handler is None:
            if self.state is ConnectionState.CLOSING:
                return  # anything but Close/Close-Ok is dropped while closing
            raise CommandInvalid(
                f"unexpected method {method_name(mid)} on channel 0 in state {self.state.value}",
                class_id=mid >> 16,
                method_id=mid & 0xFFFF,
                remote=False,
            )
        handler(self, decode_method(payload), events)

    def _ignore(self, method: Any, events: list[Event]) -> None:
        pass

    def _on_start(self, method: Any, events: list[Event]) -> None:
        if (method.version_major, method.version_minor) != (0, 9):
            raise NotImplementedByPeer(
                f"broker speaks AMQP {method.version_major}-{method.version_minor}, not 0-9-1", remote=False
            )
        self.server_properties = dict(method.server_properties or {})
        creds = self.parameters.credentials
        mechanisms = _as_text(method.mechanisms).split()
        if creds.mechanism not in mechanisms:
            raise AuthenticationError(
                f"broker does not offer the {creds.mechanism} mechanism (offers: {' '.join(mechanisms)})",
                remote=False,
            )
        props = {
            "product": "ojs-anyio",
            "platform": "Python",
            "version": "0.1.0",
            "information": "https://openjobspec.org",
            **self.parameters.client_properties,
            "capabilities": dict(CAPABILITIES),
        }
        self._out += _encode_start_ok(props, creds.mechanism, creds.response(), self.parameters.locale)
        self.state = ConnectionState.AWAIT_TUNE

    def _on_secure(self, method: Any, events: list[Event]) -> None:
        raise AuthenticationError(
            "broker sent Connection.Secure; PLAIN, AMQPLAIN and EXTERNAL need no challenge", remote=False
        )

    def _on_tune(self, method: Any, events: list[Event]) -> None:
        p = self.parameters
        channel_max = negotiate(p.channel_max, method.channel_max)
        frame_max = negotiate(p.frame_max, method.frame_max)
        heartbeat = negotiate(p.heartbeat, method.heartbeat)
        self.channel_max = channel_max or 65535
        self.frame_max = frame_max or 131072  # 0 = unlimited; we still write frames of a sane size
        self.heartbeat = heartbeat
        self._reader.frame_max = frame_max
        self._out += encode_method_frame(
            0, commands.Connection.TuneOk(channel_max=channel_max, frame_max=frame_max, heartbeat=heartbeat)
        )
        self._out += encode_method_frame(0, commands.Connection.Open(virtual_host=p.virtual_host))
        self.state = ConnectionState.AWAIT_OPEN_OK

    def _on_open_ok(self, method: Any, events: list[Event]) -> None:
        self.state = ConnectionState.OPEN
        events.append(
            ConnectionOpened(
                channel_max=self.channel_max,
                frame_max=self.frame_max,
                heartbeat=self.heartbeat,
                server_properties=self.server_properties,
            )
        )

    def _on_close(self, method: Any, events: list[Event]) -> None:
        in_handshake = self.state is not ConnectionState.OPEN
        if in_handshake and method.reply_code == 403:
            err: ConnectionLevelError = AuthenticationError(
                method.reply_text, class_id=method.class_id or 0, method_id=method.method_id or 0
            )
        else:
            err = connection_error_for(
                method.reply_code or 0, method.reply_text or "", method.class_id or 0, method.method_id or 0
            )
        self._out += encode_method_frame(0, commands.Connection.CloseOk())
        self.state = ConnectionState.CLOSED
        self.error = err
        events.append(ConnectionClosed(error=err))

    def _on_close_while_closing(self, method: Any, events: list[Event]) -> None:
        # Both sides closed at once: answer, and treat it as our close completing.
        self._out += encode_method_frame(0, commands.Connection.CloseOk())
        self.state = ConnectionState.CLOSED
        events.append(ConnectionCloseOk())

    def _on_close_ok(self, method: Any, events: list[Event]) -> None:
        self.state = ConnectionState.CLOSED
        events.append(ConnectionCloseOk())

    def _on_blocked(self, method: Any, events: list[Event]) -> None:
        self.blocked_reason = method.reason or "blocked"
        events.append(ConnectionBlocked(reason=self.blocked_reason))

    def _on_unblocked(self, method: Any, events: list[Event]) -> None:
        self.blocked_reason = None
        events.append(ConnectionUnblocked())

    # --- other channels

    def _on_channel_frame(self, ftype: int, channel_id: int, payload: bytes, events: list[Event]) -> None:
        if self.state is not ConnectionState.OPEN:
            if self.state is ConnectionState.CLOSING:
                return
            raise ChannelProtocolError(
                f"frame on channel {channel_id} before the connection is open", remote=False
            )
        ch = self._channels.get(channel_id)
        if ch is None:
            raise ChannelProtocolError(f"frame on channel {channel_id}, which is not open", remote=False)
        if ftype == FRAME_METHOD:
            if ch.content_kind != _NO_CONTENT:
                raise UnexpectedFrame(
                    f"method frame on channel {channel_id} while a message's content was expected",
                    remote=False,
                )
            self._on_channel_method(ch, payload, events)
        elif ftype == FRAME_HEADER:
            self._on_content_header(ch, payload, events)
        elif ftype == FRAME_BODY:
            self._on_content_body(ch, payload, events)
        else:
            raise UnexpectedFrame(f"frame type {ftype} on channel {channel_id}", remote=False)

    def _content_header(self, payload: bytes) -> tuple[int, BasicProperties, str | None]:
        """``(body_size, properties, malformed)`` of a content header from the broker.

        Decoded leniently (``decode_content_header_lenient``): what is valid AMQP but
        outside our strict rules is let through and named in ``malformed``, and so is a
        header larger than ``frame_max`` (the reader lets those through up to
        ``MAX_INCOMING_CONTENT_HEADER``), which could not be published again as it is."""
        _class_id, body_size, props, malformed = _hot.decode_content_header_lenient(payload)
        size = len(payload) + FRAME_OVERHEAD
        if size > self.frame_max:
            too_large = (
                f"content header of {size} bytes is larger than frame_max ({self.frame_max}): "
                "it cannot be published again as it is"
            )
            malformed = too_large if malformed is None else f"{too_large}; {malformed}"
        return body_size, props, malformed

    def _on_channel_method(self, ch: _Channel, payload: bytes, events: list[Event]) -> None:
        mid = _U32.unpack_from(payload)[0]
        state = ch.state
        if state is ChannelState.OPEN:
            # Hot path first.
            if mid == BASIC_DELIVER:
                ch.content_fields = _hot.decode_deliver(payload)
                ch.content_kind = _DELIVER
                return
            if mid == BASIC_ACK:
                tag, multiple = _hot.decode_ack(payload)
                self._on_confirm(ch, tag, multiple, True, events)
                return
            if mid == BASIC_NACK:
                tag, multiple, _requeue = _hot.decode_nack(payload)
                self._on_confirm(ch, tag, multiple, False, events)
                return
            if mid == BASIC_RETURN:
                ch.content_fields = _hot.decode_return(payload)
                ch.content_kind = _RETURN
                return
            if mid == BASIC_GET_OK:
                self._complete_sync(ch, mid)
                ch.content_fields = _hot.decode_get_ok(payload)
                ch.content_kind = _GET_OK
                return
        elif state is ChannelState.CLOSING and mid not in (CHANNEL_CLOSE, CHANNEL_CLOSE_OK):
            # Drop everything but the close handshake, content frames included.
            if mid in (BASIC_DELIVER, BASIC_RETURN, BASIC_GET_OK):
                ch.content_kind = _DISCARD
            return
        handler = _CHANNEL_TRANSITIONS.get((state, mid))
        if handler is not None:
            handler(self, ch, decode_method(payload), events)
            return
        if state is ChannelState.OPEN and mid in _ALL_SYNC_REPLIES:
            self._complete_sync(ch, mid)
            method = decode_method(payload)
            if mid == CONFIRM_SELECT_OK:
                ch.confirm_mode = True
            events.append(MethodReply(channel_id=ch.id, method=method))
            return
        raise CommandInvalid(
            f"unexpected method {method_name(mid)} on channel {ch.id} in state {state.value}",
            class_id=mid >> 16,
            method_id=mid & 0xFFFF,
            remote=False,
        )

    def _complete_sync(self, ch: _Channel, mid: int) -> None:
        if ch.awaiting is None or mid not in ch.awaiting:
            raise CommandInvalid(
                f"reply {method_name(mid)} on channel {ch.id}, which awaits no such reply",
                class_id=mid >> 16,
                method_id=mid & 0xFFFF,
                remote=False,
            )
        ch.awaiting = None

    def _on_content_header(self, ch: _Channel, payload: bytes, events: list[Event]) -> None:
        if ch.content_kind == _NO_CONTENT or ch.properties is not None:
            raise UnexpectedFrame(f"content header on channel {ch.id} without a content method", remote=False)
        body_size, ch.properties, ch.malformed = self._header_rule(ch, payload)
        ch.body_size = body_size
        ch.body_received = 0
        if body_size == 0:
            self._complete_content(ch, b"", events)

    def _header_rule(self, ch: _Channel, payload: bytes) -> tuple[int, BasicProperties, str | None]:
        """``(body_size, properties, malformed)`` of a content header, or FrameError for a
        body larger than ``max_message_size``."""
        body_size, props, malformed = self._content_header(payload)
        if body_size > self._max_message:
            self._too_large(ch, body_size)
        return body_size, props, malformed

    def _too_large(self, ch: _Channel, body_size: int) -> NoReturn:
        raise FrameError(
            f"message body of {body_size} bytes on channel {ch.id} exceeds max_message_size="
            f"{self._max_message}",
            remote=False,
        )

    def _on_whole_delivery(
        self, channel_id: int, payload: bytes, head: bytes, body: bytes, events: list[Event]
    ) -> bool:
        """Basic.Deliver (``payload``), its content header and one body frame, arrived
        together: the content state machine's transitions for the three in one step, with
        the frame-by-frame rules (the header rule of ``_header_rule``, the body-length rule,
        ``_content_event``).
        ``False`` (nothing done) unless the channel is open and expects no content: the
        frames then go one by one and meet the error they deserve."""
        ch = self._channels.get(channel_id)
        if ch is None or ch.state is not ChannelState.OPEN or ch.content_kind != _NO_CONTENT:
            return False
        fields = _hot.decode_deliver(payload)
        body_size, props, malformed = self._content_header(head)
        if body_size > self._max_message:
            self._too_large(ch, body_size)
        if body_size == len(body) and body_size:
            # _content_event's Delivery, made here: the hot path
            events.append(
                Delivery(ch.id, fields[0], fields[1], fields[2], fields[3], fields[4], props, body, malformed)
            )
            return True
        # Not one whole body: the content goes on frame by frame from here.
        ch.content_kind = _DELIVER
        ch.content_fields = fields
        self._on_content_header(ch, head, events)
        self._on_content_body(ch, body, events)
        return True

    def _on_content_body(self, ch: _Channel, payload: bytes, events: list[Event]) -> None:
        if ch.properties is None:
            raise UnexpectedFrame(f"content body on channel {ch.id} without a content header", remote=False)
        received = ch.body_received + len(payload)
        if received > ch.body_size:
            raise FrameError(
                f"content body on channel {ch.id} longer than the {ch.body_size} bytes announced",
                remote=False,
            )
        if received == ch.body_size and not ch.body_parts:
            self._complete_content(ch, payload, events)
            return
        ch.body_parts.append(payload)
        ch.body_received = received
        if received == ch.body_size:
            body = b"".join(ch.body_parts)
            ch.body_parts = []
            self._complete_content(ch, body, events)

    def _complete_content(self, ch: _Channel, body: bytes, events: list[Event]) -> None:
        kind = ch.content_kind
        fields = ch.content_fields
        props = ch.properties
        assert props is not None
        malformed = ch.malformed
        ch.content_kind = _NO_CONTENT
        ch.properties = None
        ch.malformed = None
        ch.body_received = 0
        if kind == _DISCARD or ch.state is not ChannelState.OPEN:
            return  # the channel is closing: nobody can use (or settle) this message
        self._content_event(ch, kind, fields, props, body, malformed, events)

    def _content_event(
        self,
        ch: _Channel,
        kind: int,
        fields: tuple[Any, ...],
        props: BasicProperties,
        body: bytes,
        malformed: str | None,
        events: list[Event],
    ) -> None:
        """The event a complete content makes (a Return in confirm mode waits for its confirm)."""
        if kind == _DELIVER:
            events.append(
                Delivery(ch.id, fields[0], fields[1], fields[2], fields[3], fields[4], props, body, malformed)
            )
        elif kind == _GET_OK:
            events.append(
                GetOk(ch.id, fields[0], fields[1], fields[2], fields[3], fields[4], props, body, malformed)
            )
        else:
            returned = Returned(
                ch.id, fields[0], fields[1], fields[2], fields[3], props, body, malformed=malformed
            )
            if ch.confirm_mode:
                tag = self._match_return(ch, returned)
                if tag:
                    returned.publish_tag = tag
                    ch.returned[tag] = returned
                    return
            events.append(returned)

    def _match_return(self, ch: _Channel, returned: Returned) -> int:
        """The unconfirmed mandatory publish the broker returned.

        RabbitMQ sends Basic.Return before the confirm of the publish it returns, so that
        publish is still unconfirmed.  Exchange and routing key alone are ambiguous: a
        headers exchange routes on headers, and a queue may go away between two publishes
        with the same key while the first still waits for its confirm.  So the earliest
        candidate with the same body and properties wins, then the earliest with the same
        body, then the earliest with the same exchange and routing key.
        """
        same_key = same_body = 0
        for tag, (exchange, routing_key, body, properties) in ch.mandatory_pending.items():
            if exchange != returned.exchange or routing_key != returned.routing_key or tag in ch.returned:
                continue
            if body == returned.body:
                if (properties or EMPTY_PROPERTIES) == returned.properties:
                    return tag
                same_body = same_body or tag
            same_key = same_key or tag
        return same_body or same_key

    def _on_confirm(self, ch: _Channel, tag: int, multiple: bool, ack: bool, events: list[Event]) -> None:
        if not ch.confirm_mode:
            raise CommandInvalid(
                f"Basic.{'Ack' if ack else 'Nack'} on channel {ch.id}, which is not in confirm mode",
                class_id=60,
                method_id=80 if ack else 120,
                remote=False,
            )
        pending = ch.unconfirmed
        early = ch.early_acked
        tags: list[int]
        if multiple:
            tags = []
            while pending and pending[0] <= tag:
                t = pending.popleft()
                if t in early:
                    early.discard(t)
                else:
                    tags.append(t)
        elif pending and pending[0] == tag:
            pending.popleft()
            tags = [tag]
            while pending and pending[0] in early:
                early.discard(pending.popleft())
        else:
            if not pending or tag < pending[0] or tag >= ch.next_publish_tag or tag in early:
                raise CommandInvalid(
                    f"confirm for unknown publish tag {tag} on channel {ch.id}",
                    class_id=60,
                    method_id=80 if ack else 120,
                    remote=False,
                )
            early.add(tag)
            tags = [tag]
        if not tags:
            return
        returned: dict[int, Returned] | None = None
        if ch.mandatory_pending:
            mp = ch.mandatory_pending
            for t in tags:
                if mp.pop(t, None) is not None and ch.returned:
                    r = ch.returned.pop(t, None)
                    if r is not None:
                        if returned is None:
                            returned = {}
                        returned[t] = r
        events.append(Confirmed(ch.id, tags, ack, returned))

    def _ch_open_ok(self, ch: _Channel, method: Any, events: list[Event]) -> None:
        ch.state = ChannelState.OPEN
        events.append(ChannelOpened(channel_id=ch.id))

    def _ch_close(self, ch: _Channel, method: Any, events: list[Event]) -> None:
        err = channel_error_for(
            method.reply_code or 0,
            method.reply_text or "",
            method.class_id or 0,
            method.method_id or 0,
            channel_id=ch.id,
        )
        self._out += encode_method_frame(ch.id, commands.Channel.CloseOk())
        self._release(ch)
        events.append(ChannelClosed(channel_id=ch.id, error=err))

    def _ch_close_while_closing(self, ch: _Channel, method: Any, events: list[Event]) -> None:
        # Both sides closed at once: answer, and consider our close complete.  The broker
        # still answers our Close with a Close-Ok, so the id stays reserved (state
        # CLOSING, ``crossed``) until that arrives; it is then released without an event.
        self._out += encode_method_frame(ch.id, commands.Channel.CloseOk())
        ch.crossed = True
        events.append(ChannelCloseOk(channel_id=ch.id))

    def _ch_close_ok(self, ch: _Channel, method: Any, events: list[Event]) -> None:
        crossed = ch.crossed
        self._release(ch)
        if not crossed:
            events.append(ChannelCloseOk(channel_id=ch.id))

    def _ch_flow(self, ch: _Channel, method: Any, events: list[Event]) -> None:
        self._out += encode_method_frame(ch.id, commands.Channel.FlowOk(active=method.active))
        events.append(ChannelFlow(channel_id=ch.id, active=bool(method.active)))

    def _ch_server_cancel(self, ch: _Channel, method: Any, events: list[Event]) -> None:
        if not method.nowait:
            self._out += encode_method_frame(ch.id, commands.Basic.CancelOk(consumer_tag=method.consumer_tag))
        events.append(ConsumerCancelled(channel_id=ch.id, consumer_tag=method.consumer_tag))

    def _release(self, ch: _Channel) -> None:
        ch.state = ChannelState.CLOSED
        self._channels.pop(ch.id, None)


# ---------------------------------------------------------------------------
# The state tables: (state, incoming method id) -> the handler itself (a typo is a mypy
# error, not a run-time one).

_ConnectionHandler = Callable[["AMQPConnection", Any, list[Event]], None]
_ChannelHandler = Callable[["AMQPConnection", "_Channel", Any, list[Event]], None]

_CS = ConnectionState
#: (state, incoming channel-0 method) -> handler.  Anything else is COMMAND_INVALID.
_CONNECTION_TRANSITIONS: dict[tuple[ConnectionState, int], _ConnectionHandler] = {
    (_CS.AWAIT_START, CONNECTION_START): AMQPConnection._on_start,
    (_CS.AWAIT_START, CONNECTION_CLOSE): AMQPConnection._on_close,
    (_CS.AWAIT_TUNE, CONNECTION_SECURE): AMQPConnection._on_secure,
    (_CS.AWAIT_TUNE, CONNECTION_TUNE): AMQPConnection._on_tune,
    (_CS.AWAIT_TUNE, CONNECTION_CLOSE): AMQPConnection._on_close,
    (_CS.AWAIT_OPEN_OK, CONNECTION_OPEN_OK): AMQPConnection._on_open_ok,
    (_CS.AWAIT_OPEN_OK, CONNECTION_CLOSE): AMQPConnection._on_close,
    (_CS.OPEN, CONNECTION_CLOSE): AMQPConnection._on_close,
    (_CS.OPEN, CONNECTION_BLOCKED): AMQPConnection._on_blocked,
    (_CS.OPEN, CONNECTION_UNBLOCKED): AMQPConnection._on_unblocked,
    (_CS.CLOSING, CONNECTION_CLOSE): AMQPConnection._on_close_while_closing,
    (_CS.CLOSING, CONNECTION_CLOSE_OK): AMQPConnection._on_close_ok,
    # While closing, the broker may still be sending; those frames are dropped.
    (_CS.CLOSING, CONNECTION_BLOCKED): AMQPConnection._ignore,
    (_CS.CLOSING, CONNECTION_UNBLOCKED): AMQPConnection._ignore,
}

_CH = ChannelState
#: (channel state, incoming method) -> handler, for the methods with special
#: meaning.  Sync replies and content methods are routed by ``_on_channel_method``.
_CHANNEL_TRANSITIONS: dict[tuple[ChannelState, int], _ChannelHandler] = {
    (_CH.OPENING, CHANNEL_OPEN_OK): AMQPConnection._ch_open_ok,
    (_CH.OPENING, CHANNEL_CLOSE): AMQPConnection._ch_close,
    (_CH.OPEN, CHANNEL_CLOSE): AMQPConnection._ch_close,
    (_CH.OPEN, CHANNEL_FLOW): AMQPConnection._ch_flow,
    (_CH.OPEN, BASIC_CANCEL): AMQPConnection._ch_server_cancel,
    (_CH.CLOSING, CHANNEL_CLOSE_OK): AMQPConnection._ch_close_ok,
    (_CH.CLOSING, CHANNEL_CLOSE): AMQPConnection._ch_close_while_closing,
}


def _as_text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes | bytearray) else value


_START_OK_PREFIX = struct.pack(">HH", 10, 11)


def _encode_start_ok(
    client_properties: Mapping[str, Any], mechanism: str, response: bytes, locale: str
) -> bytes:
    """Connection.Start-Ok, written by hand because its response is binary for AMQPLAIN."""
    mech = mechanism.encode()
    loc = locale.encode()
    payload = b"".join(
        (
            _START_OK_PREFIX,
            encode_table(client_properties),
            bytes((len(mech),)),
            mech,
            struct.pack(">I", len(response)),
            response,
            bytes((len(loc),)),
            loc,
        )
    )
    return struct.pack(">BHI", FRAME_METHOD, 0, len(payload)) + payload + b"\xce"
