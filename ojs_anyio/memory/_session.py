"""The broker's side of one connection: decode the client's frames (ojs_codec, pamqp's method
table), apply them to the broker state, and answer with real AMQP 0-9-1 frames.

Everything here is synchronous: the client's ``send()`` hands bytes to :meth:`Session.feed`,
which runs the methods and appends the answers to :attr:`Session.out`, which the client's
``receive()`` drains.  A protocol violation closes this connection only; an unexpected
exception in the broker closes it with 541 INTERNAL_ERROR and is logged.
"""

from __future__ import annotations

import logging
import secrets
import struct
from typing import TYPE_CHECKING, Any

from pamqp import commands

from ojs_codec import (
    BASIC_ACK,
    BASIC_DELIVER,
    BASIC_PUBLISH,
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    AMQPError,
    BasicProperties,
    FrameReader,
    Int64,
    decode_content_header,
    decode_method,
    encode_ack,
    encode_method_frame_unvalidated,
    encode_nack,
    encode_properties,
)

from ._model import (
    ACCESS_REFUSED,
    CHANNEL_ERROR,
    COMMAND_INVALID,
    CONNECTION_FORCED,
    INTERNAL_ERROR,
    NO_ROUTE,
    NOT_ALLOWED,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    SYNTAX_ERROR,
    UNEXPECTED_FRAME,
    AMQPFail,
    Consumer,
    Message,
    Queue,
    State,
    VHost,
)

if TYPE_CHECKING:
    pass

__all__ = ["ChannelState", "Session"]

log = logging.getLogger("ojs_anyio.memory")

_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_FRAME_HDR = struct.Struct(">BHI")
_TAG = struct.Struct(">Q")
_END = b"\xce"
_DELIVER_ID = _U32.pack(BASIC_DELIVER)

#: Deliveries pause while this many bytes wait for the client to read them (the emulation
#: of TCP back-pressure); replies to the client's own methods are always queued.
HIGH_WATER = 1 << 20
#: A client that stops reading altogether loses its connection past this bound.
HARD_LIMIT = 64 << 20
#: RabbitMQ 3.10's default max_message_size.
MAX_MESSAGE_SIZE = 128 * 1024 * 1024
CHANNEL_MAX = 2047
FRAME_MAX = 131072
HEARTBEAT = 60

SERVER_PROPERTIES: dict[str, Any] = {
    # The client must not be able to tell (docs/testing.md): RabbitMQ's product name, and the
    # truth in "information" and "platform".
    "product": "RabbitMQ",
    "version": "3.10.0",
    "platform": "ojs-anyio memory:// (Python)",
    "information": "ojs_anyio.memory: an in-process emulation of RabbitMQ 3.10 for development and tests",
    "capabilities": {
        "publisher_confirms": True,
        "exchange_exchange_bindings": True,
        "basic.nack": True,
        "consumer_cancel_notify": True,
        "connection.blocked": True,
        "consumer_priorities": True,
        "authentication_failure_close": True,
        "per_consumer_qos": True,
        "direct_reply_to": True,
    },
    "cluster_name": "memory",
}


def method_frame(channel: int, cls: Any, **fields: Any) -> bytes:
    """A method frame from a pamqp command class and field values (no pamqp validation:
    RabbitMQ's names are any UTF-8, pamqp's regexes are narrower)."""
    return encode_method_frame_unvalidated(channel, cls, fields)


def _short(text: str) -> bytes:
    raw = text.encode()
    return bytes((len(raw),)) + raw


class _Content:
    """A publish whose header/body frames are still arriving."""

    __slots__ = ("body", "exchange", "header", "immediate", "mandatory", "props", "routing_key", "size")

    def __init__(self, exchange: str, routing_key: str, mandatory: bool, immediate: bool) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.mandatory = mandatory
        self.immediate = immediate
        self.header: bytes | None = None
        self.props: BasicProperties | None = None
        self.size = 0
        self.body: list[bytes] = []


class ChannelState:
    def __init__(self, session: Session, channel_id: int) -> None:
        self.session = session
        self.id = channel_id
        self.closing = False
        self.confirm = False
        self.tx = False
        self.publish_seq = 0
        self.ack_upto = 0  # confirms not yet written: ack everything up to here
        self.ack_count = 0
        self.next_tag = 0
        self.unacked: dict[int, tuple[Message, Queue, Consumer | None]] = {}
        self.unacked_count = 0
        self.consumers: dict[str, Consumer] = {}
        self.prefetch = 0
        self.global_prefetch = 0
        self.content: _Content | None = None
        self.last_queue = ""
        self.reply_token: str | None = None  # direct reply-to consumer of this channel
        self.reply_tag = ""
        self.tx_publishes: list[tuple[str, str, bool, Message]] = []
        self.tx_settles: list[tuple[str, int, bool, bool]] = []

    # ---------------------------------------------------------------- called by the model

    def deliver(self, consumer: Consumer, msg: Message) -> None:
        self.next_tag += 1
        tag = self.next_tag
        q = consumer.queue
        if not consumer.no_ack:
            self.unacked[tag] = (msg, q, consumer)
            consumer.unacked += 1
            self.unacked_count += 1
        if q.kind == "quorum" and msg.delivery_count:
            msg = _with_delivery_count(msg)
        payload = b"".join(
            (
                _DELIVER_ID,
                _short(consumer.tag),
                _TAG.pack(tag),
                b"\x01" if msg.redelivered else b"\x00",
                _short(msg.exchange),
                _short(msg.routing_key),
            )
        )
        s = self.session
        out = s.out
        out += _FRAME_HDR.pack(FRAME_METHOD, self.id, len(payload))
        out += payload
        out += _END
        s.write_content(self.id, msg)

    def deliver_direct(self, msg: Message) -> None:
        """Direct reply-to: a reply goes straight to the channel's pseudo-consumer (no ack)."""
        self.next_tag += 1
        s = self.session
        s.out += method_frame(
            self.id,
            commands.Basic.Deliver,
            consumer_tag=self.reply_tag,
            delivery_tag=self.next_tag,
            redelivered=False,
            exchange=msg.exchange,
            routing_key=msg.routing_key,
        )
        s.write_content(self.id, msg)

    def broker_cancel(self, consumer: Consumer) -> None:
        """The queue is gone: tell the client (consumer_cancel_notify)."""
        if self.consumers.pop(consumer.tag, None) is not None and not self.closing:
            self.session.write(
                method_frame(self.id, commands.Basic.Cancel, consumer_tag=consumer.tag, nowait=True)
            )


def _with_delivery_count(msg: Message) -> Message:
    headers = dict(msg.props.headers or {})
    headers["x-delivery-count"] = Int64(msg.delivery_count)  # int64 ('l'), as RabbitMQ writes it
    import msgspec

    new = msg.with_props(msgspec.structs.replace(msg.props, headers=headers))
    new.redelivered = msg.redelivered
    return new


class Session:
    """One client connection's broker side."""

    def __init__(self, state: State, *, name: str) -> None:
        self.state = state
        self.name = name
        self.out = bytearray()
        self.writable = True
        self.eof = False  # the broker closed the socket (after Close-Ok)
        self.aborted = False  # broken without a handshake (bound exceeded)
        self.lost = False  # the client side closed
        self._stage = "header"
        self._head = b""
        self._reader = FrameReader(FRAME_MAX)
        self.frame_max = FRAME_MAX
        self.channel_max = CHANNEL_MAX
        self.heartbeat = 0
        self.channels: dict[int, ChannelState] = {}
        self.vhost: VHost | None = None
        self.user = ""
        self.client_properties: dict[str, Any] = {}
        self.on_write: Any = None  # set by the stream: wakes its reader
        self._throttled = False

    def __repr__(self) -> str:
        return f"<memory session {self.name} {self._stage}>"

    # ---------------------------------------------------------------- output

    def write(self, data: bytes) -> None:
        self.out += data
        self._after_write()

    def _after_write(self) -> None:
        size = len(self.out)
        if size >= HIGH_WATER:
            self.writable = False
            self._throttled = True
            if size > HARD_LIMIT:
                log.error("memory broker: %s stopped reading (%d bytes pending); dropping it", self, size)
                self.abort()
        if self.on_write is not None:
            self.on_write()

    def write_content(self, channel: int, msg: Message) -> None:
        out = self.out
        header = msg.header
        out += _FRAME_HDR.pack(FRAME_HEADER, channel, len(header))
        out += header
        out += _END
        body = msg.body
        chunk = self.frame_max - 8
        if len(body) <= chunk:
            if body:
                out += _FRAME_HDR.pack(FRAME_BODY, channel, len(body))
                out += body
                out += _END
        else:
            view = memoryview(body)
            for start in range(0, len(body), chunk):
                piece = view[start : start + chunk]
                out += _FRAME_HDR.pack(FRAME_BODY, channel, len(piece))
                out += piece
                out += _END
        self._after_write()

    def drained(self) -> None:
        """The client read; resume deliveries paused by back-pressure."""
        if self._throttled and len(self.out) < HIGH_WATER // 2:
            self._throttled = False
            self.writable = True
            now = self.state.clock.now()
            queues = {id(c.queue): c.queue for ch in self.channels.values() for c in ch.consumers.values()}
            for q in queues.values():
                self.state.dispatch(q, now)

    def force_close(self, explanation: str) -> None:
        """Close the connection from the broker's side (320 CONNECTION_FORCED)."""
        self._connection_error(320, f"CONNECTION_FORCED - {explanation}", 0, 0)

    def abort(self) -> None:
        self.aborted = True
        self.writable = False
        self._cleanup()

    # ---------------------------------------------------------------- input

    def feed(self, data: bytes) -> None:
        if self._stage in ("closed",) or self.aborted or self.lost:
            return
        state = self.state
        state.activity += 1
        deadline = state.next_deadline()
        if deadline is not None and deadline <= state.clock.now():
            state.run_due()
        try:
            self._feed(data)
        except AMQPFail as exc:
            self._connection_error(exc.code, exc.text, 0, 0)
        except AMQPError as exc:  # the codec found a malformed frame
            code = getattr(exc, "code", SYNTAX_ERROR) or SYNTAX_ERROR
            text = getattr(exc, "reply_text", str(exc))
            self._connection_error(code, str(text), 0, 0)
        except Exception as exc:  # a bug in the broker: this connection only
            log.exception("memory broker: internal error on %s", self)
            self._connection_error(INTERNAL_ERROR, f"INTERNAL_ERROR - {exc!r}", 0, 0)
        self._flush_confirms()

    def _feed(self, data: bytes) -> None:
        if self._stage == "header":
            self._head += data
            if len(self._head) < 8:
                return
            head, rest = self._head[:8], self._head[8:]
            self._head = b""
            if head != PROTOCOL_HEADER:
                self.out += PROTOCOL_HEADER
                self.eof = True
                self._stage = "closed"
                self._after_write()
                return
            self._stage = "start-ok"
            self.write(
                method_frame(
                    0,
                    commands.Connection.Start,
                    version_major=0,
                    version_minor=9,
                    server_properties=SERVER_PROPERTIES,
                    mechanisms="PLAIN",
                    locales="en_US",
                )
            )
            data = rest
            if not data:
                return
        reader = self._reader
        # Whole frames at once (the codec's C splitter when built).  On a malformed frame
        # this raises before any frame of ``data`` runs: the connection closes either way.
        for frame_type, channel, payload in reader.frames(data):
            if self._stage == "closed" or self.aborted:
                return
            if frame_type == FRAME_METHOD:
                self._on_method(channel, payload)
            elif frame_type == FRAME_HEARTBEAT:
                # RabbitMQ sends its own heartbeats on a timer; we answer the client's, so an
                # idle connection never looks dead to it (and need no timer task).
                if self._stage == "running":
                    self.write(HEARTBEAT_FRAME)
                continue
            else:
                self._on_content(frame_type, channel, payload)

    # ---------------------------------------------------------------- connection level

    def _connection_error(self, code: int, text: str, class_id: int, method_id: int) -> None:
        if self._stage in ("closing", "closed"):
            return
        self._stage = "closing"
        self.write(
            method_frame(
                0,
                commands.Connection.Close,
                reply_code=code,
                reply_text=_reply_text(code, text),
                class_id=class_id,
                method_id=method_id,
            )
        )
        self._cleanup()

    def _on_connection_method(self, method: Any) -> None:
        name = method.name
        stage = self._stage
        if stage == "closing":
            if name == "Connection.CloseOk" or name == "Connection.Close":
                if name == "Connection.Close":
                    self.write(method_frame(0, commands.Connection.CloseOk))
                self._stage = "closed"
                self.eof = True
                self._after_write()
            return
        if name == "Connection.StartOk" and stage == "start-ok":
            self._start_ok(method)
        elif name == "Connection.TuneOk" and stage == "tune-ok":
            self.heartbeat = method.heartbeat
            self.channel_max = method.channel_max or CHANNEL_MAX
            if method.frame_max:
                self.frame_max = method.frame_max
                self._reader.frame_max = method.frame_max
            self._stage = "open"
        elif name == "Connection.Open" and stage == "open":
            vhost = self.state.vhost(method.virtual_host)
            if vhost is None:
                raise AMQPFail(NOT_ALLOWED, f"vhost {method.virtual_host} not found")
            self.vhost = vhost
            self._stage = "running"
            self.write(method_frame(0, commands.Connection.OpenOk))
        elif name == "Connection.Close" and stage == "running":
            self._cleanup()
            self.write(method_frame(0, commands.Connection.CloseOk))
            self._stage = "closed"
            self.eof = True
            self._after_write()
        elif name == "Connection.Close":
            self._stage = "closed"
            self.eof = True
            self._after_write()
        elif name in ("Connection.Blocked", "Connection.Unblocked", "Connection.UpdateSecret"):
            raise AMQPFail(NOT_IMPLEMENTED, f"{name} is not supported by memory://")
        else:
            raise AMQPFail(COMMAND_INVALID, f"unexpected {name} in state {stage}")

    def _start_ok(self, method: Any) -> None:
        mechanism = method.mechanism
        response = method.response
        if isinstance(response, str):
            response = response.encode()
        self.client_properties = dict(method.client_properties or {})
        if mechanism != "PLAIN":
            raise AMQPFail(ACCESS_REFUSED, f"unsupported authentication mechanism '{mechanism}'")
        parts = bytes(response).split(b"\x00")
        user = parts[1].decode(errors="replace") if len(parts) == 3 else ""
        password = parts[2].decode(errors="replace") if len(parts) == 3 else ""
        if self.state.users.get(user) != password:
            # authentication_failure_close: Connection.Close 403 instead of a dropped socket
            raise AMQPFail(
                ACCESS_REFUSED,
                "Login was refused using authentication mechanism PLAIN. For details see the broker logfile.",
            )
        self.user = user
        self._stage = "tune-ok"
        self.write(
            method_frame(
                0, commands.Connection.Tune, channel_max=CHANNEL_MAX, frame_max=FRAME_MAX, heartbeat=HEARTBEAT
            )
        )

    # ---------------------------------------------------------------- frames

    def _on_method(self, channel: int, payload: bytes) -> None:
        if channel == 0:
            self._on_connection_method(decode_method(payload))
            return
        if self._stage != "running":
            if self._stage == "closing":
                return  # RabbitMQ discards everything but Close/Close-Ok now
            raise AMQPFail(CHANNEL_ERROR, f"channel {channel} used before the connection was open")
        ch = self.channels.get(channel)
        index = _U32.unpack_from(payload, 0)[0] if len(payload) >= 4 else 0
        if ch is None:
            method = decode_method(payload)
            if method.name != "Channel.Open":
                raise AMQPFail(CHANNEL_ERROR, f"expected 'channel.open' on channel {channel}")
            if channel > self.channel_max:
                raise AMQPFail(NOT_ALLOWED, f"channel {channel} is above channel_max {self.channel_max}")
            self.channels[channel] = ChannelState(self, channel)
            self.write(method_frame(channel, commands.Channel.OpenOk))
            return
        if ch.closing:
            name = decode_method(payload).name
            if name == "Channel.CloseOk":
                del self.channels[channel]
            elif name == "Channel.Close":
                del self.channels[channel]
                self.write(method_frame(channel, commands.Channel.CloseOk))
            return
        if ch.content is not None:
            raise AMQPFail(
                UNEXPECTED_FRAME,
                "expected content header for class 60, got non content header frame instead "
                f"(channel {channel})",
            )
        if index == BASIC_PUBLISH:
            self._publish_method(ch, payload)
            return
        if index == BASIC_ACK and len(payload) == 13:
            tag = _TAG.unpack_from(payload, 4)[0]
            self._settle(ch, "ack", tag, bool(payload[12] & 1), False)
            return
        method = decode_method(payload)
        try:
            self._channel_method(ch, method)
        except AMQPFail as exc:
            if exc.connection_level:
                self._connection_error(exc.code, exc.text, index >> 16, index & 0xFFFF)
            else:
                self._channel_error(ch, exc.code, exc.text, index >> 16, index & 0xFFFF)

    def _channel_error(self, ch: ChannelState, code: int, text: str, class_id: int, method_id: int) -> None:
        self._flush_channel_confirms(ch)
        self._close_channel(ch)
        ch.closing = True
        self.write(
            method_frame(
                ch.id,
                commands.Channel.Close,
                reply_code=code,
                reply_text=_reply_text(code, text),
                class_id=class_id,
                method_id=method_id,
            )
        )

    def _publish_method(self, ch: ChannelState, payload: bytes) -> None:
        try:
            pos = 6
            n = payload[pos]
            exchange = payload[pos + 1 : pos + 1 + n].decode()
            pos += 1 + n
            n = payload[pos]
            routing_key = payload[pos + 1 : pos + 1 + n].decode()
            pos += 1 + n
            bits = payload[pos]
            if pos + 1 != len(payload):
                raise ValueError("trailing bytes")
        except (IndexError, UnicodeDecodeError, ValueError):
            raise AMQPFail(SYNTAX_ERROR, "Basic.Publish is malformed") from None
        if bits & 2:
            raise AMQPFail(NOT_IMPLEMENTED, "immediate=true")
        ch.content = _Content(exchange, routing_key, bool(bits & 1), False)

    def _on_content(self, frame_type: int, channel: int, payload: bytes) -> None:
        if self._stage != "running":
            if self._stage == "closing":
                return
            raise AMQPFail(UNEXPECTED_FRAME, "content frame before the connection was open")
        ch = self.channels.get(channel)
        if ch is None:
            raise AMQPFail(CHANNEL_ERROR, f"expected 'channel.open' on channel {channel}")
        if ch.closing:
            return
        content = ch.content
        if content is None:
            raise AMQPFail(UNEXPECTED_FRAME, f"unexpected content frame on channel {channel}")
        if frame_type == FRAME_HEADER:
            if content.header is not None:
                raise AMQPFail(UNEXPECTED_FRAME, f"a second content header on channel {channel}")
            class_id, size, props = decode_content_header(payload)
            if class_id != 60:
                raise AMQPFail(UNEXPECTED_FRAME, f"content header for class {class_id}, expected 60")
            content.header = payload
            content.props = props
            content.size = size
            if size > MAX_MESSAGE_SIZE:
                ch.content = None
                self._channel_error(
                    ch,
                    PRECONDITION_FAILED,
                    f"message size {size} is larger than configured max size {MAX_MESSAGE_SIZE}",
                    60,
                    40,
                )
                return
        else:
            if content.header is None:
                raise AMQPFail(UNEXPECTED_FRAME, f"expected content header on channel {channel}, got a body")
            content.body.append(payload)
        received = sum(len(p) for p in content.body) if len(content.body) != 1 else len(content.body[0])
        if received > content.size:
            raise AMQPFail(FRAME_ERROR_CODE, f"body of {received} bytes exceeds the declared {content.size}")
        if received == content.size:
            ch.content = None
            body = content.body[0] if len(content.body) == 1 else b"".join(content.body)
            assert content.header is not None and content.props is not None
            try:
                self._published(ch, content, body)
            except AMQPFail as exc:
                if exc.connection_level:
                    self._connection_error(exc.code, exc.text, 60, 40)
                else:
                    self._channel_error(ch, exc.code, exc.text, 60, 40)

    # ---------------------------------------------------------------- publishing

    def _published(self, ch: ChannelState, content: _Content, body: bytes) -> None:
        assert self.vhost is not None and content.props is not None and content.header is not None
        vhost = self.vhost
        x = vhost.exchanges.get(content.exchange)
        if x is None:
            raise AMQPFail(404, f"no exchange '{content.exchange}' in vhost '{vhost.name}'")
        if x.internal:
            raise AMQPFail(
                ACCESS_REFUSED, f"cannot publish to internal exchange '{x.name}' in vhost '{vhost.name}'"
            )
        props = content.props
        if props.user_id is not None and props.user_id != self.user:
            raise AMQPFail(
                PRECONDITION_FAILED,
                f"user_id property set to '{props.user_id}' but authenticated user was '{self.user}'",
            )
        msg = Message(body, content.header, props, content.exchange, content.routing_key)
        if props.reply_to == REPLY_TO:
            if ch.reply_token is None:
                raise AMQPFail(PRECONDITION_FAILED, "fast reply consumer does not exist")
            import msgspec

            msg = msg.with_props(msgspec.structs.replace(props, reply_to=f"{REPLY_TO}.{ch.reply_token}"))
            msg.exchange, msg.routing_key = content.exchange, content.routing_key
        if ch.tx:
            ch.tx_publishes.append((content.exchange, content.routing_key, content.mandatory, msg))
            return
        self._route(ch, x.name, content.mandatory, msg)

    def _route(self, ch: ChannelState, exchange: str, mandatory: bool, msg: Message) -> None:
        state = self.state
        assert self.vhost is not None
        if state.publish_faults:
            fault = state.take_fault(self.vhost.name, exchange, msg.routing_key)
            if fault is not None and fault.action == "close":
                raise AMQPFail(CONNECTION_FORCED, "fault injected: closed before the confirm")
            if fault is not None:  # "nack": not enqueued, refused as a quorum queue without a leader does
                if ch.confirm:
                    ch.publish_seq += 1
                    self._flush_channel_confirms(ch)
                    self.out += encode_nack(ch.id, ch.publish_seq, False, False)
                    self._after_write()
                return
        x = self.vhost.exchanges.get(exchange)
        queues = state.route(self.vhost, x, msg) if x is not None else []
        if ch.confirm:
            ch.publish_seq += 1
        rejected = False
        direct = None
        if exchange == "" and msg.routing_key.startswith(REPLY_TO + "."):
            direct = state.reply_to.get(msg.routing_key[len(REPLY_TO) + 1 :])
            if direct is not None:
                direct.deliver_direct(msg)
        if not queues and direct is None:
            if mandatory:
                self.write(
                    method_frame(
                        ch.id,
                        commands.Basic.Return,
                        reply_code=NO_ROUTE,
                        reply_text="NO_ROUTE",
                        exchange=exchange,
                        routing_key=msg.routing_key,
                    )
                )
                self.write_content(ch.id, msg)
        else:
            now = state.clock.now()
            if msg.props.headers and "BCC" in msg.props.headers:
                headers = dict(msg.props.headers)
                del headers["BCC"]
                import msgspec

                stripped = msg.with_props(msgspec.structs.replace(msg.props, headers=headers))
                stripped.exchange, stripped.routing_key = msg.exchange, msg.routing_key
                msg = stripped
            last = len(queues) - 1
            for i, q in enumerate(queues):
                m = msg if i == last else msg.copy()
                for hook in state.publish_hooks:
                    hook(self.vhost.name, q, m)
                if not state.enqueue(q, m, now):
                    rejected = True
        if ch.confirm:
            if rejected:
                self._flush_channel_confirms(ch)
                self.out += encode_nack(ch.id, ch.publish_seq, False, False)
                self._after_write()
            else:
                ch.ack_upto = ch.publish_seq
                ch.ack_count += 1

    def _flush_channel_confirms(self, ch: ChannelState) -> None:
        if ch.ack_count:
            self.out += encode_ack(ch.id, ch.ack_upto, ch.ack_count > 1)
            ch.ack_count = 0
            self._after_write()

    def _flush_confirms(self) -> None:
        for ch in self.channels.values():
            if ch.ack_count:
                self._flush_channel_confirms(ch)

    # ---------------------------------------------------------------- settling

    def _settle(self, ch: ChannelState, kind: str, tag: int, multiple: bool, requeue: bool) -> None:
        if ch.tx:
            ch.tx_settles.append((kind, tag, multiple, requeue))
            return
        try:
            self._apply_settle(ch, kind, tag, multiple, requeue)
        except AMQPFail as exc:
            method_id = {"ack": 80, "reject": 90, "nack": 120}[kind]
            self._channel_error(ch, exc.code, exc.text, 60, method_id)

    def _take(
        self, ch: ChannelState, tag: int, multiple: bool
    ) -> list[tuple[Message, Queue, Consumer | None]]:
        unacked = ch.unacked
        if not multiple:
            entry = unacked.pop(tag, None)
            if entry is None:
                raise AMQPFail(PRECONDITION_FAILED, f"unknown delivery tag {tag}")
            return [entry]
        if tag == 0:
            taken = list(unacked.values())
            unacked.clear()
            return taken
        keys = []
        for key in unacked:
            if key > tag:
                break
            keys.append(key)
        if not keys and tag not in unacked:
            raise AMQPFail(PRECONDITION_FAILED, f"unknown delivery tag {tag}")
        return [unacked.pop(key) for key in keys]

    def _apply_settle(self, ch: ChannelState, kind: str, tag: int, multiple: bool, requeue: bool) -> None:
        entries = self._take(ch, tag, multiple)
        ch.unacked_count -= len(entries)
        state = self.state
        now = state.clock.now()
        freed: dict[int, Queue] = {}
        back: dict[int, tuple[Queue, list[Message]]] = {}
        for msg, q, consumer in entries:
            if consumer is not None:
                consumer.unacked -= 1
                freed[id(consumer.queue)] = consumer.queue
            if kind == "ack":
                continue
            if requeue:
                back.setdefault(id(q), (q, []))[1].append(msg)
            elif not q.deleted:
                state.dead_letter(q, msg, "rejected", now)
        for q, msgs in back.values():
            state.requeue(q, msgs, now)
        if ch.global_prefetch:
            for c in ch.consumers.values():
                freed[id(c.queue)] = c.queue
        for q in freed.values():
            state.dispatch(q, now)

    def _requeue_all(self, ch: ChannelState) -> None:
        if not ch.unacked:
            return
        entries = list(ch.unacked.values())
        ch.unacked.clear()
        ch.unacked_count = 0
        back: dict[int, tuple[Queue, list[Message]]] = {}
        for msg, q, consumer in entries:
            if consumer is not None:
                consumer.unacked -= 1
            back.setdefault(id(q), (q, []))[1].append(msg)
        now = self.state.clock.now()
        for q, msgs in back.values():
            self.state.requeue(q, msgs, now)

    # ---------------------------------------------------------------- teardown

    def _close_channel(self, ch: ChannelState) -> None:
        """Cancel the channel's consumers, then return its unacked messages."""
        ch.content = None
        if ch.reply_token is not None:
            self.state.reply_to.pop(ch.reply_token, None)
            ch.reply_token = None
        ch.tx_publishes.clear()
        ch.tx_settles.clear()
        now = self.state.clock.now()
        consumers = list(ch.consumers.values())
        ch.consumers.clear()
        ch.closing = True
        for c in consumers:
            self.state.remove_consumer(c, now)
        self._requeue_all(ch)

    def _cleanup(self) -> None:
        for ch in list(self.channels.values()):
            if not ch.closing:
                self._close_channel(ch)
        if self.vhost is not None:
            now = self.state.clock.now()
            for q in [q for q in self.vhost.queues.values() if q.owner is self]:
                self.state.delete_queue(q, now)

    def connection_lost(self) -> None:
        """The client closed its end."""
        if self.lost:
            return
        self.lost = True
        self.writable = False
        if self._stage != "closed":
            self._stage = "closed"
        self._cleanup()
        self.channels.clear()
        self.out.clear()

    # ---------------------------------------------------------------- channel methods

    def _queue_name(self, ch: ChannelState, name: str) -> str:
        if name:
            return name
        if not ch.last_queue:
            raise AMQPFail(NOT_FOUND, "no previously declared queue")
        return ch.last_queue

    def _channel_method(self, ch: ChannelState, m: Any) -> None:
        handler = _HANDLERS.get(m.name)
        if handler is None:
            raise AMQPFail(COMMAND_INVALID, f"unexpected method {m.name}")
        handler(self, ch, m)

    def _h_channel_close(self, ch: ChannelState, m: Any) -> None:
        self._flush_channel_confirms(ch)
        self._close_channel(ch)
        del self.channels[ch.id]
        self.write(method_frame(ch.id, commands.Channel.CloseOk))

    def _h_channel_flow(self, ch: ChannelState, m: Any) -> None:
        if not m.active:
            raise AMQPFail(NOT_IMPLEMENTED, "active=false")  # as RabbitMQ: no client-side flow
        self.write(method_frame(ch.id, commands.Channel.FlowOk, active=m.active))

    def _h_channel_close_ok(self, ch: ChannelState, m: Any) -> None:
        pass

    def _reply(self, ch: ChannelState, m: Any, cls: Any, **fields: Any) -> None:
        if not getattr(m, "nowait", False):
            self.write(method_frame(ch.id, cls, **fields))

    def _h_exchange_declare(self, ch: ChannelState, m: Any) -> None:
        assert self.vhost is not None
        self.state.declare_exchange(
            self.vhost,
            m.exchange,
            m.exchange_type,
            passive=m.passive,
            durable=m.durable,
            auto_delete=m.auto_delete,
            internal=m.internal,
            arguments=dict(m.arguments or {}),
        )
        self._reply(ch, m, commands.Exchange.DeclareOk)

    def _h_exchange_delete(self, ch: ChannelState, m: Any) -> None:
        assert self.vhost is not None
        self.state.delete_exchange(self.vhost, m.exchange, if_unused=m.if_unused)
        self._reply(ch, m, commands.Exchange.DeleteOk)

    def _h_exchange_bind(self, ch: ChannelState, m: Any) -> None:
        assert self.vhost is not None
        self.state.bind(self.vhost, m.source, False, m.destination, m.routing_key, dict(m.arguments or {}))
        self._reply(ch, m, commands.Exchange.BindOk)

    def _h_exchange_unbind(self, ch: ChannelState, m: Any) -> None:
        assert self.vhost is not None
        self.state.unbind(self.vhost, m.source, False, m.destination, m.routing_key, dict(m.arguments or {}))
        self._reply(ch, m, commands.Exchange.UnbindOk)

    def _h_queue_declare(self, ch: ChannelState, m: Any) -> None:
        assert self.vhost is not None
        q = self.state.declare_queue(
            self.vhost,
            m.queue,
            self,
            passive=m.passive,
            durable=m.durable,
            exclusive=m.exclusive,
            auto_delete=m.auto_delete,
            arguments=dict(m.arguments or {}),
        )
        ch.last_queue = q.name
        self._reply(
            ch,
            m,
            commands.Queue.DeclareOk,
            queue=q.name,
            message_count=q.ready,
            consumer_count=len(q.consumers),
        )

    def _h_queue_bind(self, ch: ChannelState, m: Any) -> None:
        assert self.vhost is not None
        name = self._queue_name(ch, m.queue)
        if m.exchange == "":
            raise AMQPFail(ACCESS_REFUSED, "operation not permitted on the default exchange")
        self.state.queue(self.vhost, name, self)
        self.state.bind(self.vhost, m.exchange, True, name, m.routing_key, dict(m.arguments or {}))
        self._reply(ch, m, commands.Queue.BindOk)

    def _h_queue_unbind(self, ch: ChannelState, m: Any) -> None:
        assert self.vhost is not None
        name = self._queue_name(ch, m.queue)
        self.state.queue(self.vhost, name, self)
        self.state.unbind(self.vhost, m.exchange, True, name, m.routing_key, dict(m.arguments or {}))
        self.write(method_frame(ch.id, commands.Queue.UnbindOk))

    def _h_queue_purge(self, ch: ChannelState, m: Any) -> None:
        assert self.vhost is not None
        q = self.state.queue(self.vhost, self._queue_name(ch, m.queue), self)
        count = q.purge()
        self._reply(ch, m, commands.Queue.PurgeOk, message_count=count)

    def _h_queue_delete(self, ch: ChannelState, m: Any) -> None:
        assert self.vhost is not None
        name = self._queue_name(ch, m.queue)
        q = self.vhost.queues.get(name)
        count = 0
        if q is not None:
            self.state.check_exclusive(q, self)
            where = f"queue '{name}' in vhost '{self.vhost.name}'"
            if m.if_unused and q.consumers:
                raise AMQPFail(PRECONDITION_FAILED, f"{where} in use")
            if m.if_empty and q.ready:
                raise AMQPFail(PRECONDITION_FAILED, f"{where} is not empty")
            count = self.state.delete_queue(q, self.state.clock.now())
        self._reply(ch, m, commands.Queue.DeleteOk, message_count=count)

    def _h_basic_qos(self, ch: ChannelState, m: Any) -> None:
        if m.prefetch_size:
            raise AMQPFail(NOT_IMPLEMENTED, f"prefetch_size!=0 ({m.prefetch_size})")
        if m.global_:
            ch.global_prefetch = m.prefetch_count
        else:
            ch.prefetch = m.prefetch_count
        self.write(method_frame(ch.id, commands.Basic.QosOk))
        now = self.state.clock.now()
        for c in list(ch.consumers.values()):
            self.state.dispatch(c.queue, now)

    def _h_basic_consume(self, ch: ChannelState, m: Any) -> None:
        assert self.vhost is not None
        if m.queue == REPLY_TO:
            if not m.no_ack:
                raise AMQPFail(PRECONDITION_FAILED, "reply consumer cannot acknowledge")
            if ch.reply_token is not None:
                raise AMQPFail(PRECONDITION_FAILED, "reply consumer already set")
            ch.reply_token = secrets.token_urlsafe(24)
            ch.reply_tag = m.consumer_tag or "amq.ctag-" + secrets.token_urlsafe(16)[:22]
            self.state.reply_to[ch.reply_token] = ch
            self._reply(ch, m, commands.Basic.ConsumeOk, consumer_tag=ch.reply_tag)
            return
        q = self.state.queue(self.vhost, self._queue_name(ch, m.queue), self)
        tag = m.consumer_tag or "amq.ctag-" + secrets.token_urlsafe(16)[:22]
        if tag in ch.consumers:
            raise AMQPFail(NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'")
        if q.consumers and (m.exclusive or any(o.exclusive for o in q.consumers)):
            raise AMQPFail(ACCESS_REFUSED, f"queue '{q.name}' in vhost '{self.vhost.name}' in exclusive use")
        consumer = Consumer(
            tag,
            ch,
            q,
            no_ack=m.no_ack,
            exclusive=m.exclusive,
            prefetch=ch.prefetch,
            arguments=dict(m.arguments or {}),
        )
        ch.consumers[tag] = consumer
        self._reply(ch, m, commands.Basic.ConsumeOk, consumer_tag=tag)
        self.state.add_consumer(consumer, self.state.clock.now())

    def _h_basic_cancel(self, ch: ChannelState, m: Any) -> None:
        if ch.reply_token is not None and m.consumer_tag == ch.reply_tag:
            self.state.reply_to.pop(ch.reply_token, None)
            ch.reply_token = None
        consumer = ch.consumers.pop(m.consumer_tag, None)
        self._reply(ch, m, commands.Basic.CancelOk, consumer_tag=m.consumer_tag)
        if consumer is not None:
            self.state.remove_consumer(consumer, self.state.clock.now())

    def _h_basic_get(self, ch: ChannelState, m: Any) -> None:
        assert self.vhost is not None
        q = self.state.queue(self.vhost, self._queue_name(ch, m.queue), self)
        msg = self.state.get(q, self.state.clock.now())
        if msg is None:
            self.write(method_frame(ch.id, commands.Basic.GetEmpty))
            return
        ch.next_tag += 1
        tag = ch.next_tag
        if not m.no_ack:
            ch.unacked[tag] = (msg, q, None)
            ch.unacked_count += 1
        if q.kind == "quorum" and msg.delivery_count:
            msg = _with_delivery_count(msg)
        self.write(
            method_frame(
                ch.id,
                commands.Basic.GetOk,
                delivery_tag=tag,
                redelivered=msg.redelivered,
                exchange=msg.exchange,
                routing_key=msg.routing_key,
                message_count=q.ready,
            )
        )
        self.write_content(ch.id, msg)

    def _h_basic_ack(self, ch: ChannelState, m: Any) -> None:
        self._settle(ch, "ack", m.delivery_tag, m.multiple, False)

    def _h_basic_nack(self, ch: ChannelState, m: Any) -> None:
        self._settle(ch, "nack", m.delivery_tag, m.multiple, m.requeue)

    def _h_basic_reject(self, ch: ChannelState, m: Any) -> None:
        self._settle(ch, "reject", m.delivery_tag, False, m.requeue)

    def _h_basic_recover(self, ch: ChannelState, m: Any) -> None:
        if not m.requeue:
            raise AMQPFail(NOT_IMPLEMENTED, "requeue=false")
        self._requeue_all(ch)
        if m.name == "Basic.Recover":
            self.write(method_frame(ch.id, commands.Basic.RecoverOk))

    def _h_confirm_select(self, ch: ChannelState, m: Any) -> None:
        if ch.tx:
            raise AMQPFail(PRECONDITION_FAILED, "cannot switch from tx to confirm mode")
        ch.confirm = True
        self._reply(ch, m, commands.Confirm.SelectOk)

    def _h_tx_select(self, ch: ChannelState, m: Any) -> None:
        if ch.confirm:
            raise AMQPFail(PRECONDITION_FAILED, "cannot switch from confirm to tx mode")
        ch.tx = True
        self.write(method_frame(ch.id, commands.Tx.SelectOk))

    def _h_tx_commit(self, ch: ChannelState, m: Any) -> None:
        if not ch.tx:
            raise AMQPFail(PRECONDITION_FAILED, "channel is not transactional")
        publishes, settles = ch.tx_publishes, ch.tx_settles
        ch.tx_publishes, ch.tx_settles = [], []
        for exchange, _rk, mandatory, msg in publishes:
            self._route(ch, exchange, mandatory, msg)
        for kind, tag, multiple, requeue in settles:
            self._apply_settle(ch, kind, tag, multiple, requeue)
        self.write(method_frame(ch.id, commands.Tx.CommitOk))

    def _h_tx_rollback(self, ch: ChannelState, m: Any) -> None:
        if not ch.tx:
            raise AMQPFail(PRECONDITION_FAILED, "channel is not transactional")
        ch.tx_publishes.clear()
        ch.tx_settles.clear()
        self.write(method_frame(ch.id, commands.Tx.RollbackOk))

    def _h_channel_open(self, ch: ChannelState, m: Any) -> None:
        raise AMQPFail(CHANNEL_ERROR, f"second 'channel.open' seen on channel {ch.id}")


FRAME_ERROR_CODE = 501
REPLY_TO = "amq.rabbitmq.reply-to"

_HANDLERS: dict[str, Any] = {
    "Channel.Open": Session._h_channel_open,
    "Channel.Close": Session._h_channel_close,
    "Channel.CloseOk": Session._h_channel_close_ok,
    "Channel.Flow": Session._h_channel_flow,
    "Exchange.Declare": Session._h_exchange_declare,
    "Exchange.Delete": Session._h_exchange_delete,
    "Exchange.Bind": Session._h_exchange_bind,
    "Exchange.Unbind": Session._h_exchange_unbind,
    "Queue.Declare": Session._h_queue_declare,
    "Queue.Bind": Session._h_queue_bind,
    "Queue.Unbind": Session._h_queue_unbind,
    "Queue.Purge": Session._h_queue_purge,
    "Queue.Delete": Session._h_queue_delete,
    "Basic.Qos": Session._h_basic_qos,
    "Basic.Consume": Session._h_basic_consume,
    "Basic.Cancel": Session._h_basic_cancel,
    "Basic.Get": Session._h_basic_get,
    "Basic.Ack": Session._h_basic_ack,
    "Basic.Nack": Session._h_basic_nack,
    "Basic.Reject": Session._h_basic_reject,
    "Basic.Recover": Session._h_basic_recover,
    "Basic.RecoverAsync": Session._h_basic_recover,
    "Confirm.Select": Session._h_confirm_select,
    "Tx.Select": Session._h_tx_select,
    "Tx.Commit": Session._h_tx_commit,
    "Tx.Rollback": Session._h_tx_rollback,
}

_CODE_NAMES = {
    311: "CONTENT_TOO_LARGE",
    312: "NO_ROUTE",
    313: "NO_CONSUMERS",
    320: "CONNECTION_FORCED",
    402: "INVALID_PATH",
    403: "ACCESS_REFUSED",
    404: "NOT_FOUND",
    405: "RESOURCE_LOCKED",
    406: "PRECONDITION_FAILED",
    501: "FRAME_ERROR",
    502: "SYNTAX_ERROR",
    503: "COMMAND_INVALID",
    504: "CHANNEL_ERROR",
    505: "UNEXPECTED_FRAME",
    506: "RESOURCE_ERROR",
    530: "NOT_ALLOWED",
    540: "NOT_IMPLEMENTED",
    541: "INTERNAL_ERROR",
}


def _reply_text(code: int, text: str) -> str:
    """RabbitMQ's form: ``NOT_FOUND - no queue 'x' in vhost '/'`` (a short string: ≤ 255 bytes)."""
    name = _CODE_NAMES.get(code, "")
    full = text if text.startswith(name) else f"{name} - {text}"
    raw = full.encode()
    return raw[:255].decode(errors="ignore")


_ = (BasicProperties, encode_properties, _U16)
